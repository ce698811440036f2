"""Channels and servers of every process: shared options, and mutual TLS with the process's
identity (mosafs.rpc.security) when it has one."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from mosafs import metrics
from mosafs.certs import SERVER_NAME
from mosafs.errors import ConfigError
from mosafs.rpc import security

log = logging.getLogger(__name__)

MiB = 1 << 20
# The largest chunk a chunker spec may ask for is 64 MiB (mosafs.chunking.spec.MAX_CHUNK);
# a message carries one chunk plus a little framing.
MAX_MESSAGE_BYTES = 64 * MiB + 64 * 1024
KEEPALIVE_ENV = "MOSAFS_GRPC_KEEPALIVE_MS"


def _keepalive_ms() -> int:
    """How often each end pings a connection: 30 s, or $MOSAFS_GRPC_KEEPALIVE_MS (for
    tests, which must see in seconds what a deployment sees after minutes; it must then be
    the same for every process, as servers accept pings by it too)."""
    raw = os.environ.get(KEEPALIVE_ENV, "30000")
    if not (raw.isascii() and raw.isdigit()) or not 100 <= int(raw) <= 3_600_000:
        raise ConfigError(f"{KEEPALIVE_ENV} must be 100..3600000 milliseconds, got {raw!r}")
    return int(raw)


KEEPALIVE_MS = _keepalive_ms()
STREAM_WINDOW_BYTES = 8 * MiB
CONNECT_TIMEOUT_MS = 5000  # how long one connection attempt may take

_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    # What a stream may receive before its reader takes it. gRPC starts each stream at
    # 64 KiB and grows that by its bandwidth probes, so a fragment sent on a new stream
    # over a link of long round trips (a rebuild between benefactors behind emulated
    # 20 Mbit/s links, 0.2-0.5 s) waited for window updates: with 8 MiB, six survivors'
    # rebuild 4 % faster in five A/B pairs (docs/benchmarks.md, "Streams' windows"). It
    # buffers no more for a unary call, read whole by gRPC's core anyway; a streaming
    # call whose reader lags may hold up to this much.
    ("grpc.http2.lookahead_bytes", STREAM_WINDOW_BYTES),
    # Both ends ping a connection every KEEPALIVE_MS, with calls or without, so that a
    # peer that vanished (a host down, a NAT that forgot the flow) is noticed.
    ("grpc.keepalive_time_ms", KEEPALIVE_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # A peer that went away (a restarted manager) is tried again every 2 s at most, not
    # after grpc's default backoff of up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    # gRPC reads this one as the time a connection attempt may take (its "minimum connect
    # timeout"), not as a backoff: at 100 ms, a connection opened over a busy link (its
    # handshake queued behind bulk transfers) or to a loaded host failed, and the peer was
    # avoided as unreachable (docs/benchmarks.md, "Rebuild": a survivor idle for 2 s).
    ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
    # Retries with backoff of the RPCs that may run twice (reads, and puts: a chunk put
    # again is a no-op) when a server is unreachable or busy; the buffer lets a put of a
    # whole chunk be sent again.
    ("grpc.enable_retries", 1),
    ("grpc.per_rpc_retry_buffer_size", MAX_MESSAGE_BYTES + MiB),
    ("grpc.retry_buffer_size", 8 * MAX_MESSAGE_BYTES),
]
_IDEMPOTENT = {
    "mosafs.v1.Manager": ("Lookup", "GetAttr", "BatchRead", "Changes", "ReadDir", "StatFs",
                          "Readlink", "GetXattr", "ListXattr", "FindChunks", "LocateChunks",
                          "GetBlockMap", "GetVersionStats", "ListVersions", "ListBenefactors",
                          "GetClusterStatus", "GetFolderSettings", "ListFolderSettings",
                          "GetPool", "ListPools", "GetDrainStatus", "RenewLease"),
    "mosafs.v1.Benefactor": ("PutChunk", "PutChunks", "GetChunk", "HasChunks", "GetInfo"),
}
MANAGER_IDEMPOTENT = frozenset(_IDEMPOTENT["mosafs.v1.Manager"])
SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": service, "method": method} for service, methods in _IDEMPOTENT.items()
             for method in methods],
    "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.05s", "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]},
}]})
_CHANNEL_OPTIONS = [*_OPTIONS, ("grpc.service_config", SERVICE_CONFIG)]
# What a server accepts of those pings. By default a gRPC server wants no more than one
# ping every 5 minutes on a connection without data (every 2 hours without calls, unless
# keepalive_permit_without_calls, above, is set on the server too), counts each earlier
# one as a strike, and after 2 strikes hangs up with GOAWAY ENHANCE_YOUR_CALM
# "too_many_pings", which every idle client logged about 2 minutes after it connected.
# Accept a ping every half keepalive interval: ours, even one that arrives a little
# early, and not much more (a peer pinging faster still gets the strikes).
_SERVER_OPTIONS = [*_OPTIONS,
                   ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MS // 2)]


class _Timed(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Every call's time and failures in mosafs.metrics (per service and method)."""

    def _record(self, details: Any, started: float, error: Any) -> None:
        service, _, method = str(details.method).lstrip("/").partition("/")
        label = service.rsplit(".", 1)[-1].lower()
        metrics.RPC_CLIENT_SECONDS.labels(label, method).observe(time.perf_counter() - started)
        if error is not None:
            code = error.code() if hasattr(error, "code") else None
            metrics.RPC_CLIENT_ERRORS.labels(
                label, method, code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
            ).inc()

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        started = time.perf_counter()
        outcome = continuation(details, request)
        # At once for a blocking call (its outcome is complete); at the end for a future.
        outcome.add_done_callback(lambda done: self._record(details, started, _failure(done)))
        return outcome

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        started = time.perf_counter()
        outcome = continuation(details, request)
        self._record(details, started, None)  # the time to start the stream
        return outcome


