"""Saving tensors that live on a GPU (docs/checkpoint.md, "On the GPU"): the file's bytes
are chunked and hashed on that GPU where they are (mosafs.chunking's GPU stream, fed
device to device: the header from the host, then every tensor from its own memory),
ids come back, and only the chunks that neither the base version, the series nor the
manager's index has are copied to pinned host memory and stored. In an erasure-coded
pool the stream computes their parity on the GPU too.

The chunks and ids are exactly those the mount makes of the same file: the same spec,
the same stream positions (DESIGN §5), the same hashes (the GPU stream is checked against
the vectors like every chunker).
"""

from __future__ import annotations

import bisect
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import trio

from mosafs import errors
from mosafs.checkpoint.cluster import Target
from mosafs.checkpoint.format import Layout
from mosafs.checkpoint.saving import SaveResult, figures, opened
from mosafs.checkpoint.sources import Source
from mosafs.client.files.blockmap import ChunkEntry
from mosafs.client.files.context import ClientContext
from mosafs.client.files.uploads import New, store_group
from mosafs.client.files.writer import WriteSession

MiB = 1 << 20
FEED_BYTES = 128 * MiB  # bytes per feed call: chunks come back while the rest is fed
GROUP_BYTES = 8 * MiB  # new chunks stored together (as the mount's pipeline groups them)


@dataclass(frozen=True)
class _Piece:
    """Bytes [start, end) of the file: host bytes, or at device pointer PTR."""

    start: int
    end: int
    host: bytes | memoryview | None
    ptr: int


class DeviceImage:
    """A file whose bytes are the header (host) and tensors (device memory of one GPU, or
    host): copies any span of it into host memory."""

    def __init__(self, layout: Layout, found: list[Source]) -> None:
        import cupy

        self._cupy = cupy
        by_name = {s.spec.name: s for s in found}
        pieces = [_Piece(0, len(layout.header), memoryview(layout.header), 0)]
        for entry in layout.entries:
            src = by_name[entry.spec.name]
            if entry.end > entry.start:
                pieces.append(_Piece(entry.start, entry.end, src.host, src.ptr))
        self.pieces = pieces
        self._starts = [p.start for p in pieces]
        self.size = layout.size
        self.keep = found  # the tensors stay alive while the image is used
        devices = {s.device for s in found if s.on_device}
        if len(devices) != 1:
            raise errors.InvalidArgument(f"a GPU checkpoint's tensors must be on one GPU "
                                         f"(found devices {sorted(devices)}): save each "
                                         f"device's tensors as a file of its own")
        self.device = devices.pop()
        with cupy.cuda.Device(self.device):
            self._stream = cupy.cuda.Stream(non_blocking=True)

    def copy_out(self, spans: list[tuple[int, np.ndarray]]) -> None:
        """Bytes [start, start + len(out)) into OUT for each (start, out) of SPANS (pinned
        host memory: fast copies), all queued before one wait."""
        runtime = self._cupy.cuda.runtime
        with self._cupy.cuda.Device(self.device):
            for start, out in spans:
                end = start + len(out)
                i = bisect.bisect_right(self._starts, start) - 1
                while start < end:
                    p = self.pieces[i]
                    lo, hi = max(start, p.start), min(end, p.end)
                    into = out[lo - (end - len(out)):hi - (end - len(out))]
                    if p.host is not None:
                        into[:] = np.frombuffer(p.host, dtype=np.uint8)[lo - p.start:
                                                                        hi - p.start]
                    else:
                        runtime.memcpyAsync(int(into.ctypes.data), p.ptr + lo - p.start,
                                            hi - lo, 2, self._stream.ptr)  # device to host
                    start = hi
                    i += 1
            self._stream.synchronize()


