"""Mutual TLS and authorization for every channel and server (docs/operations.md).

A process configures its identity once at start (`configure`): its certificate, key and
the cluster's CA (mosafs.certs), or None for plaintext (`--insecure`). Every channel and
server made afterwards (mosafs.rpc.channels) uses it: servers require a client certificate
signed by the CA (a peer without one fails the handshake), and `Policy`, a server
interceptor, checks the caller's role against mosafs.rpc.access before the handler runs
(PERMISSION_DENIED otherwise) and records the RPC's time and errors (mosafs.metrics).

The command-line side (--tls-dir, --tls-name, --insecure) is mosafs.procutil's.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from mosafs import certs, metrics
from mosafs.rpc.access import ACCESS

_identity: certs.Identity | None = None
_OU = re.compile(r"(?:^|,)\s*OU=([^,]+)")


def configure(identity: certs.Identity | None) -> None:
    """This process's identity for every channel and server from now on (None: plaintext)."""
    global _identity
    _identity = identity


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

def peer_role(context: grpc.ServicerContext) -> str | None:
    """The role the caller's certificate states (None on a plaintext connection)."""
    auth: dict[str, Any] = dict(context.auth_context())
    subjects: list[bytes] = list(auth.get("x509_subject") or [])
    for subject in subjects:
        match = _OU.search(bytes(subject).decode(errors="replace"))
        if match:
            return match.group(1)
    return None


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


def _wrapped(handler: Any, label: str, method: str, allowed: frozenset[str] | None) -> Any:
    def check(context: grpc.ServicerContext) -> None:
        if allowed is None:
            return
        role = peer_role(context)
        if role not in allowed:
            needs = " or ".join(sorted(allowed)) or "nobody"
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"{method} needs a certificate of role {needs}; this one is "
                          f"{role or 'without a mosafs role'}")

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
    return handler  # no streaming-request RPCs exist
