"""Channel and server options shared by every process."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent import futures

import grpc

log = logging.getLogger(__name__)

MiB = 1 << 20
# The largest chunk a chunker spec may ask for is 64 MiB (mosafs.chunking.spec.MAX_CHUNK);
# a message carries one chunk plus a little framing.
MAX_MESSAGE_BYTES = 64 * MiB + 64 * 1024

_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # A peer that went away (a restarted manager) is tried again every 2 s at most, not
    # after grpc's default backoff of up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=_OPTIONS)


def server(
    add_servicer: Callable[[grpc.Server], None], address: str, *, threads: int = 16
) -> tuple[grpc.Server, int]:
    """Start a threaded gRPC server on ADDRESS (port 0: a free port); returns it and its port."""
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), options=_OPTIONS)
    add_servicer(srv)
    port = srv.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    srv.start()
    return srv, port