def snapshot(found: list[Source]) -> list[Source]:
    """Device-to-device copies of FOUND's GPU tensors into one buffer (host tensors:
    copies in host memory), so that a non-blocking save's caller may change them at once.
    The copies (only they) hold the buffer."""
    import cupy

    from mosafs.checkpoint.sources import Source as Src

    total = sum(s.spec.nbytes for s in found if s.on_device)
    devices = {s.device for s in found if s.on_device}
    device = devices.pop() if len(devices) == 1 else 0
    with cupy.cuda.Device(device):
        arena = cupy.empty(max(1, total), dtype=cupy.uint8)
        stream = cupy.cuda.Stream(non_blocking=True)
        out: list[Source] = []
        at = int(arena.data.ptr)
        for s in found:
            if s.on_device and s.spec.nbytes:
                cupy.cuda.runtime.memcpyAsync(at, s.ptr, s.spec.nbytes, 3, stream.ptr)
                out.append(Src(s.spec, device=s.device, ptr=at, keep=arena))
                at += s.spec.nbytes
            elif s.on_device:
                out.append(Src(s.spec, device=s.device, ptr=at, keep=arena))
            else:
                out.append(Src(s.spec, host=memoryview(bytes(s.host or b""))))
        # The copies are queued behind whatever the caller's streams had queued on these
        # tensors only if the caller synchronised them: torch's current stream is waited
        # for by api.save before this runs (documented copy rule).
        stream.synchronize()
    return out


async def save_device(ctx: ClientContext, where: Target, layout: Layout, found: list[Source],
                      result: SaveResult) -> SaveResult:
    """Save tensors of one GPU (and host ones beside them) as WHERE's new version."""
    started = time.perf_counter()
    image = DeviceImage(layout, found)
    async with opened(ctx, where) as inode:
        session = await WriteSession.create(ctx, inode)
        try:
            await session.truncate(0)
            result.phases["open_s"] = time.perf_counter() - started
            saver = _DeviceSave(ctx, session, image, result)
            entries = await saver.run()
            session.replace_content(entries)
            committing = time.perf_counter()
            reply = await session.commit()
            result.phases["commit_s"] = time.perf_counter() - committing
        finally:
            await session.close()
    assert reply is not None
    result.phases["write_s"] = time.perf_counter() - started
    await figures(ctx, inode, reply.version, result)
    result.bytes_hashed = layout.size
    result.backend = "gpu"
    return result


