"""Loading a checkpoint onto a GPU (docs/checkpoint.md, "Loading"): the header first, the
tensors made on the device, then every chunk read at once into one host buffer (local
reads, the network otherwise) and, as soon as a window of about WINDOW bytes is in,
that window copied from the buffer straight into the tensors' memory while the rest is
still being read. Nothing but the tensors is held on the device.

The host buffer is pageable at first: pinning a buffer as large as the file cost about
1 s per GiB (measured on the lent H100: longer than reading the file), and a copy from
pageable memory runs in the background of the reads. It is kept for the next load of
the process (`HostBuffers`, up to KEEP_BYTES), in huge pages (a fresh gigabyte costs
262,144 page faults in 4 KiB pages, 512 in 2 MiB ones), and pinned in the background
once its first load is done."""

from __future__ import annotations

import contextlib
import functools
import logging
import mmap
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import trio

from mosafs.checkpoint.cluster import Target
from mosafs.checkpoint.format import Layout
from mosafs.checkpoint.loading import ChunkReader, Loaded, open_view, read_layout
from mosafs.client.files.context import ClientContext

log = logging.getLogger(__name__)

MiB = 1 << 20
WINDOW = 32 * MiB
COPIES = 2  # windows copied to the device at once

# Tensors made for a layout: (file start, file end, device pointer) of each, file order.
MakeTensors = Callable[[Layout], list[tuple[int, int, int]]]


class HostBuffers:
    """Anonymous memory maps reused by the loads of a process (one per load at a time).
    A map kept after its first load is pinned (cudaHostRegister) in the background, so
    the next loads copy to the device from pinned memory without having waited for the
    pinning (measured on the lent H100: a warm 1 GiB load 0.29-0.34 s from pageable
    memory, 0.19-0.21 s from pinned; pinning 1 GiB about 1 s)."""

    def __init__(self) -> None:
        self._free: list[mmap.mmap] = []
        self._pinned: dict[int, int] = {}  # id(map) -> its address, registered
        self._pinning: set[int] = set()  # id(map) of those being registered now
        self._lock = threading.Lock()

    def take(self, n: int) -> mmap.mmap:
        with self._lock:
            fits = [m for m in self._free if len(m) >= n]
            if fits:
                best = min(fits, key=len)
                self._free.remove(best)
                return best
        size = max(1, -(-n // HUGE) * HUGE)
        mem = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        with contextlib.suppress(AttributeError, OSError):  # a hint; absent on some kernels
            mem.madvise(mmap.MADV_HUGEPAGE)
        return mem

    def give(self, mem: mmap.mmap) -> None:
        """MEM is free again: kept while the kept ones stay within KEEP_BYTES (a process
        should not hold a large checkpoint's worth of memory after loading it), and
        pinned if it is not yet. It stays usable while it is being pinned: a load that
        comes meanwhile copies from it as from pageable memory, which beats a fresh map
        (page faults) or waiting for the pinning."""
        with self._lock:
            keep = sum(len(m) for m in self._free) + len(mem) <= KEEP_BYTES
            start = keep and id(mem) not in self._pinned and id(mem) not in self._pinning
            if keep:
                self._free.append(mem)
            if start:
                self._pinning.add(id(mem))
        if not keep:
            self._drop(mem)
        elif start:
            threading.Thread(target=self._pin, args=(mem,), name="pin-load-buffer",
                             daemon=True).start()

    def _pin(self, mem: mmap.mmap) -> None:
        import ctypes

        import cupy

        view = ctypes.c_char.from_buffer(mem)
        address = ctypes.addressof(view)
        del view
        try:
            cupy.cuda.runtime.hostRegister(address, len(mem), 1)  # cudaHostRegisterPortable
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            log.info("a load buffer of %d bytes stays pageable: %s", len(mem), exc)
        else:
            with self._lock:
                self._pinned[id(mem)] = address
        finally:
            with self._lock:
                self._pinning.discard(id(mem))

    def _drop(self, mem: mmap.mmap) -> None:
        with self._lock:
            address = self._pinned.pop(id(mem), None)
        if address is not None:
            import cupy

            cupy.cuda.runtime.hostUnregister(address)
        with contextlib.suppress(BufferError):  # a view still exported: the GC frees it
            mem.close()


HUGE = 2 * MiB
KEEP_BYTES = 2 << 30  # host memory kept between loads
HOST_BUFFERS = HostBuffers()


def windows(starts: tuple[int, ...], size: int) -> list[list[int]]:
    """Chunk indices in consecutive windows of at least SIZE bytes (the last may be less)."""
    out: list[list[int]] = [[]]
    for i in range(len(starts) - 1):
        if out[-1] and starts[i] - starts[out[-1][0]] >= size:
            out.append([])
        out[-1].append(i)
    return [w for w in out if w]


async def load_to_device(ctx: ClientContext, where: Target, device: int,
                         make: MakeTensors) -> Loaded:

    started = time.perf_counter()
    view = await open_view(ctx, where)
    reader = ChunkReader(ctx, view)
    layout = await read_layout(reader, where)
    mem = HOST_BUFFERS.take(view.size)
    try:
        return await _load(reader, layout, device, make, mem, started)
    finally:
        HOST_BUFFERS.give(mem)


async def _load(reader: ChunkReader, layout: Layout, device: int, make: MakeTensors,
                mem: mmap.mmap, started: float) -> Loaded:
    import cupy

    view = reader.view
    targets = make(layout)
    starts = view.starts
    host = np.frombuffer(mem, dtype=np.uint8, count=view.size)
    with cupy.cuda.Device(device):
        stream = cupy.cuda.Stream(non_blocking=True)
    spans = windows(starts, WINDOW)
    window_of = {i: w for w, indices in enumerate(spans) for i in indices}
    left = [len(indices) for indices in spans]
    copies = trio.CapacityLimiter(COPIES)

    async with trio.open_nursery() as nursery:
        def on_read(done: list[int]) -> None:
            for i in done:
                w = window_of[i]
                left[w] -= 1
                if left[w] == 0:
                    lo, hi = starts[spans[w][0]], starts[spans[w][-1] + 1]
                    nursery.start_soon(functools.partial(
                        trio.to_thread.run_sync, _copy_in, device, stream, host, lo, hi,
                        targets, limiter=copies))

        await reader.read(list(range(len(view.entries))),
                          lambda i: host[starts[i]:starts[i + 1]], on_read)
    return Loaded(layout, None, view.version, reader.local.bytes_read, reader.network_bytes,
                  time.perf_counter() - started)


def _copy_in(device: int, stream: Any, host: np.ndarray, lo: int, hi: int,
             targets: list[tuple[int, int, int]]) -> None:
    """File bytes [LO, HI) of HOST into the tensors they belong to (the header's part into
    none); returns once the copies are done."""
    import cupy

    base = int(host.ctypes.data)
    with cupy.cuda.Device(device):
        event = cupy.cuda.Event(disable_timing=True)
        for start, end, ptr in targets:
            a, b = max(start, lo), min(end, hi)
            if a < b:
                cupy.cuda.runtime.memcpyAsync(ptr + a - start, base + a, b - a, 1,
                                              stream.ptr)  # cudaMemcpyHostToDevice
        event.record(stream)
        event.synchronize()
