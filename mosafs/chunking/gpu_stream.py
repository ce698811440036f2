"""The GPU chunk stream (DESIGN §6): chunking, BLAKE3 and erasure parity of a byte stream
on the GPU runtime's pinned buffers and devices (mosafs.chunking.gpu_runtime).

Imported only by the GPU backend, lazily: it imports CuPy at module import.

`GpuStream` is a `ChunkStream` that fills the runtime's slots in order, round-robin over
the devices, and runs per filled range (a "segment"): copy in (pinned -> device),
candidate kernel, candidates out, then on the host the selection of cut points, then the
tail copy (device to device, peer copy across GPUs), BLAKE3 kernels and the digests out.
Each slot has its own CUDA stream, so the copy of one buffer overlaps the kernels of the
previous one; the host only waits when it needs a result or a free slot. With
`parity=(K, M, MIN_CHUNK)` each segment's chunks also get their erasure parity after the
hash kernels (`ParityStage`, the kernel in mosafs.erasure.gpu_batch), copied back alone
into host blocks pooled by the runtime (docs/gpu.md).

Tail carry: a full buffer holds `buffer_size >= MAX` bytes, so a chunk spans at most two
buffers: the open chunk left when buffer k is selected started in buffer k (or at its
start) and is copied into the head room of buffer k+1 before k+1's chunks are hashed.
Results never depend on how the stream was split into feed() pieces.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from mosafs.chunking.base import BytesLike, Chunk, ChunkStream
from mosafs.chunking.gpu_kernels import GEAR_STRIP
from mosafs.chunking.gpu_parity import ParityStage
from mosafs.chunking.gpu_runtime import (
    ANY_DIRECTION,
    D2H,
    H2D,
    HIST,
    ByteArray,
    GpuRuntime,
    HostArray,
    I64Array,
    Slot,
    U32Array,
    byte_array,
    cupy,
    launch_candidates,
    launch_hash,
)
from mosafs.chunking.gpu_select import select_cuts, tree_plan
from mosafs.chunking.spec import ChunkerSpec

if TYPE_CHECKING:
    from mosafs.erasure.gpu_batch import BatchParity, RaggedPlan


@dataclass(slots=True)
class ChunkBatch:
    """Chunks as arrays (no per-chunk objects): stream offsets, lengths, ids (n x 32).

    parity (a stream made with `parity=`): every chunk's erasure parity fragments, views
    of a host block valid until `release()` (mosafs.erasure.gpu_batch.BatchParity);
    None for a stream without parity. Release a batch once its parity is consumed, so
    its block serves the next ones (a dropped batch releases it too)."""

    offsets: I64Array
    lengths: I64Array
    ids: npt.NDArray[np.uint8]
    data: list[bytes] | None = None
    parity: BatchParity | None = None

    def __len__(self) -> int:
        return int(self.offsets.shape[0])

    def chunks(self) -> list[Chunk]:
        """Chunk objects with their bytes, and their parity copied out of the block."""
        if self.data is None:
            raise ValueError("this batch was made without the chunks' bytes (keep_data=False)")
        raw = self.ids.tobytes()
        par = self.parity
        return [Chunk(int(o), int(n), raw[32 * i:32 * i + 32], d,
                      None if par is None else par.copy(i))
                for i, (o, n, d) in enumerate(zip(self.offsets.tolist(), self.lengths.tolist(),
                                                   self.data, strict=True))]

    def release(self) -> None:
        """Give the parity's host block back (idempotent; nothing without parity)."""
        if self.parity is not None:
            self.parity.release()


@dataclass(eq=False, slots=True)
class _Use:
    """One slot as used by one stream: its data is stream bytes [base, base + fill)."""

    slot: Slot
    base: int
    index: int
    fill: int = 0
    sub: int = 0      # bytes submitted (segments cover [0, sub))
    open_segs: int = 0
    tail_done: bool = False
    released: bool = False


@dataclass(eq=False, slots=True)
class _Seg:
    use: _Use
    a: int
    b: int
    final: bool
    cands: bool = False
    host_count: int = 0
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    timing: dict[str, Any] | None = None
    parity: tuple[RaggedPlan, HostArray | None] | None = None


@dataclass(slots=True)
class Profile:
    """Summed stage times of a stream's segments (GPU times from events, seconds)."""

    copy_in: float = 0.0
    candidates: float = 0.0
    selection: float = 0.0   # host
    hash: float = 0.0
    copy_out: float = 0.0
    parity: float = 0.0      # ragged kernel and parity copy out (parity streams)
    segments: int = 0
    bytes: int = 0

    def as_dict(self) -> dict[str, float]:
        out = {"copy_in_s": self.copy_in, "candidate_kernel_s": self.candidates,
               "selection_s": self.selection, "hash_kernel_s": self.hash,
               "copy_out_s": self.copy_out, "segments": self.segments, "bytes": self.bytes}
        if self.parity:
            out["parity_s"] = self.parity
        return out


