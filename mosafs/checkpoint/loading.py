"""Loading a checkpoint (docs/checkpoint.md, "Loading"): the newest version of a file,
read by the client of mosafs.checkpoint.cluster straight from the benefactors (no FUSE)
into one host buffer; the caller's thread then makes the tensors from it
(mosafs.checkpoint.api).

Whole copies on benefactors of this host are read from their files (short-circuit local
reads, mosafs.client.files.localreads: pread into the buffer, no gRPC copy), in batches
of LOCAL_BATCH chunks, the replicas taken in turn so that every benefactor serves a
share; the rest (other hosts, erasure-coded chunks, anything a local read did not give)
through the mount's chunk fetcher, every chunk's id verified either way."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import trio

from mosafs import errors
from mosafs.checkpoint.cluster import Target
from mosafs.checkpoint.format import Layout, parse
from mosafs.client.files.blockmap import BlockMapView
from mosafs.client.files.context import ClientContext
from mosafs.client.files.localreads import LocalReads

FETCHES = 64      # chunks in flight through the network path
LOCAL_BATCH = 16  # chunks per local-read ticket


@dataclass
class Loaded:
    """A file's bytes and how they came."""

    layout: Layout
    buffer: Any
    version: int
    local_bytes: int = 0
    network_bytes: int = 0
    read_s: float = 0.0


async def read_file(ctx: ClientContext, where: Target, alloc: Callable[[int], Any]) -> Loaded:
    """WHERE's newest version; ALLOC(n) gives a writable uint8 array of n bytes (pinned
    memory when the tensors go to a GPU)."""
    started = time.perf_counter()
    view = await open_view(ctx, where)
    buffer = alloc(view.size)
    host = np.asarray(buffer)
    reader = ChunkReader(ctx, view)
    await reader.read(list(range(len(view.entries))),
                      lambda i: host[view.starts[i]:view.starts[i + 1]])
    if view.size < 8:
        raise errors.InvalidArgument(f"{where.path}: not a safetensors file "
                                     f"({view.size} bytes)")
    n = int.from_bytes(host[:8].tobytes(), "little")
    layout = parse(host[:min(view.size, 8 + n)].tobytes(), view.size)
    return Loaded(layout, buffer, view.version, reader.local.bytes_read,
                  reader.network_bytes, time.perf_counter() - started)


class ChunkReader:
    """Reads chunks of one block-map view into destinations the caller gives."""

    def __init__(self, ctx: ClientContext, view: BlockMapView) -> None:
        self.ctx = ctx
        self.view = view
        self.local = LocalReads(ctx.benefactors)
        self.network_bytes = 0
        self._fetches = trio.Semaphore(FETCHES)

    async def read(self, indices: list[int], dest: Callable[[int], Any],
                   on_read: Callable[[list[int]], None] = lambda done: None) -> None:
        """Chunks INDICES of the view, chunk i into DEST(i) (a writable uint8 array of its
        length): local reads where they can, the network otherwise. ON_READ(indices) is
        told (in the trio thread) as chunks are in."""
        batches: dict[str, list[list[int]]] = {}
        network: list[int] = []
        for i in indices:
            addresses, _, coded = self.view.where(self.view.entries[i].id)
            if coded is not None or not addresses:
                network.append(i)
                continue
            address = addresses[i % len(addresses)]  # replicas in turn
            runs = batches.setdefault(address, [[]])
            if len(runs[-1]) == LOCAL_BATCH:
                runs.append([])
            runs[-1].append(i)
        async with trio.open_nursery() as nursery:
            for address, runs in batches.items():
                for run in runs:
                    nursery.start_soon(self._local_batch, address, run, dest, on_read,
                                       nursery)
            for i in network:
                await self._fetches.acquire()
                nursery.start_soon(self._fetch, i, dest, on_read)

    async def _local_batch(self, address: str, run: list[int], dest: Callable[[int], Any],
                           on_read: Callable[[list[int]], None],
                           nursery: trio.Nursery) -> None:
        entries = self.view.entries
        items = [(entries[i].id, self.view.where(entries[i].id)[1], dest(i)) for i in run]
        done = await self.local.read(address, items)
        on_read([i for i, ok in zip(run, done, strict=True) if ok])
        for i, ok in zip(run, done, strict=True):
            if not ok:
                await self._fetches.acquire()
                nursery.start_soon(self._fetch, i, dest, on_read)

    async def _fetch(self, i: int, dest: Callable[[int], Any],
                     on_read: Callable[[list[int]], None]) -> None:
        entry = self.view.entries[i]
        addresses, token, coded = self.view.where(entry.id)
        # Replicas in turn (chunk i starts at replica i): every benefactor serves a share
        # at once. Not through the chunk cache: a whole file would only push out what
        # the mount's readers keep there.
        turn = i % len(addresses) if addresses else 0
        try:
            data = await self.ctx.fetcher.fetch(
                entry.id, [*addresses[turn:], *addresses[:turn]], token, coded)
            dest(i)[:] = np.frombuffer(data, dtype=np.uint8)
            self.network_bytes += entry.length
            on_read([i])
        finally:
            self._fetches.release()


async def open_view(ctx: ClientContext, where: Target) -> BlockMapView:
    attr = await ctx.manager.lookup(where.parent, where.name)
    return BlockMapView.from_proto(await ctx.manager.block_map(attr.inode))


async def read_layout(reader: ChunkReader, where: Target) -> Layout:
    """The file's layout, from the chunks that hold its header."""
    view = reader.view
    if view.size < 8:
        raise errors.InvalidArgument(f"{where.path}: not a safetensors file "
                                     f"({view.size} bytes)")
    head = np.empty(0, dtype=np.uint8)
    want = 8
    while len(head) < want:
        upto = [i for i, _, _ in view.pieces(0, want)]
        head = await _read_prefix(reader, upto)
        want = min(view.size, 8 + int.from_bytes(head[:8].tobytes(), "little"))
    return parse(head[:want].tobytes(), view.size)


async def _read_prefix(reader: ChunkReader, upto: list[int]) -> np.ndarray:
    """Chunks 0..UPTO[-1] in one array."""
    starts = reader.view.starts
    head = np.empty(starts[upto[-1] + 1], dtype=np.uint8)
    await reader.read(upto, lambda i: head[starts[i]:starts[i + 1]])
    return head
