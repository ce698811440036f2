"""Saving a checkpoint as a new version of a file (docs/checkpoint.md, "Saving"): trio
tasks run by the client of mosafs.checkpoint.cluster.

The file's bytes are the safetensors layout (mosafs.checkpoint.format): the header, then
each tensor's bytes in file order. They go through the same session a write through the
mount opens (mosafs.client.files.WriteSession: a write lease whose base is the previous
version of the path, else the newest file of its series; the same chunker, so the same
chunks and ids; only chunks that neither the base nor the manager's index has are sent;
one commit makes the version, pessimistic by the pool's rules). Tensors on the host are
appended straight from their own memory (a memoryview each: no copy before the chunker).
Tensors on a GPU go through mosafs.checkpoint.device, which chunks and hashes them there
and copies to the host only the new chunks.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import trio

from mosafs import errors
from mosafs._proto import manager_pb2 as mpb
from mosafs.checkpoint.cluster import Target
from mosafs.checkpoint.format import Layout
from mosafs.checkpoint.sources import Source
from mosafs.client.files.context import ClientContext
from mosafs.client.files.writer import WriteSession

log = logging.getLogger(__name__)

MiB = 1 << 20


@dataclass
class SaveResult:
    """What a save did. bytes_hashed: the file's bytes chunked and hashed; bytes_to_host:
    bytes copied from a GPU to the host (new chunks, and the parts of chunks a CPU had
    to see); bytes_sent: bytes of the new chunks stored on benefactors (once each,
    whatever the pool's redundancy)."""

    path: str
    version: int = 0
    size: int = 0
    chunks: int = 0
    new_chunks: int = 0      # chunks copied to the host and stored (GPU saves)
    bytes_hashed: int = 0
    bytes_to_host: int = 0
    bytes_sent: int = 0
    blocked_s: float = 0.0   # the caller's wait (a non-blocking save: until its snapshot)
    total_s: float = 0.0     # from the call to the commit
    backend: str = "cpu"
    phases: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@contextlib.asynccontextmanager
async def opened(ctx: ClientContext, where: Target) -> AsyncIterator[int]:
    """The inode of WHERE: the file, created (mode 0666 less the umask) if it is not
    there. A folder by that name is IsADirectory. A save that created the file and fails
    before its first version removes it again (a load would find an empty file), unless
    someone else committed a version of it meanwhile."""
    created = False
    try:
        attr = await ctx.manager.lookup(where.parent, where.name)
    except errors.NotFound:
        attr = await ctx.manager.create(where.parent, where.name, 0o666 & ~_umask(),
                                        *_owner(), exclusive=False)
        created = True
    if attr.kind != mpb.FILE_KIND_REGULAR:
        raise errors.IsADirectory(f"{where.path} is not a regular file")
    try:
        yield int(attr.inode)
    except BaseException:
        if created:
            with trio.CancelScope(shield=True):
                await _remove_if_empty(ctx, where, int(attr.inode))
        raise


async def _remove_if_empty(ctx: ClientContext, where: Target, inode: int) -> None:
    """Unlink WHERE if it is still INODE with no version (best effort: the save's own
    error is the one reported)."""
    try:
        attr = await ctx.manager.lookup(where.parent, where.name)
        if int(attr.inode) == inode and not attr.version:
            await ctx.manager.unlink(where.parent, where.name)
    except errors.MosafsError as exc:
        log.info("could not remove %s after a failed save: %s", where.path, exc)


async def save_host(ctx: ClientContext, where: Target, layout: Layout,
                    found: list[Source], result: SaveResult) -> SaveResult:
    """Save tensors whose bytes are all on the host."""
    started = time.perf_counter()
    async with opened(ctx, where) as inode:
        session = await WriteSession.create(ctx, inode)
        try:
            await session.truncate(0)
            offset = 0
            for piece in _pieces(layout, found, ctx.config.batch_bytes):
                offset += await session.write(offset, piece)  # type: ignore[arg-type]
            reply = await session.commit()
        finally:
            await session.close()
    assert reply is not None  # the header at least was written
    result.phases["write_s"] = time.perf_counter() - started
    await figures(ctx, inode, reply.version, result)
    result.bytes_hashed = layout.size
    return result


def _pieces(layout: Layout, found: list[Source], size: int) -> Iterator[memoryview]:
    """The file's bytes in order, in views of at most SIZE bytes of the tensors' memory."""
    yield memoryview(layout.header)
    by_name = {s.spec.name: s for s in found}
    for entry in layout.entries:
        host = by_name[entry.spec.name].host
        assert host is not None
        for at in range(0, len(host), size):
            yield host[at:at + size]


async def figures(ctx: ClientContext, inode: int, version: int, result: SaveResult) -> None:
    stats = await ctx.manager.version_stats(inode, version)
    result.version = int(stats.version)
    result.size = int(stats.size)
    result.chunks = int(stats.chunks)
    result.bytes_sent = int(stats.new_bytes)


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def _owner() -> tuple[int, int]:
    import os

    return os.geteuid(), os.getegid()