class GpuStream(ChunkStream):
    """A chunk stream on the GPU runtime.

    pipelined=False (the default) returns from every feed the chunks its bytes complete,
    like the CPU backend (each feed waits for the GPU). pipelined=True submits only full
    buffers and returns chunks when their buffer is done: several buffers stay in
    flight, which is what reaches the copy bandwidth; finish() returns the rest.

    Besides feed(bytes), a caller can write into the pinned buffer directly:
    `view = stream.pinned_buffer()` (a writable uint8 array, at least 1 byte) then
    `stream.feed_pinned(k)` for the first k bytes written to it (the view is invalid
    after that). keep_data=False skips copying the chunks' bytes out of the pinned
    buffers: only the *_batch methods may then be used (ids and bounds, no bytes).

    parity=(K, M, MIN_CHUNK) adds the erasure parity stage (docs/gpu.md): every chunk of
    at least MIN_CHUNK bytes gets its M parity fragments (DESIGN §10), computed on the
    device from the bytes already there for hashing; only the parity comes back. Chunk
    objects carry copies (`Chunk.parity`); ChunkBatch.parity holds views of a host
    block, valid until the batch is released.

    device_input=D makes a stream of bytes that are on GPU D already (mosafs.checkpoint:
    tensors): `feed_device_batch(ptr, count)` copies them device to device into the
    slots (of D's lanes only), and feed_batch copies host bytes (a file header) straight
    to the device; nothing goes through the pinned buffers, and the caller takes the new
    chunks' bytes from its own memory (keep_data=False).
    """

    in_place = True

    def __init__(self, rt: GpuRuntime, spec: ChunkerSpec, *, pipelined: bool = False,
                 keep_data: bool = True, profile: Profile | None = None,
                 parity: tuple[int, int, int] | None = None,
                 device_input: int | None = None) -> None:
        if device_input is not None and keep_data:
            raise ValueError("a stream of device bytes keeps no chunk bytes: keep_data=False")
        if spec.max_size > rt.buffer_size:
            raise ValueError(f"GPU buffers of {rt.buffer_size} bytes cannot hold a "
                             f"{spec.max_size}-byte chunk")
        self._rt = rt
        self._spec = spec
        self._cdc = spec.kind == "cdc"
        self._pipelined = pipelined
        self._keep_data = keep_data
        self._profile = profile
        self._lane0 = rt.first_lane()
        self._max_uses = 3 + 2 * rt.lanes
        self._uses: deque[_Use] = deque()
        self._segs: deque[_Seg] = deque()
        self._nsel = 0          # segments selected (a prefix of _segs)
        self._open = 0          # stream offset where the open chunk starts
        self._fed = 0
        self._returned = 0
        self._nuses = 0
        self._ready: list[ChunkBatch] = []
        self._done = False
        self._expected = (4 * GEAR_STRIP) if not self._cdc else max(1, spec.avg_size // 4)
        self._parity = None if parity is None else ParityStage(rt, *parity)
        self._on_device = device_input is not None
        # The lanes this stream's slots come from: the input's GPU's, where it has some.
        own = [i for i, d in enumerate(rt.devices) if d.index == device_input]
        self._lanes = own if self._on_device and own else list(range(rt.lanes))
        self._lane0 = self._lane0 % len(self._lanes)

    @property
    def parity(self) -> tuple[int, int, int] | None:
        """(K, M, MIN_CHUNK) of the parity stage, or None."""
        stage = self._parity
        return None if stage is None else (stage.k, stage.m, stage.min_chunk)

    # -- ChunkStream --------------------------------------------------------------------

    def feed(self, piece: BytesLike) -> list[Chunk]:
        return _as_chunks(self.feed_batch(piece))

    def finish(self) -> list[Chunk]:
        return _as_chunks(self.finish_batch())

    def feed_pinned(self, count: int) -> list[Chunk]:
        return _as_chunks(self.feed_pinned_batch(count))

    # -- batch forms --------------------------------------------------------------------

    def feed_batch(self, piece: BytesLike) -> list[ChunkBatch]:
        self._check_open()
        src = byte_array(piece)
        pos = 0
        total = src.shape[0]
        while pos < total:
            use = self._current()
            take = min(total - pos, self._rt.buffer_size - use.fill)
            if self._on_device:  # host bytes in a device stream: straight to the device
                slot = use.slot
                slot.device.activate()
                cupy.cuda.runtime.memcpyAsync(slot.data_ptr + use.fill,
                                              int(src.ctypes.data) + pos, take, H2D,
                                              slot.stream.ptr)
                slot.stream.synchronize()  # the source is the caller's pageable memory
            else:
                at = HIST + use.fill
                use.slot.host[at:at + take] = src[pos:pos + take]
            pos += take
            self._added(use, take)
        return self._after_feed()

    def feed_device_batch(self, ptr: int, count: int) -> list[ChunkBatch]:
        """COUNT bytes at device pointer PTR (a stream made with device_input), copied
        into the slots on their streams: the caller keeps them unchanged until finish()."""
        self._check_open()
        if not self._on_device:
            raise ValueError("feed_device_batch needs a stream made with device_input")
        pos = 0
        while pos < count:
            use = self._current()
            take = min(count - pos, self._rt.buffer_size - use.fill)
            slot = use.slot
            slot.device.activate()
            cupy.cuda.runtime.memcpyAsync(slot.data_ptr + use.fill, ptr + pos, take,
                                          ANY_DIRECTION, slot.stream.ptr)
            pos += take
            self._added(use, take)
        return self._after_feed()

    def pinned_buffer(self) -> ByteArray:
        """The free part of the current pinned buffer, to fill and pass to feed_pinned."""
        self._check_open()
        use = self._current()
        return use.slot.host[HIST + use.fill:HIST + self._rt.buffer_size]

    def feed_pinned_batch(self, count: int) -> list[ChunkBatch]:
        self._check_open()
        if count:
            use = self._uses[-1] if self._uses else None
            if use is None or use.fill + count > self._rt.buffer_size or count < 0:
                raise ValueError("feed_pinned: count exceeds the buffer from pinned_buffer()")
            self._added(use, count)
        return self._after_feed()

    def finish_batch(self) -> list[ChunkBatch]:
        self._check_open()
        self._done = True
        if self._uses:
            self._submit(self._uses[-1], final=True)
        self._progress(drain=True)
        for use in self._uses:
            self._release(use)
        self._uses.clear()
        return self._take_ready()

    # -- internals ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._done:
            raise ValueError("this chunk stream is finished; start a new one with stream()")

    def _current(self) -> _Use:
        """The slot being filled, acquiring the next one when it is full (or none)."""
        if self._uses and self._uses[-1].fill < self._rt.buffer_size:
            return self._uses[-1]
        if len(self._uses) >= self._max_uses:
            self._progress(need_slot=True)
        prev = self._uses[-1] if self._uses else None
        lane = self._lanes[(self._lane0 + self._nuses) % len(self._lanes)]
        slot = self._rt.acquire(lane)
        base = 0 if prev is None else prev.base + prev.fill
        use = _Use(slot, base, self._nuses)
        self._nuses += 1
        if prev is not None and self._on_device:  # the window's bytes, device to device
            slot.device.activate()
            slot.stream.wait_event(prev.slot.h2d_ev)  # recorded when prev was submitted
            cupy.cuda.runtime.memcpyAsync(slot.data_ptr - HIST,
                                          prev.slot.data_ptr + prev.fill - HIST, HIST,
                                          ANY_DIRECTION, slot.stream.ptr)
        elif prev is not None:  # the gear window's bytes before this buffer
            end = HIST + prev.fill
            slot.host[:HIST] = prev.slot.host[end - HIST:end]
        self._uses.append(use)
        return use

    def _added(self, use: _Use, count: int) -> None:
        use.fill += count
        self._fed += count
        if use.fill == self._rt.buffer_size:
            self._submit(use, final=False)
            self._progress()

    def _after_feed(self) -> list[ChunkBatch]:
        if not self._pipelined:
            if self._uses:
                use = self._uses[-1]
                if use.fill > use.sub:
                    self._submit(use, final=False)
            self._progress(drain=True)
        else:
            self._progress()
        return self._take_ready()

    def _take_ready(self) -> list[ChunkBatch]:
        ready, self._ready = self._ready, []
        return ready

    def _submit(self, use: _Use, final: bool) -> None:
        """Queue copy-in and candidates for use's bytes [sub, fill)."""
        if use.open_segs:
            # One segment per slot at a time: its work buffers are reused.
            self._progress(drain=True)
        slot = use.slot
        a, b = use.sub, use.fill
        seg = _Seg(use, a, b, final)
        use.sub = b
        use.open_segs += 1
        prof = self._profile
        if b > a:
            slot.device.activate()
            stream = slot.stream
            if prof is not None:
                seg.timing = {name: cupy.cuda.Event() for name in
                              ("t0", "t1", "t2", "t3", "t4", "t5", "t6")}
                seg.timing["t0"].record(stream)
            # [a - 64, b): the window's bytes before a come along (header or this slot).
            # A device stream's bytes are there already (fed device to device).
            if not self._on_device:
                cupy.cuda.runtime.memcpyAsync(slot.data_ptr + a - HIST,
                                              slot.host_ptr + HIST + a - HIST,
                                              b - a + HIST, H2D, stream.ptr)
            slot.h2d_ev.record(stream)
            if seg.timing is not None:
                seg.timing["t1"].record(stream)
            if self._cdc:
                seg.cands = True
                out = slot.cand_dev.ptr
                launch_candidates(slot, slot.data_ptr, 0, a, b, min(HIST, use.base + (a & ~63)),
                                  self._spec, out, slot.cap)
                if seg.timing is not None:
                    seg.timing["t2"].record(stream)
                want = min(slot.cap, 2 * (b - a) // self._expected + 4096)
                host = slot.cand_host.ensure(1 + want)
                seg.host_count = want
                cupy.cuda.runtime.memcpyAsync(int(host.ctypes.data), out, 4 * (1 + want), D2H,
                                              stream.ptr)
                slot.cand_ev.record(stream)
                if seg.timing is not None:
                    seg.timing["t3"].record(stream)
        if prof is not None:
            prof.segments += 1
            prof.bytes += b - a
        self._segs.append(seg)

    def _progress(self, drain: bool = False, need_slot: bool = False) -> None:
        """Select and collect segments in order: those whose GPU work is done, all of them
        (drain), or until a slot can be released (need_slot)."""
        while True:
            moved = False
            if self._nsel < len(self._segs):
                seg = self._segs[self._nsel]
                if drain or not seg.cands or seg.use.slot.cand_ev.done:
                    self._select(seg)
                    self._nsel += 1
                    moved = True
            if self._nsel > 0:
                seg = self._segs[0]
                if drain or not seg.ends or seg.use.slot.hash_ev.done:
                    self._collect(seg)
                    self._segs.popleft()
                    self._nsel -= 1
                    moved = True
            if moved:
                continue
            if need_slot and len(self._uses) >= self._max_uses and self._segs:
                if self._nsel > 0:
                    self._collect(self._segs.popleft())
                    self._nsel -= 1
                else:
                    self._select(self._segs[0])
                    self._nsel += 1
                continue
            return

    def _candidates(self, seg: _Seg) -> U32Array:
        """The segment's candidates, sorted (its cand_ev has fired)."""
        slot = seg.use.slot
        host = slot.cand_host.array
        count = int(host[0])
        if count <= seg.host_count:
            return np.sort(host[1:1 + count])
        slot.device.activate()
        if count <= slot.cap:
            rest = np.empty(count - seg.host_count, dtype=np.uint32)
            cupy.cuda.runtime.memcpy(int(rest.ctypes.data),
                                     slot.cand_dev.ptr + 4 * (1 + seg.host_count),
                                     rest.nbytes, D2H)
            return np.sort(np.concatenate([host[1:1 + seg.host_count], rest]))
        # More candidates than the slot holds (a pathological input, e.g. a short pattern
        # whose hash hits every period): run the kernel again with room for all.
        big = cupy.empty(1 + count, dtype=cupy.uint32)
        launch_candidates(slot, slot.data_ptr, 0, seg.a, seg.b,
                          min(HIST, seg.use.base + (seg.a & ~63)), self._spec,
                          int(big.data.ptr), count)
        slot.stream.synchronize()
        return np.sort(cupy.asnumpy(big[1:]))

    def _select(self, seg: _Seg) -> None:
        use = seg.use
        slot = use.slot
        if seg.cands:
            slot.cand_ev.synchronize()
        t = time.perf_counter()
        cands = self._candidates(seg) if seg.cands else np.zeros(0, dtype=np.uint32)
        start = self._open - use.base
        cuts, new_start = select_cuts(cands, seg.b, start, self._spec, seg.final)
        if self._profile is not None:
            self._profile.selection += time.perf_counter() - t
        if not use.tail_done:
            use.tail_done = True
            if start < 0:
                self._carry_tail(use, -start)
        self._open = use.base + new_start
        if not cuts:
            return
        seg.starts = [start, *cuts[:-1]]
        seg.ends = cuts
        offs = np.array(seg.starts, dtype=np.int64) + slot.head
        lens = np.array(cuts, dtype=np.int64) - np.array(seg.starts, dtype=np.int64)
        plan = tree_plan(offs, lens)
        coded = None if self._parity is None else self._parity.plan(offs, lens)
        slot.device.activate()
        if seg.timing is not None:
            seg.timing["t4"].record(slot.stream)
        coded_meta = launch_hash(slot, slot.dev_ptr, plan,
                                 coded.meta if coded is not None and coded.count else None)
        if seg.timing is not None:
            seg.timing["t5"].record(slot.stream)  # after the digests' copy: see _account
        if self._parity is not None and coded is not None:
            seg.parity = self._parity.queue(slot, coded, coded_meta)
            if seg.timing is not None:
                seg.timing["t6"].record(slot.stream)

    def _carry_tail(self, use: _Use, count: int) -> None:
        """Copy the previous buffer's last `count` bytes (the open chunk's head) into the
        head room of use's device buffer, after that buffer's copy-in."""
        prev = self._uses[self._uses.index(use) - 1]
        slot = use.slot
        slot.device.activate()
        slot.stream.wait_event(prev.slot.h2d_ev)
        cupy.cuda.runtime.memcpyAsync(slot.data_ptr - count,
                                      prev.slot.data_ptr + prev.fill - count,
                                      count, ANY_DIRECTION, slot.stream.ptr)

    def _collect(self, seg: _Seg) -> None:
        use = seg.use
        use.open_segs -= 1
        if not seg.ends:
            return
        slot = use.slot
        slot.hash_ev.synchronize()
        nc = len(seg.ends)
        ids = slot.dig_host.array[:8 * nc].view(np.uint8).reshape(nc, 32).copy()
        starts = np.array(seg.starts, dtype=np.int64)
        ends = np.array(seg.ends, dtype=np.int64)
        data: list[bytes] | None = None
        if self._keep_data:
            data = [self._bytes(use, a, b) for a, b in zip(seg.starts, seg.ends, strict=True)]
        parity = None
        if seg.parity is not None and self._parity is not None:
            parity = self._parity.hand_over(seg.parity, nc)
            seg.parity = None
        self._ready.append(ChunkBatch(starts + use.base, ends - starts, ids, data, parity))
        self._returned += int(ends[-1] - starts[0])
        if seg.timing is not None and self._profile is not None:
            self._account(seg)
        # The first chunk of this buffer was the last use of the previous one.
        pos = self._uses.index(use)
        if pos > 0:
            for old in list(self._uses)[:pos]:
                self._release(old)
                self._uses.remove(old)

    def _bytes(self, use: _Use, a: int, b: int) -> bytes:
        host = use.slot.host
        if a >= 0:
            return host[HIST + a:HIST + b].tobytes()
        prev = self._uses[self._uses.index(use) - 1]
        end = HIST + prev.fill
        return prev.slot.host[end + a:end].tobytes() + host[HIST:HIST + b].tobytes()

    def _account(self, seg: _Seg) -> None:
        tm = seg.timing
        prof = self._profile
        assert tm is not None and prof is not None
        el = cupy.cuda.get_elapsed_time
        prof.copy_in += el(tm["t0"], tm["t1"]) / 1e3
        if seg.cands:
            prof.candidates += el(tm["t1"], tm["t2"]) / 1e3
            prof.copy_out += el(tm["t2"], tm["t3"]) / 1e3
        if seg.ends:
            # t4 -> t5 spans the metadata copy, the tree kernels and the digests' copy;
            # the copies are a few KiB.
            prof.hash += el(tm["t4"], tm["t5"]) / 1e3
            if self._parity is not None:
                prof.parity += el(tm["t5"], tm["t6"]) / 1e3

    def _release(self, use: _Use) -> None:
        if not use.released:
            use.released = True
            self._rt.release(use.slot)

    def __del__(self) -> None:
        # A stream dropped without finish(): give its slots back once their work is done.
        try:
            for use in getattr(self, "_uses", ()):
                if not use.released:
                    use.slot.stream.synchronize()
                    self._release(use)
            for seg in getattr(self, "_segs", ()):  # parity copied, never collected
                if seg.parity is not None and seg.parity[1] is not None:
                    self._rt.give_parity(seg.parity[1])
        except Exception:
            pass


def _as_chunks(batches: list[ChunkBatch]) -> list[Chunk]:
    out: list[Chunk] = []
    for batch in batches:
        out.extend(batch.chunks())  # parity copied out of the batch's block ...
        batch.release()             # ... which then serves the next segments
    return out