class _DeviceSave:
    def __init__(self, ctx: ClientContext, session: WriteSession, image: DeviceImage,
                 result: SaveResult) -> None:
        from mosafs.chunking import make_chunker

        assert session.lease is not None
        self.ctx = ctx
        self.session = session
        self.image = image
        self.result = result
        chunker: Any = make_chunker(session.lease.pool.chunker, "gpu",
                                    pinned_bytes=ctx.config.gpu_pinned_bytes)
        ec = session.ec
        self.parity = None if ec is None else (ec.k, ec.m, max(ec.min_chunk, 1))
        self.stream: Any = chunker.stream(pipelined=True, keep_data=False, parity=self.parity,
                                     device_input=image.device)
        self.entries: list[ChunkEntry] = []
        self.cursor = 0
        self.spread = random.randrange(1 << 30)
        self.slots = trio.Semaphore(ctx.config.uploads_per_file)
        self.lookups = trio.Semaphore(4)  # index look-ups in flight
        self.feeding = trio.CapacityLimiter(1)  # the stream is fed in order
        self.staging = STAGING

    async def run(self) -> list[ChunkEntry]:
        """Feed the file to the GPU stream, FEED_BYTES at a time (several tensors in one
        call: each call is a hand-off to a worker thread); each feed's chunks are
        recorded at once (the block-map's order), and their look-ups and puts go on in
        the background while the next bytes are chunked."""
        phases = self.result.phases
        pinned = self.staging.pin_s
        async with trio.open_nursery() as uploads:
            for spans in _feeds(self.image.pieces, FEED_BYTES):
                batches = await self._timed("hash_s", self._feed, spans)
                self._take(batches, uploads)
            self._take(await self._timed("hash_s", self.stream.finish_batch), uploads)
            fed = time.perf_counter()
        phases["drain_s"] = time.perf_counter() - fed
        phases["pin_s"] = self.staging.pin_s - pinned  # thread seconds pinning buffers
        return self.entries

    def _feed(self, spans: list[tuple[_Piece, int, int]]) -> list[Any]:
        """In the feeding thread: bytes [at, at + n) of each piece, in order."""
        batches: list[Any] = []
        for piece, at, n in spans:
            if piece.host is not None:
                batches += self.stream.feed_batch(piece.host[at - piece.start:
                                                              at - piece.start + n])
            else:
                batches += self.stream.feed_device_batch(piece.ptr + at - piece.start, n)
        return batches

    async def _timed(self, phase: str, fn: Any, *args: Any) -> Any:
        """FN(*ARGS) in a worker thread, its seconds added to PHASE. The feeds have a
        thread of their own: copies out, sharing the context's threads, never hold the
        chunking up."""
        started = time.perf_counter()
        try:
            if phase == "hash_s":
                return await trio.to_thread.run_sync(fn, *args, limiter=self.feeding)
            return await self.ctx.cpu(fn, *args)
        finally:
            phases = self.result.phases
            phases[phase] = phases.get(phase, 0.0) + time.perf_counter() - started

    def _take(self, batches: list[Any], uploads: trio.Nursery) -> None:
        """Record BATCHES' chunks; those this session has not seen go to a look-up."""
        stored = self.session.stored
        fresh: dict[bytes, tuple[int, int, Any]] = {}
        for batch in batches:
            raw = batch.ids.tobytes()
            par = batch.parity
            for i, (o, n) in enumerate(zip(batch.offsets.tolist(), batch.lengths.tolist(),
                                           strict=True)):
                cid = raw[32 * i:32 * i + 32]
                self.entries.append(ChunkEntry(cid, n))
                if cid not in stored.ids and cid not in fresh:
                    fresh[cid] = (o, n, None if par is None else par.copy(i))
            batch.release()
        stored.ids.update(fresh)  # a repeat later in the file is not sent twice
        if fresh:
            uploads.start_soon(self._look_up, fresh, uploads)

    async def _look_up(self, fresh: dict[bytes, tuple[int, int, Any]],
                       uploads: trio.Nursery) -> None:
        """Drop what the manager's index has; store the rest in groups."""
        if self.ctx.config.dedupe_with_index:
            started = time.perf_counter()
            async with self.lookups:
                present = await self.ctx.manager.find_chunks(list(fresh))
            phases = self.result.phases
            phases["lookup_s"] = phases.get("lookup_s", 0.0) + time.perf_counter() - started
            for cid, has in zip(list(fresh), present, strict=True):
                if has:
                    del fresh[cid]
        group: list[tuple[bytes, int, int, Any]] = []
        size = 0
        for cid, (o, n, par) in fresh.items():
            if group and size + n > GROUP_BYTES:
                await self._store(group, uploads)
                group, size = [], 0
            group.append((cid, o, n, par))
            size += n
        if group:
            await self._store(group, uploads)

    async def _store(self, group: list[tuple[bytes, int, int, Any]],
                     uploads: trio.Nursery) -> None:
        await self.slots.acquire()
        cursor, self.cursor = self.cursor, self.cursor + len(group)
        uploads.start_soon(self._upload, group, cursor)

    async def _upload(self, group: list[tuple[bytes, int, int, Any]], cursor: int) -> None:
        """Copy the group's chunks out of the GPU into a pinned staging buffer and store
        them from there (their bytes are views of it: no further copy until each put's
        message), then give the buffer back."""
        staging = self.staging.take(sum(n for _, _, n, _ in group))
        try:
            datas = await self._timed("copy_out_s", self._copy_out, group, staging)
            self.result.bytes_to_host += sum(len(d) for d in datas)
            self.result.new_chunks += len(group)
            news = [New(cid, data, cursor + i, par)
                    for i, ((cid, _, _, par), data) in enumerate(zip(group, datas, strict=True))]
            started = time.perf_counter()
            await store_group(self.session, self.ctx.puts, news,
                              None if self.parity is None else self.parity[:2], self.spread)
            phases = self.result.phases
            phases["puts_s"] = phases.get("puts_s", 0.0) + time.perf_counter() - started
        finally:
            self.staging.give(staging)
            self.slots.release()

    def _copy_out(self, group: list[tuple[bytes, int, int, Any]],
                  staging: np.ndarray) -> list[memoryview]:
        """The group's chunks, copied from the GPU into STAGING (views of it)."""
        spans = []
        at = 0
        for _, o, n, _ in group:
            spans.append((o, staging[at:at + n]))
            at += n
        self.image.copy_out(spans)  # one wait for the group, not one per chunk
        return [view.data for _, view in spans]  # memoryviews of the pinned bytes


