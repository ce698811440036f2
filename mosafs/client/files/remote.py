"""Write pipelines run by data-path worker processes (`mosafs mount --datapath-workers N`,
docs/client.md "Data-path workers").

Why: one Python interpreter runs the FUSE loop, and with the pipeline in the same process
chunking, hashing, index look-ups and chunk puts (gRPC, TLS) all take turns with it on one
GIL: one writer's mount could not use more than about two cores whatever the machine had.
With workers, the mount only copies each write's bytes into a Unix socket (the kernel's
copy; the GIL is released while it runs); the worker (mosafs.client.worker) runs the same
`Pipeline` code on its own interpreter, cores and connections. Sessions are spread over
the workers round-robin; a stream stays with its worker.

Protocol, over a SOCK_STREAM socketpair: frames of `!II` (header length, payload length),
a pickled header dict, then the payload bytes. Both ends are this program (the mount
starts each worker and hands it one end): pickle crosses no trust boundary.

    mount -> worker  {"op": "hello", config, identity, logging}   once, first
                     {"op": "open", "stream", spec, preferred, targets, copies, ids, inode,
                      token, ec}                  token: the write token; ec: EcPolicy|None
                     {"op": "data", "stream"} + appended bytes
                     {"op": "token", "stream", "token"}           a lease renewal's token
                     {"op": "finish", "stream"}
                     {"op": "get", "stream", "id", "addresses", "token", "coded"}   a chunk
                                       for a reader, its read token, its fragments if coded
    worker -> mount  {"backend"} or {"error"}                     once, first: ready
                     {"stream", "entries", "placements", "addresses", "fragments",
                      "new_bytes", "hashed_bytes", "hash_seconds", "backend"} or
                     {"stream", "error"}
                     {"stream"} + the chunk's verified bytes, or {"stream", "error"}

Back-pressure is the window in the worker: while a stream's window is full the worker
reads no further frame, the socket fills, and the mount's write waits. A worker that dies
fails the commits of its open streams (EIO at close), as a crashed mount would; new
streams go to the workers that remain, else run in the mount.
"""

from __future__ import annotations

import itertools
import logging
import pickle
import socket
import struct
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from mosafs import errors, metrics
from mosafs.client.files.blockmap import ChunkEntry
from mosafs.client.files.pipeline import Pieces

log = logging.getLogger(__name__)

FRAME = struct.Struct("!II")
MAX_HEADER = 256 << 20   # an open names every stored id of a session: 32 B each
MAX_PAYLOAD = 64 << 20   # one FUSE write, or one spill read (batch_bytes)
STOP_TIMEOUT = 10.0
# A worker's start: Python's imports, and for the GPU backend a CUDA context and the
# kernels' compilation (NVRTC; CuPy caches the result on disk, so only a first start waits).
READY_TIMEOUT = 300.0
SOCKET_BUFFER = 4 << 20  # the kernel caps it at net.core.{w,r}mem_max
SMALL_FRAME = 256 << 10  # writes smaller than this are gathered into one data frame


async def send_frame(sock: trio.socket.SocketType, header: dict[str, Any],
                     payload: bytes | bytearray | memoryview = b"") -> None:
    """One frame; the caller keeps frames of concurrent senders apart (a lock)."""
    body = pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL)
    size = memoryview(payload).nbytes
    await send_all(sock, FRAME.pack(len(body), size) + body)
    if size:
        await send_all(sock, payload)


