"""Short-circuit local reads (docs/benefactor.md, "Local reads"): a reader on this host
gets the open chunk files themselves and reads them with pread, as HDFS's DataNode passes
block files to a client on its own host. It skips what a GetChunk costs (the chunk
copied into a gRPC message here, parsed and copied again there), which is most of a
local read's CPU and its speed limit.

How it is kept safe: the reader first asks over gRPC (`OpenLocal`, mutual TLS, a read
token per chunk checked as GetChunk checks it) and gets a one-time TICKET for exactly
those chunks; it then connects to this benefactor's Unix socket, an abstract name (so
only processes of this host and network namespace reach it), sends the ticket, and
receives read-only descriptors of the chunk files (SCM_RIGHTS), in the order of the ids.
A ticket is random (256 bits), used once, and expires after TICKET_TTL_S. The reader
verifies every chunk's id, as it does for bytes that came over the network.

Wire, on a SOCK_SEQPACKET connection: the reader sends the ticket (32 bytes); the
benefactor answers with messages of at most FDS_PER_MESSAGE ids each: one status byte per
id (1: a descriptor of its file comes with the message, in order; 0: not stored here),
then closes the connection. A wrong or expired ticket gets the connection closed with no
message.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mosafs.localwire import FDS_PER_MESSAGE, TICKET_BYTES

log = logging.getLogger(__name__)

TICKET_TTL_S = 30.0
MAX_IDS = 4096           # ids per ticket (OpenLocal refuses more)
MAX_GRANTS = 4096        # tickets outstanding; the oldest are dropped beyond


class LocalReads:
    """The Unix socket and the tickets of one benefactor. PATH_OF(id) is where a chunk's
    file is (the file store's layout)."""

    def __init__(self, path_of: Callable[[bytes], Path], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._path_of = path_of
        self._clock = clock
        self.name = f"mosafs-local-{secrets.token_hex(12)}"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock.bind("\0" + self.name)
        self._sock.listen(64)
        self._grants: dict[bytes, tuple[float, list[bytes]]] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="local-reads")
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="local-reads", daemon=True)
        self._thread.start()

    def grant(self, ids: list[bytes]) -> bytes:
        """A ticket for IDS (the caller checked that the reader may read them)."""
        ticket = secrets.token_bytes(TICKET_BYTES)
        now = self._clock()
        with self._lock:
            if len(self._grants) >= MAX_GRANTS:
                self._expire(now, keep=MAX_GRANTS // 2)
            self._grants[ticket] = (now + TICKET_TTL_S, list(ids))
        return ticket

    def _expire(self, now: float, keep: int) -> None:
        """Drop expired tickets, and the oldest past KEEP (under the lock)."""
        for ticket in [t for t, (until, _) in self._grants.items() if until < now]:
            del self._grants[ticket]
        for ticket in list(self._grants)[:max(0, len(self._grants) - keep)]:
            del self._grants[ticket]

    def _take(self, ticket: bytes) -> list[bytes] | None:
        with self._lock:
            found = self._grants.pop(ticket, None)
        if found is None or found[0] < self._clock():
            return None
        return found[1]

    def _serve(self) -> None:
        while not self._stopping:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            try:
                self._pool.submit(self._answer, conn)
            except RuntimeError:  # stopping
                conn.close()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            try:
                ticket = conn.recv(TICKET_BYTES + 1)
            except OSError:
                return
            ids = self._take(ticket) if len(ticket) == TICKET_BYTES else None
            if ids is None:
                log.debug("local read with an unknown or expired ticket refused")
                return
            try:
                for at in range(0, len(ids), FDS_PER_MESSAGE):
                    self._send(conn, ids[at:at + FDS_PER_MESSAGE])
            except OSError as exc:
                log.debug("local read cut short: %s", exc)

    def _send(self, conn: socket.socket, ids: list[bytes]) -> None:
        status = bytearray(len(ids))
        fds: list[int] = []
        try:
            for i, raw in enumerate(ids):
                try:
                    fds.append(os.open(self._path_of(raw), os.O_RDONLY | os.O_CLOEXEC))
                    status[i] = 1
                except OSError:
                    pass  # not stored here (or gone since): the reader reads elsewhere
            if fds:
                socket.send_fds(conn, [bytes(status)], fds)
            else:
                conn.sendall(bytes(status))
        finally:
            for fd in fds:
                os.close(fd)

    def close(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)