class _Staging:
    """Pinned host buffers reused for the copies out of the GPU (pinning memory costs
    more than the copy of a group)."""

    def __init__(self) -> None:
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()
        self.pin_s = 0.0  # seconds spent pinning memory (for the figures)

    def take(self, n: int) -> np.ndarray:
        with self._lock:
            for i, buf in enumerate(self._free):
                if len(buf) >= n:
                    return self._free.pop(i)[:n]
        return self._pin(max(n, GROUP_BYTES))[:n]

    def reserve(self, count: int, n: int) -> None:
        """At least COUNT free buffers of N bytes or more (pinned now if missing)."""
        with self._lock:
            missing = count - sum(len(buf) >= n for buf in self._free)
        made = [self._pin(n) for _ in range(max(0, missing))]
        with self._lock:
            self._free.extend(made)

    def give(self, view: np.ndarray) -> None:
        base = view.base if isinstance(view.base, np.ndarray) else view
        with self._lock:
            self._free.append(base)

    def _pin(self, n: int) -> np.ndarray:
        started = time.perf_counter()
        try:
            return _pinned(n)
        finally:
            with self._lock:
                self.pin_s += time.perf_counter() - started


STAGING = _Staging()  # shared by the saves of the process


def prepare_device(index: int, spec: str, *, pinned_bytes: int, uploads: int) -> dict[str, float]:
    """The one-time costs of a process's first GPU save, paid now (docs/checkpoint.md,
    "Preparing"): two feeds' worth of random bytes chunked and hashed on GPU INDEX with
    chunker SPEC (the stream's device buffers and CuPy's memory pool grow to a feed, the
    kernels load), and UPLOADS staging buffers pinned for the copies out. Seconds each."""
    import cupy

    from mosafs.chunking import make_chunker

    started = time.perf_counter()
    chunker: Any = make_chunker(spec, "gpu", pinned_bytes=pinned_bytes)
    with cupy.cuda.Device(index):
        # Random bytes, so that the chunks are of the usual sizes and counts; two feeds,
        # so that one is in flight while the next is queued, as in a save.
        scratch = cupy.asarray(np.frombuffer(np.random.default_rng(0).bytes(FEED_BYTES),
                                             dtype=np.uint8))
        stream = chunker.stream(pipelined=True, keep_data=False, device_input=index)
        batches = [b for _ in range(2)
                   for b in stream.feed_device_batch(int(scratch.data.ptr), FEED_BYTES)]
        batches += stream.finish_batch()
        for batch in batches:
            batch.release()
        del scratch
    hashed = time.perf_counter()
    STAGING.reserve(uploads, GROUP_BYTES)
    return {"hash_s": hashed - started, "pin_s": time.perf_counter() - hashed}


def _feeds(pieces: list[_Piece], size: int) -> list[list[tuple[_Piece, int, int]]]:
    """PIECES cut into feeds of about SIZE bytes: lists of (piece, file offset, count)."""
    feeds: list[list[tuple[_Piece, int, int]]] = [[]]
    room = size
    for piece in pieces:
        at = piece.start
        while at < piece.end:
            if room == 0:
                feeds.append([])
                room = size
            n = min(room, piece.end - at)
            feeds[-1].append((piece, at, n))
            at += n
            room -= n
    return [f for f in feeds if f]


def _pinned(n: int) -> np.ndarray:
    import cupy

    mem = cupy.cuda.alloc_pinned_memory(max(1, n))
    return np.frombuffer(mem, dtype=np.uint8, count=n)