async def send_all(sock: trio.socket.SocketType, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        sent = await sock.send(view)
        view = view[sent:]


async def receive_exactly(sock: trio.socket.SocketType, size: int) -> bytearray:
    """SIZE bytes; EOFError when the peer closed first."""
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        count = await sock.recv_into(view[got:])
        if count == 0:
            raise EOFError("the data-path peer closed its socket")
        got += count
    return buf


async def receive_frame(sock: trio.socket.SocketType) -> tuple[dict[str, Any], bytearray]:
    head_len, payload_len = FRAME.unpack(await receive_exactly(sock, FRAME.size))
    if head_len > MAX_HEADER or payload_len > MAX_PAYLOAD:
        raise errors.InternalError(f"data-path frame too large: {head_len} + {payload_len}")
    header = pickle.loads(await receive_exactly(sock, head_len))
    payload = await receive_exactly(sock, payload_len) if payload_len else bytearray()
    return header, payload


@dataclass
class _Waiter:
    done: trio.Event = field(default_factory=trio.Event)
    reply: dict[str, Any] = field(default_factory=dict)
    payload: bytearray = field(default_factory=bytearray)


class WorkerLink:
    """One worker process and the mount's end of its socket."""

    def __init__(self, index: int, process: subprocess.Popen[bytes],
                 sock: trio.socket.SocketType) -> None:
        self.index = index
        self.process = process
        self.sock = sock
        self.alive = True
        self._send_lock = trio.Lock()
        self._waiting: dict[int, _Waiter] = {}

    async def send(self, header: dict[str, Any], payload: bytes | None = None) -> None:
        """One frame; the lock keeps frames of concurrent sessions whole."""
        if not self.alive:
            raise errors.InternalError(f"data-path worker {self.index} is gone")
        try:
            async with self._send_lock:
                await send_frame(self.sock, header, payload or b"")
        except OSError as exc:
            self._lost(f"cannot write to it: {exc}")
            raise errors.InternalError(f"data-path worker {self.index} is gone") from None

    async def request(self, header: dict[str, Any]) -> tuple[dict[str, Any], bytearray]:
        """Send HEADER; the reply to its stream number, and the reply's payload."""
        waiter = self._waiting[header["stream"]] = _Waiter()
        await self.send(header)
        await waiter.done.wait()
        return waiter.reply, waiter.payload

    async def ready(self) -> str:
        """The worker's first frame: the hash backend it set up, or why it could not."""
        with trio.move_on_after(READY_TIMEOUT) as scope:
            try:
                reply, _ = await receive_frame(self.sock)
            except (EOFError, OSError) as exc:
                raise errors.InternalError(
                    f"data-path worker {self.index} (pid {self.process.pid}) stopped while "
                    f"starting ({exc}; exit status {self.process.poll()})") from None
        if scope.cancelled_caught:
            raise errors.InternalError(f"data-path worker {self.index} did not start within "
                                       f"{READY_TIMEOUT:g} s")
        if "error" in reply:
            _raise(reply["error"])
        return str(reply["backend"])

    async def read_replies(self) -> None:
        """Hand each reply to the stream that waits for it, until the worker is gone."""
        try:
            while True:
                reply, payload = await receive_frame(self.sock)
                waiter = self._waiting.pop(reply["stream"], None)
                if waiter is not None:
                    waiter.reply, waiter.payload = reply, payload
                    waiter.done.set()
        except trio.ClosedResourceError:
            return  # close() closed the socket: the mount is stopping
        except (EOFError, OSError, errors.MosafsError) as exc:
            self._lost(str(exc))

    def _lost(self, why: str) -> None:
        if not self.alive:
            return
        self.alive = False
        code = self.process.poll()
        log.error("data-path worker %d (pid %d) is gone (%s; exit status %s): its open "
                  "files fail to commit", self.index, self.process.pid, why, code)
        for waiter in self._waiting.values():
            waiter.reply = {"error": (errors.InternalError.kind,
                                      "the data-path worker process died")}
            waiter.done.set()
        self._waiting.clear()


class WorkerPool:
    """COUNT worker processes, started by start(), stopped by close()."""

    def __init__(self, count: int, hello: dict[str, Any]) -> None:
        self.count = count
        self._hello = hello
        self.links: list[WorkerLink] = []
        self._next = itertools.count()

    async def start(self, nursery: trio.Nursery) -> str:
        """Start the workers and wait until each has its hash backend (set up in the
        worker, so that the FUSE process never holds a CUDA context or pinned memory for
        them); the backend's name. ConfigError (the worker's own words) when it cannot run."""
        for index in range(self.count):
            self.links.append(await self._spawn(index))
        backends = set()
        try:
            for link in self.links:
                backends.add(await link.ready())
        except BaseException:
            self.close()
            raise
        for link in self.links:
            nursery.start_soon(link.read_replies)
        log.info("data path: %d worker processes (pids %s)", self.count,
                 " ".join(str(link.process.pid) for link in self.links))
        return ", ".join(sorted(backends))

    async def _spawn(self, index: int) -> WorkerLink:
        from mosafs.procutil import python_command

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for end in (ours, theirs):  # fewer, larger transfers per 1 MiB write
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
        with theirs:
            process = subprocess.Popen(
                python_command("mosafs.client.worker", "--fd", str(theirs.fileno())),
                pass_fds=(theirs.fileno(),))
        link = WorkerLink(index, process, trio.socket.from_stdlib_socket(ours))
        await link.send({"op": "hello", **self._hello})
        return link

    def pick(self) -> WorkerLink | None:
        """The next live worker, round-robin; None when none is left."""
        live = [link for link in self.links if link.alive]
        return live[next(self._next) % len(live)] if live else None

    def close(self) -> None:
        """Close the sockets (each worker exits at end of input) and reap the processes."""
        for link in self.links:
            link.alive = False
            link.sock.close()
        deadline = time.monotonic() + STOP_TIMEOUT
        for link in self.links:
            try:
                link.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("data-path worker %d did not stop; killing it", link.index)
                link.process.kill()
                link.process.wait()


_streams = itertools.count(1)


def _raise(error: tuple[str, str]) -> None:
    """A worker's domain error, as its own class here (by kind, as over gRPC)."""
    kind, message = error
    raise errors.BY_KIND.get(kind, errors.InternalError)(message)


async def fetch_remote(link: WorkerLink, chunk_id: bytes, addresses: list[str] | Any,
                       token: bytes = b"", coded: Any = None) -> memoryview:
    """A chunk's verified bytes, fetched by the worker behind LINK (CODED: where its
    fragments are, for an erasure-coded chunk: blockmap.Coded)."""
    reply, payload = await link.request({"op": "get", "stream": next(_streams),
                                         "id": chunk_id, "addresses": list(addresses),
                                         "token": token, "coded": coded})
    if "error" in reply:
        _raise(reply["error"])
    return memoryview(payload)


class RemotePipeline:
    """Pipeline's interface (append, feed, send_rest, finish) for a stream a worker runs."""

    def __init__(self, session: Any, link: WorkerLink) -> None:
        self.session = session
        self.link = link
        self.stream = next(_streams)
        # Small writes gathered into one frame (a frame per 4 KiB write would cost a
        # header and two sends each); a large write goes as it is.
        self._small = Pieces()
        self._small_bytes = 0
        self.finished = False  # the worker forgot the stream: no more token updates

    async def open(self, spec: str, preferred: str) -> None:
        s = self.session
        await self.link.send({
            "op": "open", "stream": self.stream, "spec": spec, "preferred": preferred,
            "targets": [(t.id, t.address) for t in s.targets], "copies": s.copies,
            "ids": list(s.stored.ids), "inode": s.inode, "token": s.write_token,
            "ec": s.ec})

    @property
    def stored_any(self) -> bool:
        """Whether the worker may have stored chunks of this stream: it does not say
        until its finish, so assume it has (mosafs.client.files.pipeline.Pipeline)."""
        return True

    async def send_token(self, token: bytes) -> None:
        """The session's write token after a lease renewal: the worker's puts use it."""
        if not self.finished:
            await self.link.send({"op": "token", "stream": self.stream, "token": token})

    async def append(self, data: bytes) -> None:
        if len(data) >= SMALL_FRAME and not self._small:
            await self.link.send({"op": "data", "stream": self.stream}, data)
            return
        self._small.append(data)
        self._small_bytes += len(data)
        if self._small_bytes >= SMALL_FRAME:
            await self.send_rest()

    async def feed(self, pieces: Pieces) -> None:
        for piece in pieces:
            await self.append(piece)

    async def send_rest(self) -> None:
        """Send the small writes gathered so far (the worker sends its own rest at finish)."""
        if self._small:
            data = b"".join(self._small)
            self._small, self._small_bytes = Pieces(), 0
            await self.link.send({"op": "data", "stream": self.stream}, data)

    async def finish(self) -> list[ChunkEntry]:
        await self.send_rest()
        self.finished = True
        reply, _ = await self.link.request({"op": "finish", "stream": self.stream})
        if "error" in reply:
            _raise(reply["error"])
        entries = [ChunkEntry(cid, length) for cid, length in reply["entries"]]
        stored = self.session.stored
        stored.ids.update(e.id for e in entries)
        stored.placements.update(reply["placements"])
        stored.addresses.update(reply["addresses"])
        stored.fragments.update(reply.get("fragments", {}))
        stored.new_bytes += reply["new_bytes"]
        metrics.CLIENT_HASH_SECONDS.labels(reply["backend"]).inc(reply["hash_seconds"])
        metrics.CLIENT_HASHED.labels(reply["backend"]).inc(reply["hashed_bytes"])
        return entries