def _failure(done: Any) -> Any:
    """A finished call's exception (None: it succeeded); a call its caller cancelled (a
    future: the waiting task went away) counts as CANCELLED."""
    return _CANCELLED if done.cancelled() else done.exception()


class _Cancelled:
    @staticmethod
    def code() -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED


_CANCELLED = _Cancelled()


# The identity argument's default: this process's (mosafs.rpc.security.configure). A
# library in another program's process (mosafs.checkpoint) passes its own instead of
# changing the process's.
PROCESS_IDENTITY: Any = object()
_UNSET = PROCESS_IDENTITY


def channel(address: str, identity: Any = _UNSET) -> grpc.Channel:
    """A channel to ADDRESS with IDENTITY (default: the process's; None: plaintext)."""
    identity = security.current() if identity is _UNSET else identity
    if identity is None:
        raw = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
    else:
        # Servers' certificates name SERVER_NAME whatever their address (docs/operations.md).
        raw = grpc.secure_channel(address, security.channel_credentials(identity),
                                  options=[*_CHANNEL_OPTIONS, ("grpc.ssl_target_name_override",
                                                               SERVER_NAME)])
    return grpc.intercept_channel(raw, _Timed())


def server(
    add_servicer: Callable[[grpc.Server], None], address: str, *, threads: int = 16,
    label: str = "server", max_concurrent_rpcs: int | None = None,
) -> tuple[grpc.Server, int]:
    """Start a threaded gRPC server on ADDRESS (port 0: a free port) with the process's
    identity (mutual TLS and roles) or plaintext; returns it and its port. LABEL names the
    service in the RPC metrics; MAX_CONCURRENT_RPCS answers calls beyond it with
    RESOURCE_EXHAUSTED at once (None: no limit)."""
    identity = security.current()
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), options=_SERVER_OPTIONS,
                      interceptors=[security.Policy(label, secure=identity is not None)],
                      maximum_concurrent_rpcs=max_concurrent_rpcs)
    add_servicer(srv)
    if identity is None:
        port = srv.add_insecure_port(address)
    else:
        port = srv.add_secure_port(address, security.server_credentials(identity))
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    srv.start()
    return srv, port
