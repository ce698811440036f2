"""Loading a checkpoint (docs/checkpoint.md, "Loading"): the newest version of a file,
read by the client of mosafs.checkpoint.cluster straight from the benefactors (no FUSE:
every chunk fetched in parallel, its id verified, erasure-coded chunks read around a
missing fragment as the mount reads them) into one host buffer; the caller's thread then
makes the tensors from it (mosafs.checkpoint.api)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import trio

from mosafs import errors
from mosafs.checkpoint.cluster import Target
from mosafs.checkpoint.format import Layout, parse
from mosafs.client.files.blockmap import BlockMapView
from mosafs.client.files.context import ClientContext

FETCHES = 64  # chunks in flight


async def read_file(ctx: ClientContext, where: Target,
                    alloc: Callable[[int], Any]) -> tuple[Layout, Any, int]:
    """(layout, buffer, version) of WHERE's newest version; ALLOC(n) gives a writable
    uint8 array of n bytes (pinned memory when the tensors go to a GPU)."""
    attr = await ctx.manager.lookup(where.parent, where.name)
    view = BlockMapView.from_proto(await ctx.manager.block_map(attr.inode))
    buffer = alloc(view.size)
    host = np.asarray(buffer)
    limit = trio.Semaphore(FETCHES)

    async def fetch(i: int) -> None:
        entry = view.entries[i]
        addresses, token, coded = view.where(entry.id)
        # Replicas in turn (chunk i starts at replica i): every benefactor serves a share
        # at once. Not through the chunk cache: a whole file would only push out what
        # the mount's readers keep there.
        turn = i % len(addresses) if addresses else 0
        try:
            data = await ctx.fetcher.fetch(entry.id, [*addresses[turn:], *addresses[:turn]],
                                           token, coded)
            start = view.starts[i]
            host[start:start + entry.length] = np.frombuffer(data, dtype=np.uint8)
        finally:
            limit.release()

    async with trio.open_nursery() as nursery:
        for i in range(len(view.entries)):
            await limit.acquire()
            nursery.start_soon(fetch, i)
    if view.size < 8:
        raise errors.InvalidArgument(f"{where.path}: not a safetensors file "
                                     f"({view.size} bytes)")
    n = int.from_bytes(host[:8].tobytes(), "little")
    layout = parse(host[:min(view.size, 8 + n)].tobytes(), view.size)
    return layout, buffer, view.version
