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
    attr = await ctx.manager.lookup(where.parent, where.name)
    view = BlockMapView.from_proto(await ctx.manager.block_map(attr.inode))
    buffer = alloc(view.size)
    host = np.asarray(buffer)
    reader = _Reader(ctx, view, host)
    await reader.run()
    if view.size < 8:
        raise errors.InvalidArgument(f"{where.path}: not a safetensors file "
                                     f"({view.size} bytes)")
    n = int.from_bytes(host[:8].tobytes(), "little")
    layout = parse(host[:min(view.size, 8 + n)].tobytes(), view.size)
    return Loaded(layout, buffer, view.version, reader.local.bytes_read,
                  reader.network_bytes, time.perf_counter() - started)


class _Reader:
    def __init__(self, ctx: ClientContext, view: BlockMapView, host: np.ndarray) -> None:
        self.ctx = ctx
        self.view = view
        self.host = host
        self.local = LocalReads(ctx.benefactors)
        self.network_bytes = 0
        self._fetches = trio.Semaphore(FETCHES)

    def _dest(self, i: int) -> np.ndarray:
        start = self.view.starts[i]
        return self.host[start:start + self.view.entries[i].length]

    async def run(self) -> None:
        batches: dict[str, list[list[int]]] = {}
        network: list[int] = []
        for i, entry in enumerate(self.view.entries):
            addresses, _, coded = self.view.where(entry.id)
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
                    nursery.start_soon(self._local_batch, address, run, nursery)
            for i in network:
                await self._fetches.acquire()
                nursery.start_soon(self._fetch, i)

    async def _local_batch(self, address: str, run: list[int], nursery: trio.Nursery) -> None:
        items = [(self.view.entries[i].id, self.view.where(self.view.entries[i].id)[1],
                  self._dest(i)) for i in run]
        done = await self.local.read(address, items)
        for i, ok in zip(run, done, strict=True):
            if not ok:
                await self._fetches.acquire()
                nursery.start_soon(self._fetch, i)

    async def _fetch(self, i: int) -> None:
        entry = self.view.entries[i]
        addresses, token, coded = self.view.where(entry.id)
        # Replicas in turn (chunk i starts at replica i): every benefactor serves a share
        # at once. Not through the chunk cache: a whole file would only push out what
        # the mount's readers keep there.
        turn = i % len(addresses) if addresses else 0
        try:
            data = await self.ctx.fetcher.fetch(
                entry.id, [*addresses[turn:], *addresses[:turn]], token, coded)
            self._dest(i)[:] = np.frombuffer(data, dtype=np.uint8)
            self.network_bytes += entry.length
        finally:
            self._fetches.release()
