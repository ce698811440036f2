"""Short-circuit local reads and puts (docs/benefactor.md, "Local reads and puts"): a
reader on this host gets the open chunk files themselves and reads them with pread, as
HDFS's DataNode passes block files to a client on its own host. It skips what a
GetChunk costs (the chunk copied into a gRPC message here, parsed and copied again
there), which is most of a local read's CPU and its speed limit.

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

Local puts, the same way round: a writer on this host asks `OpenLocal(put=True)` (its
write token checked as a PutChunks call's; with `put_tickets`, for up to MAX_PUT_TICKETS
tickets at once, each for one group and used once), writes a group of blobs into a memory file
(memfd) and sends the ticket, then one message with the file's descriptor and a header
naming each blob (id, offset, length: mosafs.localwire.put_header; at most
PUT_MAX_COUNT blobs and PUT_MAX_BYTES bytes, every span inside the file). The benefactor
reads each blob out of the file into a buffer of the thread that stores it, and stores it
as a PutChunks call does (BLAKE3-verified, written, fsynced, renamed; the ingest limit
applies), and answers with one JSON list: {"present": bool} for a blob stored, {"kind",
"message"} for one refused. No TLS, no gRPC message. The memory file stays the writer's,
who may write it again (mosafs.client.files.localputs keeps its files for the next
group), hence the read into a buffer of the benefactor's own: the bytes checked are the
bytes written (mosafs.benefactor.puts, `from_file`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mosafs import metrics
from mosafs.benefactor.puts import Outcome
from mosafs.localwire import (
    FDS_PER_MESSAGE,
    PUT_HEADER_MAX,
    PUT_MAX_BYTES,
    TICKET_BYTES,
    parse_put_header,
)

log = logging.getLogger(__name__)
# A connection's wait for one of the threads that serve them (reads and puts alike).
_WAITED = metrics.BENEFACTOR_PUT_SECONDS.labels("local_wait")

TICKET_TTL_S = 30.0
MAX_IDS = 4096           # ids per ticket (OpenLocal refuses more)
MAX_GRANTS = 4096        # tickets outstanding; the oldest are dropped beyond
MAX_PUT_TICKETS = 16     # put tickets one OpenLocal gives (each for one group, used once)
TICKET_WAIT_S = 2.0      # a connection that sends no ticket within this is closed
MAX_WAITING = 256        # connections waiting for their ticket; the oldest gives way beyond
WAKE_S = 0.5             # the accepting thread looks this often for silent connections


class LocalReads:
    """The Unix socket and the tickets of one benefactor. PATH_OF(id) is where a chunk's
    file is (the file store's layout)."""

    def __init__(self, path_of: Callable[[bytes], Path], *,
                 put: Callable[[int, list[tuple[bytes, int, int]]], list[Outcome]]
                 | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._path_of = path_of
        self._put = put
        self._clock = clock
        self.name = f"mosafs-local-{secrets.token_hex(12)}"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock.bind("\0" + self.name)
        self._sock.listen(64)
        self._grants: dict[bytes, tuple[float, list[bytes] | None]] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="local-reads")
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="local-reads", daemon=True)
        self._thread.start()

    @property
    def takes_puts(self) -> bool:
        return self._put is not None

    def grant(self, ids: list[bytes] | None) -> bytes:
        """A ticket for reading IDS (the caller checked that the reader may), or for one
        put (None: the caller checked the writer's token)."""
        ticket = secrets.token_bytes(TICKET_BYTES)
        now = self._clock()
        with self._lock:
            if len(self._grants) >= MAX_GRANTS:
                self._expire(now, keep=MAX_GRANTS // 2)
            self._grants[ticket] = (now + TICKET_TTL_S, None if ids is None else list(ids))
        return ticket

    def _expire(self, now: float, keep: int) -> None:
        """Drop expired tickets, and the oldest past KEEP (under the lock)."""
        for ticket in [t for t, (until, _) in self._grants.items() if until < now]:
            del self._grants[ticket]
        for ticket in list(self._grants)[:max(0, len(self._grants) - keep)]:
            del self._grants[ticket]

    def _take(self, ticket: bytes) -> tuple[bool, list[bytes] | None]:
        """(valid, ids: None for a put) of TICKET, which is used up."""
        with self._lock:
            found = self._grants.pop(ticket, None)
        if found is None or found[0] < self._clock():
            return False, None
        return True, found[1]

    def _serve(self) -> None:
        """Accept connections and wait for their tickets here, in one thread: a serving
        thread is taken only by a connection whose ticket arrived. The socket needs no
        credentials, so any local process may connect and say nothing; before, eight
        such connections held every serving thread for 10 s each."""
        selector = selectors.DefaultSelector()
        selector.register(self._sock, selectors.EVENT_READ)
        waiting: dict[socket.socket, float] = {}  # accepted, no ticket yet: since when
        try:
            while not self._stopping:
                for key, _ in selector.select(timeout=WAKE_S):
                    if key.fileobj is self._sock:
                        if not self._accept_one(selector, waiting):
                            return  # closed
                        continue
                    conn = key.fileobj
                    assert isinstance(conn, socket.socket)
                    selector.unregister(conn)
                    self._dispatch(conn, waiting.pop(conn))
                self._drop_silent(selector, waiting)
        finally:
            for conn in waiting:
                conn.close()
            selector.close()

    def _accept_one(self, selector: selectors.BaseSelector,
                    waiting: dict[socket.socket, float]) -> bool:
        try:
            conn, _ = self._sock.accept()
        except BlockingIOError:
            return True
        except OSError:
            return False
        if len(waiting) >= MAX_WAITING:  # the oldest silent one gives way
            oldest = next(iter(waiting))
            selector.unregister(oldest)
            del waiting[oldest]
            oldest.close()
        conn.setblocking(False)
        selector.register(conn, selectors.EVENT_READ)
        waiting[conn] = time.monotonic()
        return True

    @staticmethod
    def _drop_silent(selector: selectors.BaseSelector,
                     waiting: dict[socket.socket, float]) -> None:
        """Close the connections that sent no ticket within TICKET_WAIT_S."""
        now = time.monotonic()
        for conn in [c for c, since in waiting.items() if now - since > TICKET_WAIT_S]:
            selector.unregister(conn)
            del waiting[conn]
            conn.close()

    def _dispatch(self, conn: socket.socket, accepted: float) -> None:
        """CONN's ticket arrived: read it, and answer in a serving thread."""
        try:
            ticket = conn.recv(TICKET_BYTES + 1)
        except OSError:
            ticket = b""
        if not ticket:  # hung up (or failed) before sending one: nothing to answer
            conn.close()
            return
        conn.setblocking(True)
        try:
            future = self._pool.submit(self._answer, conn, ticket, accepted)
        except RuntimeError:  # stopping
            conn.close()
            return
        # A connection whose answer the stop cancelled before it ran is closed here: its
        # serving thread, which would have closed it, never comes.
        future.add_done_callback(lambda f: conn.close() if f.cancelled() else None)

    def _answer(self, conn: socket.socket, ticket: bytes, accepted: float) -> None:
        _WAITED.observe(time.monotonic() - accepted)
        try:
            self._answer_one(conn, ticket)
        except Exception:
            log.exception("bug in a local read or put")

    def _answer_one(self, conn: socket.socket, ticket: bytes) -> None:
        with conn:
            conn.settimeout(10)
            valid, ids = self._take(ticket) if len(ticket) == TICKET_BYTES else (False, None)
            if not valid:
                log.debug("local read or put with an unknown or expired ticket refused")
                return
            try:
                if ids is None:
                    self._take_put(conn)
                    return
                for at in range(0, len(ids), FDS_PER_MESSAGE):
                    self._send(conn, ids[at:at + FDS_PER_MESSAGE])
            except OSError as exc:
                log.debug("local read or put cut short: %s", exc)

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

    def _take_put(self, conn: socket.socket) -> None:
        """One group of blobs in a memory file (module docstring); the answer sent."""
        header, fds, _, _ = socket.recv_fds(conn, PUT_HEADER_MAX + 1, 1)
        if len(fds) != 1 or self._put is None:
            for fd in fds:
                os.close(fd)
            return
        try:
            size = os.fstat(fds[0]).st_size
            try:
                blobs = parse_put_header(header)
                if any(n > PUT_MAX_BYTES or o + n > size for _, o, n in blobs) or \
                        sum(n for _, _, n in blobs) > PUT_MAX_BYTES or not size:
                    raise ValueError("blobs outside the file, or too large")
            except ValueError as exc:
                log.info("local put refused: %s", exc)
                return
            reply = self._store(fds[0], blobs)
        finally:
            os.close(fds[0])
        conn.sendall(reply)

    def _store(self, fd: int, blobs: list[tuple[bytes, int, int]]) -> bytes:
        """The blobs stored from the memory file FD; the answer's bytes."""
        assert self._put is not None
        answer: list[dict[str, object]] = []
        for o in self._put(fd, blobs):
            if o.error is None:
                answer.append({"present": o.present})
            else:
                answer.append({"kind": o.error.kind, "message": o.error.message})
        return json.dumps(answer).encode()

    def close(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)
