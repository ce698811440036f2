"""A data-path worker: runs write pipelines for the mount that started it
(`python -m mosafs.client.worker --fd N`; protocol and reasons in
mosafs.client.files.remote).

It has the mount's configuration, TLS identity and logging (sent in the first frame), its
own ClientContext (manager and benefactor channels, chunkers, threads) and one trio loop:
a reader task takes frames in order and feeds each stream's Pipeline; a finish runs in
its own task and answers with the block-map entries and what was stored where. The
worker exits when the mount closes the socket, and with the mount (PR_SET_PDEATHSIG),
so a SIGKILLed mount leaves no worker behind.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import logging
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

import trio

from mosafs import errors
from mosafs._proto import common_pb2 as cpb
from mosafs.chunking import resolve_backend
from mosafs.client.files.context import ClientConfig, ClientContext
from mosafs.client.files.pipeline import EcPolicy, Pipeline, Stored
from mosafs.client.files.remote import receive_frame, send_frame

log = logging.getLogger("mosafs.client.worker")
_PR_SET_PDEATHSIG = 1


@dataclass
class _Session:
    """What a Pipeline asks of its session, from the mount's open frame."""

    ctx: ClientContext
    inode: int
    targets: list[cpb.BenefactorAddress]
    copies: int
    stored: Stored = field(default_factory=Stored)
    write_token: bytes = b""  # the lease's, replaced by each renewal's ("token" frames)
    ec: EcPolicy | None = None  # an erasure-coded pool's policy


class _Worker:
    def __init__(self, sock: trio.socket.SocketType, ctx: ClientContext) -> None:
        self.sock = sock
        self.ctx = ctx
        self.streams: dict[int, tuple[Pipeline, _Session]] = {}
        self._send_lock = trio.Lock()

    async def serve(self, nursery: trio.Nursery) -> None:
        while True:
            try:
                header, payload = await receive_frame(self.sock)
            except EOFError:
                return  # the mount closed its end: stopping, or gone
            op = header["op"]
            if op == "data":
                pipeline = self.streams[header["stream"]][0]
                # A failed pipeline keeps its error for the finish; its data is dropped.
                with contextlib.suppress(errors.MosafsError):
                    await pipeline.append(payload)  # type: ignore[arg-type]
            elif op == "open":
                self._open(header)
            elif op == "token":
                stream = self.streams.get(header["stream"])
                if stream is not None:  # a stream finishing may be gone already
                    stream[1].write_token = header["token"]
            elif op == "finish":
                nursery.start_soon(self._finish, header["stream"])
            elif op == "get":
                nursery.start_soon(self._get, header)
            else:
                raise errors.InternalError(f"unknown data-path frame {op!r}")

    def _open(self, header: dict[str, Any]) -> None:
        session = _Session(self.ctx, header["inode"],
                           [cpb.BenefactorAddress(id=i, address=a) for i, a in header["targets"]],
                           header["copies"], Stored(ids=set(header["ids"])),
                           header.get("token", b""), header.get("ec"))
        pipeline = Pipeline(session, self.ctx.chunker(header["spec"], header["preferred"]))
        pipeline.start()
        self.streams[header["stream"]] = (pipeline, session)

    async def _finish(self, stream: int) -> None:
        pipeline, session = self.streams.pop(stream)
        reply: dict[str, Any] = {"stream": stream}
        try:
            await pipeline.send_rest()
            entries = await pipeline.finish()
        except errors.MosafsError as exc:
            reply["error"] = (exc.kind, exc.message)
        else:
            stored = session.stored
            reply.update(
                entries=[(e.id, e.length) for e in entries], placements=stored.placements,
                addresses=stored.addresses, fragments=stored.fragments,
                new_bytes=stored.new_bytes,
                hashed_bytes=pipeline.hashed_bytes, hash_seconds=pipeline.hash_seconds,
                backend=pipeline.chunker_backend)
        await self._reply(reply)

    async def _get(self, header: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"stream": header["stream"]}
        data: Any = b""
        try:
            data = await self.ctx.fetcher.fetch(header["id"], header["addresses"],
                                                header.get("token", b""), header.get("coded"))
        except errors.MosafsError as exc:
            reply["error"] = (exc.kind, exc.message)
        await self._reply(reply, data)

    async def _reply(self, reply: dict[str, Any], payload: Any = b"") -> None:
        async with self._send_lock:
            await send_frame(self.sock, reply, payload)


async def _report_ready(sock: trio.socket.SocketType, ctx: ClientContext) -> bool:
    """Set up the hash backend and tell the mount which (or why not: it says so, and
    stops). False when this worker is to stop: no backend, or the mount is gone (it
    stops at the first worker that cannot start)."""
    reply: dict[str, Any]
    try:
        reply = {"backend": await ctx.cpu(resolve_backend, ctx.config.hash_backend)}
    except errors.MosafsError as exc:
        reply = {"error": (exc.kind, exc.message)}
    try:
        await send_frame(sock, reply, b"")
    except OSError:
        return False
    return "backend" in reply


def _die_with_parent() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


async def _main(fd: int) -> None:
    sock = trio.socket.from_stdlib_socket(socket.socket(fileno=fd))
    hello, _ = await receive_frame(sock)
    from mosafs.memtune import tune_malloc
    from mosafs.procutil import setup_logging
    from mosafs.rpc import security

    setup_logging(hello["log_level"], hello["log_format"])
    tune_malloc(arena_max=4)
    security.configure(hello["identity"])
    async with trio.open_nursery() as nursery:
        ctx = ClientContext(ClientConfig(**hello["config"]), nursery)
        if not await _report_ready(sock, ctx):
            ctx.close()
            return
        ctx.spawn(ctx.cpu, ctx.warm_up)  # a failure is logged; the worker goes on
        try:
            await _Worker(sock, ctx).serve(nursery)
        finally:
            nursery.cancel_scope.cancel()
            ctx.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mosafs.client.worker")
    parser.add_argument("--fd", type=int, required=True,
                        help="this worker's end of the mount's socketpair")
    args = parser.parse_args(argv)
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the mount stops us by closing the socket
    trio.run(_main, args.fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
