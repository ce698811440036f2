"""Mutual TLS and authorization for every channel and server (docs/operations.md).

A process configures its identity once at start (`configure`): its certificate, key and
the cluster's CA (mosafs.certs), or None for plaintext (`--insecure`). Every channel and
server made afterwards (mosafs.rpc.channels) uses it: servers require a client certificate
signed by the CA (a peer without one fails the handshake), and `Policy`, a server
interceptor, runs before every handler:

1. the caller's certificate must not be revoked (mosafs.revocation): UNAUTHENTICATED;
2. its role must be allowed the RPC (mosafs.rpc.access): PERMISSION_DENIED;
3. the uid and groups the request acts as (metadata, mosafs.capability) must lie within
   the certificate's capability: PERMISSION_DENIED. The resulting Caller is what the
   handler's `current_caller()` returns (the manager checks subtrees and POSIX
   permissions with it, mosafs.manager.permissions).

Each refusal is logged on the "mosafs.audit" logger with the certificate's name and
counted (metrics.REFUSALS by reason), and so is every admin RPC; the RPC's time and errors
are recorded (mosafs.metrics).

The command-line side (--tls-dir, --tls-name, --insecure) is mosafs.procutil's.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from mosafs import capability, certs, metrics
from mosafs.capability import Caller, Refused
from mosafs.errors import AccessDenied, ConfigError
from mosafs.revocation import Revocations
from mosafs.rpc.access import ACCESS, ADMIN

audit = logging.getLogger("mosafs.audit")
_T = TypeVar("_T")
_identity: certs.Identity | None = None
_revocations = Revocations(None)
_caller: contextvars.ContextVar[Caller] = contextvars.ContextVar("mosafs_caller",
                                                                 default=capability.ROOT)


def configure(identity: certs.Identity | None) -> None:
    """This process's identity for every channel and server from now on (None: plaintext)."""
    global _identity, _revocations
    _identity = identity
    _revocations = Revocations(identity.directory if identity is not None else None)


def revocations() -> Revocations:
    """The certificates this process's servers refuse."""
    return _revocations


def current_caller() -> Caller:
    """Who the RPC being handled comes from and acts as (capability.ROOT on plaintext
    servers and outside RPCs)."""
    return _caller.get()


def current() -> certs.Identity | None:
    return _identity


def channel_credentials(identity: certs.Identity) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=identity.ca,
                                        private_key=identity.key,
                                        certificate_chain=identity.cert)


def server_credentials(identity: certs.Identity) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(identity.key, identity.cert)],
                                       root_certificates=identity.ca,
                                       require_client_auth=True)


# --- authorization and RPC metrics -----------------------------------------------------------

@functools.lru_cache(maxsize=1024)
def _peer(pem: bytes) -> certs.PeerCertificate | None:
    try:
        return certs.peer_certificate(pem)
    except ConfigError:
        return None  # signed by our CA, yet states no role: refused as "without a role"


@dataclass(frozen=True, slots=True)
class _Said:
    """What a request's metadata says of itself, read in one pass: the uid and groups it
    acts as (the mount sets them; parsed only where a capability is checked), and the
    mount it comes from ("" if none)."""

    uid: str | None = None
    gids: str | None = None
    mount: str = ""


def _said(context: grpc.ServicerContext) -> _Said:
    uid = gids = None
    mount = ""
    for key, value in context.invocation_metadata() or ():
        if key == capability.UID_KEY:
            uid = str(value)
        elif key == capability.GIDS_KEY:
            gids = str(value)
        elif key == capability.MOUNT_KEY:
            # Used only to leave a mount's own changes out of what it is told
            # (mosafs.manager.changes).
            mount = str(value)[:64]
    return _Said(uid, gids, mount)


def _acting(said: _Said) -> tuple[int | None, list[int] | None]:
    """The uid and groups the request says it acts as."""
    return (_parsed(capability.UID_KEY, said.uid, int),
            _parsed(capability.GIDS_KEY, said.gids,
                    lambda text: [int(g) for g in text.split(",") if g]))


def _parsed(key: str, value: str | None, parse: Callable[[str], _T]) -> _T | None:
    """VALUE of metadata KEY by PARSE (None where absent); Refused if it is no number."""
    if value is None:
        return None
    try:
        return parse(value)
    except ValueError:
        raise Refused("capability", f"metadata {key} is not a number list: "
                                    f"{value[:40]!r}") from None


def refuse(reason: str, name: str, method: str, message: str) -> None:
    """Log and count a refused request (the caller answers it with a status)."""
    metrics.REFUSALS.labels(reason).inc()
    audit.info("refused %s from %s (%s): %s", method, name or "an unnamed peer", reason,
               message)


class Policy(grpc.ServerInterceptor):  # type: ignore[misc]
    """Checks every call's role (when the server has an identity) and times it."""

    def __init__(self, service_label: str, *, secure: bool) -> None:
        self._label = service_label
        self._secure = secure

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        service, _, method = details.method.lstrip("/").partition("/")
        allowed = ACCESS.get(service, {}).get(method, frozenset())
        return _wrapped(handler, self._label, method, allowed if self._secure else None)


class Unauthenticated(AccessDenied):
    """The caller's certificate is revoked (UNAUTHENTICATED on an RPC)."""


def authorize(pem: bytes | None, method: str, allowed: frozenset[str]) -> certs.PeerCertificate:
    """The certificate PEM (the caller's, None on a plaintext connection) if it may call
    METHOD, one of ALLOWED roles; else the refusal is logged and counted and AccessDenied
    raised (Unauthenticated: revoked; see the module's doc). For RPCs (`_check`) and for
    the framed connections of mosafs.rpc.framed."""
    peer = _peer(pem) if pem is not None else None
    name = peer.name if peer is not None else ""
    if peer is not None and _revocations.is_revoked(peer.fingerprint):
        refuse("bad_certificate", name, method, "the certificate is revoked")
        raise Unauthenticated(f"certificate {name!r} has been revoked")
    role = peer.role if peer is not None else None
    if peer is None or role not in allowed:
        needs = " or ".join(sorted(allowed)) or "nobody"
        message = (f"{method} needs a certificate of role {needs}; this one is "
                   f"{role or 'without a mosafs role'}")
        # A certificate of our CA that states no role (or a capability we cannot read) is
        # a bad certificate; one with the wrong role is refused for its role.
        refuse("role" if peer is not None else "bad_certificate", name, method, message)
        raise AccessDenied(message)
    if allowed is ADMIN:
        audit.info("%s by %s (%s)", method, name, peer.role)
    return peer


def _check(context: grpc.ServicerContext, method: str, allowed: frozenset[str],
           said: _Said) -> Caller:
    """The Caller of a request on a TLS server, or abort the RPC (see the module's doc)."""
    auth: dict[str, Any] = dict(context.auth_context())
    pems: list[bytes] = list(auth.get("x509_pem_cert") or [])
    try:
        peer = authorize(bytes(pems[0]) if pems else None, method, allowed)
    except Unauthenticated as exc:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
        raise  # abort raises; this line is for the type checker
    except AccessDenied as exc:
        context.abort(grpc.StatusCode.PERMISSION_DENIED, exc.message)
        raise
    try:
        uid, gids = _acting(said)
        return capability.acting(peer.capability, peer.name, peer.role, uid, gids,
                                 peer.fingerprint)
    except Refused as exc:
        refuse(exc.reason, peer.name, method, exc.message)
        context.abort(grpc.StatusCode.PERMISSION_DENIED, exc.message)
        raise  # abort raises; this line is for the type checker


def _wrapped(handler: Any, label: str, method: str, allowed: frozenset[str] | None) -> Any:
    def check(context: grpc.ServicerContext) -> None:
        said = _said(context)
        caller = capability.ROOT if allowed is None else _check(context, method, allowed, said)
        _caller.set(caller)
        mount = said.mount
        # Bound to the certificate: a client cannot pass for another's mount, whose
        # caches would then not hear of its changes.
        capability.ORIGIN.set(f"{caller.fingerprint.hex()}/{mount}" if mount else "")

    def record(started: float, context: grpc.ServicerContext, failed: bool) -> None:
        metrics.RPC_SERVER_SECONDS.labels(label, method).observe(time.perf_counter() - started)
        code = context.code() if hasattr(context, "code") else None
        if failed or (code is not None and code != grpc.StatusCode.OK):
            name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
            metrics.RPC_SERVER_ERRORS.labels(label, method, name).inc()

    def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
        def run(request: Any, context: grpc.ServicerContext) -> Any:
            started, failed = time.perf_counter(), True
            try:
                check(context)
                result = behavior(request, context)
                failed = False
                return result
            finally:
                record(started, context, failed)
        return run

    def streaming(behavior: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        def run(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            started, failed = time.perf_counter(), True
            try:
                check(context)
                yield from behavior(request, context)
                failed = False
            finally:
                record(started, context, failed)
        return run

    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            unary(handler.unary_unary), handler.request_deserializer,
            handler.response_serializer)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            streaming(handler.unary_stream), handler.request_deserializer,
            handler.response_serializer)
    if handler.stream_stream is not None:  # the request iterator passes through as is
        return grpc.stream_stream_rpc_method_handler(
            streaming(handler.stream_stream), handler.request_deserializer,
            handler.response_serializer)
    return grpc.stream_unary_rpc_method_handler(
        unary(handler.stream_unary), handler.request_deserializer,
        handler.response_serializer)
