"""The GPU runtime (CrystalGPU's role, DESIGN §6): devices, pinned buffers, streams.

Imported only by the GPU backend, lazily: it imports CuPy at module import.

Pieces:

* `_Device`: one visible GPU: the kernels of `gpu_kernels` compiled for it (NVRTC, cached
  on disk by CuPy) and the gear table in its memory.
* `_Slot`: a pinned host buffer of `buffer_size` bytes (plus a 64-byte header that holds
  the stream's bytes before it, for the gear window) and its device twin, which has
  `buffer_size` bytes of head room in front of the data (where the open chunk's bytes
  from the previous buffer are copied, so that a chunk is contiguous on the device), a
  CUDA stream, events and small growable work buffers. Slots are pooled per device for
  the life of the process (`GpuRuntime.acquire` / `release`): pinned allocations are
  slow, so each is made once and reused.
* `GpuStream`: a `ChunkStream` that fills slots in order, round-robin over the devices,
  and runs per filled range (a "segment"): copy in (pinned -> device), candidate kernel,
  candidates out, then on the host the selection of cut points, then the tail copy
  (device to device, peer copy across GPUs), BLAKE3 kernels and the digests out. Each
  slot has its own CUDA stream, so the copy of one buffer overlaps the kernels of the
  previous one; the host only waits when it needs a result or a free slot. With
  `parity=(K, M, MIN_CHUNK)` each segment's chunks also get their erasure parity after
  the hash kernels (`_ParityStage`, the kernel in mosafs.erasure.gpu_batch), copied back
  alone into host blocks pooled by the runtime (docs/gpu.md).

Tail carry: a full buffer holds `buffer_size >= MAX` bytes, so a chunk spans at most two
buffers: the open chunk left when buffer k is selected started in buffer k (or at its
start) and is copied into the head room of buffer k+1 before k+1's chunks are hashed.
Results never depend on how the stream was split into feed() pieces.
"""

from __future__ import annotations

import mmap
import threading
import time
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

with warnings.catch_warnings():
    # CuPy may warn at import about CUDA paths it cannot find; that says nothing about
    # whether it works (probe_gpu answers that), and the test suite turns warnings into
    # errors. Only this import is filtered, not the process.
    warnings.simplefilter("ignore")
    import cupy

from mosafs.chunking.base import BytesLike, Chunk, ChunkStream
from mosafs.chunking.gear import GEAR
from mosafs.chunking.gpu_kernels import (
    GEAR_BLOCK,
    GEAR_BLOCKS_PER_SM,
    GEAR_STRIP,
    HISTORY_BYTES,
    LEAF_GROUP,
    READ_SLACK,
    SOURCE,
)
from mosafs.chunking.gpu_select import TreePlan, select_cuts, tree_plan
from mosafs.chunking.spec import ChunkerSpec

if TYPE_CHECKING:
    from mosafs.erasure.gpu_batch import BatchParity, RaggedEncoder, RaggedPlan

MiB = 1 << 20
DEFAULT_BUFFER = 64 * MiB
"""Bytes per pinned buffer: large enough that per-buffer host work (a few hundred
microseconds) hides behind its copy (~1.2 ms at 53 GB/s), and >= MAX_CHUNK."""
HIST = HISTORY_BYTES
_ALIGN = 256
_H2D, _D2H, _DEFAULT = 1, 2, 4  # cudaMemcpyKind
_NVRTC_OPTIONS = ("-std=c++17",)

ByteArray = npt.NDArray[np.uint8]
U32Array = npt.NDArray[np.uint32]
I64Array = npt.NDArray[np.int64]


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _quiet(fn: Any, *args: Any) -> Any:
    """Run a CuPy call that may compile or load code with CuPy's warnings filtered (the
    test suite makes warnings errors; a compiler notice is not one)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


class _PinnedCount:
    """Pinned host bytes this process allocated and holds (a pool's figure, and what the
    mount reports): page-locked memory is resident, so it is part of the RSS."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes = 0

    def alloc(self, nbytes: int) -> Any:
        # cudaHostAlloc itself, not CuPy's pinned pool: the pool keeps freed blocks, so
        # neither this count nor the process's RSS would ever come down.
        mem = cupy.cuda.PinnedMemoryPointer(cupy.cuda.PinnedMemory(nbytes), 0)
        with self._lock:
            self.bytes += nbytes
        return mem

    def freed(self, nbytes: int) -> None:
        """The holder of NBYTES from alloc() dropped them (CuPy frees with the last view)."""
        with self._lock:
            self.bytes -= nbytes


PINNED = _PinnedCount()


def _host_bytes(nbytes: int, pinned: bool) -> Any:
    """NBYTES of host memory: page-locked (fast asynchronous copies) or, for a slot past
    the pinned pool's limit, ordinary pageable memory (copies stage through the driver and
    wait for the host, but work the same). Pageable buffers are mapped on their own, not
    taken from malloc's heap: such a slot is dropped after use, and its tens of MiB go
    back to the system at once instead of staying in the heap (mosafs.memtune keeps
    blocks below 32 MiB there)."""
    return PINNED.alloc(nbytes) if pinned else mmap.mmap(-1, nbytes)


class _HostArray:
    """A growable host array of one dtype (grows by doubling; never shrinks), pinned unless
    its slot is a pageable one."""

    def __init__(self, dtype: Any, count: int = 1, *, pinned: bool = True) -> None:
        self.dtype = np.dtype(dtype)
        self.pinned = pinned
        self.array: Any = None
        self._mem: Any = None
        self.ensure(count)

    def ensure(self, count: int) -> Any:
        if self.array is None or self.array.shape[0] < count:
            size = max(count, 2 * (0 if self.array is None else self.array.shape[0]), 1024)
            self._drop()
            self._mem = _host_bytes(size * self.dtype.itemsize, self.pinned)
            self.array = np.frombuffer(self._mem, dtype=self.dtype, count=size)
        return self.array

    def _drop(self) -> None:
        if self.array is not None and self.pinned:
            PINNED.freed(self.array.nbytes)
        self.array = self._mem = None

    def __del__(self) -> None:
        self._drop()

    @property
    def ptr(self) -> int:
        return int(self.array.ctypes.data)


class _DevArray:
    """A growable device array (allocate on the owning device's context)."""

    def __init__(self, dtype: Any, count: int = 1) -> None:
        self.dtype = np.dtype(dtype)
        self.array: Any = None
        self.ensure(count)

    def ensure(self, count: int) -> int:
        if self.array is None or self.array.shape[0] < count:
            size = max(count, 2 * (0 if self.array is None else self.array.shape[0]), 1024)
            self.array = cupy.empty(size, dtype=self.dtype)
        return int(self.array.data.ptr)

    @property
    def ptr(self) -> int:
        return int(self.array.data.ptr)


class _Device:
    """One GPU: its kernels and gear table."""

    def __init__(self, index: int) -> None:
        self.index = index
        with cupy.cuda.Device(index):
            props = cupy.cuda.runtime.getDeviceProperties(index)
            name = props["name"]
            self.name = name.decode() if isinstance(name, bytes) else str(name)
            self.sms = int(props.get("multiProcessorCount", 0)) or 132
            self.gear = cupy.asarray(GEAR)
            module = _quiet(lambda: cupy.RawModule(code=SOURCE, options=_NVRTC_OPTIONS))
            self.k_gear = _quiet(module.get_function, "gear_candidates")
            self.k_leaves = _quiet(module.get_function, "b3_leaves")
            self.k_parents = _quiet(module.get_function, "b3_parents")

    def activate(self) -> None:
        cupy.cuda.runtime.setDevice(self.index)


class _Slot:
    """A pinned buffer, its device twin and the work buffers of one in-flight segment."""

    def __init__(self, device: _Device, size: int, *, pinned: bool = True) -> None:
        self.device = device
        self.size = size
        self.pinned = pinned
        self.head = _round_up(size, _ALIGN)  # room for the carried tail (< MAX <= size)
        device.activate()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._host_mem = _host_bytes(HIST + size, pinned)
        self.host: ByteArray = np.frombuffer(self._host_mem, dtype=np.uint8, count=HIST + size)
        self.host_ptr = int(self.host.ctypes.data)
        self.dev = cupy.empty(self.head + size + READ_SLACK, dtype=cupy.uint8)
        self.dev_ptr = int(self.dev.data.ptr)
        self.data_ptr = self.dev_ptr + self.head
        self.cap = size // 16 + 4096  # candidate capacity: a hit every 16 bytes on average
        self.cand_dev = _DevArray(np.uint32, 1 + self.cap)
        self.cand_host = _HostArray(np.uint32, 4096, pinned=pinned)
        self.meta_dev = _DevArray(np.int64)
        self.meta_host = _HostArray(np.int64, pinned=pinned)
        self.cv = (_DevArray(np.uint32), _DevArray(np.uint32))
        self.dig_dev = _DevArray(np.uint32)
        self.dig_host = _HostArray(np.uint32, pinned=pinned)
        self.h2d_ev = cupy.cuda.Event(disable_timing=True)
        self.cand_ev = cupy.cuda.Event(disable_timing=True)
        self.hash_ev = cupy.cuda.Event(disable_timing=True)
        self._parity_out: _DevArray | None = None

    def parity_out(self) -> _DevArray:
        """Where the parity stage's kernel writes, before the copy to a host block; made
        on first use (a stream asked for parity): slots of other streams carry none."""
        if self._parity_out is None:
            self.device.activate()
            self._parity_out = _DevArray(np.uint8)
        return self._parity_out

    @property
    def host_nbytes(self) -> int:
        return int(self.host.nbytes)

    def __del__(self) -> None:
        if self.pinned and getattr(self, "host", None) is not None:
            PINNED.freed(self.host_nbytes)


class GpuRuntime:
    """Devices and a per-device pool of slots of one buffer size (thread-safe).

    PINNED_LIMIT bounds the pinned bytes of the pooled slots (None: no bound). A slot asked
    for when the pool is at its bound is made of pageable memory instead, held by the
    stream that asked until it releases it, then dropped: a stream never waits for
    another to give a slot back (a writer could hold a file open, and its slots, while it
    writes another), and the pinned memory stays within what was configured."""

    def __init__(self, buffer_size: int = DEFAULT_BUFFER,
                 devices: Sequence[int] | None = None, *,
                 pinned_limit: int | None = None) -> None:
        if pinned_limit is not None and pinned_limit < 0:
            raise ValueError("the pinned pool's limit must be >= 0 bytes")
        if buffer_size < 4096:
            raise ValueError("GPU buffer size must be at least 4096 bytes")
        self.buffer_size = _round_up(buffer_size, 4096)
        if self.buffer_size >= 1 << 31:
            raise ValueError("GPU buffer size must be below 2 GiB")
        count = int(cupy.cuda.runtime.getDeviceCount())
        ids = list(range(count)) if devices is None else list(devices)
        if not ids or any(not 0 <= i < count for i in ids):
            raise ValueError(f"GPU devices {ids} not all visible ({count} visible)")
        built: dict[int, _Device] = {}
        for i in ids:
            if i not in built:
                built[i] = _Device(i)
        self.devices = [built[i] for i in ids]  # a repeated id: one GPU, two queues
        _enable_peer_access(sorted(built))
        self._free: list[list[_Slot]] = [[] for _ in self.devices]
        self._lane_of: dict[int, int] = {}
        # Reentrant: a batch's parity block comes back from its finalizer, which the
        # garbage collector may run in any thread, even one holding this lock.
        self._lock = threading.RLock()
        self.pinned_limit = pinned_limit
        self.slots_made = 0  # pinned, pooled
        self.pageable_made = 0  # past the limit, each dropped after use
        self._next_stream = 0
        self._parity_free: list[_HostArray] = []
        self.parity_bytes = 0  # pinned parity blocks made (pooled or lent to batches)

    @property
    def lanes(self) -> int:
        return len(self.devices)

    @property
    def slot_bytes(self) -> int:
        """Host bytes of one slot's buffer (the gear window's history, then the data)."""
        return HIST + self.buffer_size

    @property
    def pooled_bytes(self) -> int:
        return self.slots_made * self.slot_bytes

    def acquire(self, lane: int) -> _Slot:
        with self._lock:
            free = self._free[lane]
            if free:
                return free.pop()
            limit = self.pinned_limit
            pinned = limit is None or (self.pooled_bytes + self.parity_bytes
                                       + self.slot_bytes <= limit)
            if pinned:
                self.slots_made += 1
            else:
                self.pageable_made += 1
        slot = _Slot(self.devices[lane], self.buffer_size, pinned=pinned)
        if pinned:
            with self._lock:
                self._lane_of[id(slot)] = lane
        return slot

    def release(self, slot: _Slot) -> None:
        if not slot.pinned:
            return  # dropped: only pinned slots are pooled
        with self._lock:
            self._free[self._lane_of[id(slot)]].append(slot)

    def take_parity(self, nbytes: int, pinned: bool) -> _HostArray:
        """A host block of at least NBYTES for one segment's parity (a stream's parity
        stage copies it there; the batch holds it until released): a pooled one, else a
        new one, pinned when PINNED (the slot is) and the pool's bound leaves room,
        pageable otherwise (then dropped after use)."""
        with self._lock:
            for i, block in enumerate(self._parity_free):
                if block.array.shape[0] >= nbytes:
                    return self._parity_free.pop(i)
            # Sizes vary a little per buffer: rounding up lets a block serve the next ones.
            size = _round_up(max(nbytes, 1), max(_PARITY_ROUND, self.buffer_size // 16))
            if pinned and self._parity_free:  # all too small: make room for a larger one
                self.parity_bytes -= self._parity_free.pop().array.nbytes
            limit = self.pinned_limit
            pinned = pinned and (limit is None or self.pooled_bytes + self.parity_bytes
                                 + size <= limit)
            if pinned:
                self.parity_bytes += size
        return _HostArray(np.uint8, size, pinned=pinned)

    def give_parity(self, block: _HostArray) -> None:
        """BLOCK from take_parity is free again (its batch was released)."""
        if block.pinned:
            with self._lock:
                self._parity_free.append(block)

    def first_lane(self) -> int:
        """Spread streams over the devices: each starts on the next lane."""
        with self._lock:
            lane = self._next_stream % len(self.devices)
            self._next_stream += 1
            return lane

    def device_names(self) -> list[str]:
        return [d.name for d in self.devices]


def _enable_peer_access(ids: list[int]) -> None:
    for a in ids:
        for b in ids:
            if a == b:
                continue
            try:
                if cupy.cuda.runtime.deviceCanAccessPeer(a, b):
                    with cupy.cuda.Device(a):
                        cupy.cuda.runtime.deviceEnablePeerAccess(b)
            except Exception:  # already enabled, or not possible: copies then go via host
                pass


_PARITY_ROUND = 64 << 10
"""Parity blocks are a multiple of this, and of 1/16 of a buffer, in size."""


_RUNTIMES: dict[tuple[int, int | None], GpuRuntime] = {}
_RUNTIMES_LOCK = threading.Lock()


def runtime(buffer_size: int = DEFAULT_BUFFER, pinned_limit: int | None = None) -> GpuRuntime:
    """The process-wide runtime for this buffer size and pinned bound (every visible GPU)."""
    key = (_round_up(buffer_size, 4096), pinned_limit)
    with _RUNTIMES_LOCK:
        found = _RUNTIMES.get(key)
        if found is None:
            found = _RUNTIMES[key] = GpuRuntime(key[0], pinned_limit=pinned_limit)
        return found


POOL_BUFFERS = 8
"""Buffers a bounded pool is cut into: a stream keeps up to 3 + 2 per GPU in flight, so
one writer runs at full depth and a second beside it, before slots turn pageable."""


def pool_buffer_size(spec: ChunkerSpec, pinned_limit: int) -> int:
    """The buffer size for a pool of PINNED_LIMIT bytes: an eighth of it, at most the
    default 64 MiB and at least one MAX-sized chunk of spec (a chunk spans <= 2 buffers)."""
    eighth = (pinned_limit // POOL_BUFFERS - HIST) // 4096 * 4096
    return max(_round_up(spec.max_size, 4096), min(DEFAULT_BUFFER, eighth))


def runtime_for(spec: ChunkerSpec, buffer_size: int = DEFAULT_BUFFER,
                pinned_limit: int | None = None) -> GpuRuntime:
    """A runtime whose buffers hold at least one MAX-sized chunk of spec; with
    PINNED_LIMIT, buffers sized by pool_buffer_size and the pool bounded by it."""
    if pinned_limit is not None:
        buffer_size = pool_buffer_size(spec, pinned_limit)
    return runtime(max(buffer_size, _round_up(spec.max_size, 4096)), pinned_limit)


# --- kernel launches ------------------------------------------------------------------

def _u64(x: int) -> np.uint64:
    return np.uint64(x)


def launch_candidates(slot: _Slot, base_ptr: int, pos_base: int, a: int, b: int, hist: int,
                      spec: ChunkerSpec, out_ptr: int, cap: int) -> None:
    """Queue the gear candidate kernel on the slot's stream for positions [a, b) of the
    buffer at device address base_ptr (position 0, 256-byte aligned), reported as
    pos_base + position; `hist` bytes of the stream are valid before position a & ~63.
    out_ptr[0] counts, out_ptr[1:] receives up to cap candidates."""
    dev = slot.device
    cupy.cuda.runtime.memsetAsync(out_ptr, 0, 4, slot.stream.ptr)
    a0 = a & ~63  # the kernel's loads need 16-byte alignment; [a0, a) is only rolled
    n = b - a0
    threads = -(-n // GEAR_STRIP)
    grid = max(1, min(-(-threads // GEAR_BLOCK), dev.sms * GEAR_BLOCKS_PER_SM))
    dev.k_gear((grid,), (GEAR_BLOCK,),
               (_u64(base_ptr + a0), np.int64(n), np.int64(a - a0), np.int32(hist),
                np.int64(pos_base + a0),
                dev.gear, np.uint32(spec.mask_l >> 32), np.uint32(spec.mask_s >> 32),
                _u64(out_ptr + 4), np.uint32(cap), _u64(out_ptr)),
               stream=slot.stream)


def launch_hash(slot: _Slot, base_ptr: int, plan: TreePlan,
                extra: I64Array | None = None) -> int:
    """Queue BLAKE3 of plan's chunks (offsets from base_ptr) on the slot's stream; the
    digests land in slot.dig_host[:8 * nchunks] when slot.hash_ev (recorded here) fires.

    EXTRA: more int64 words for later kernels on the stream (the parity stage's plan),
    copied to the device together with the tree plan; returns their device address (0
    without). One small copy, not two: a small copy waits in the copy engine's queue
    behind the next buffers' 64 MiB copies in, so each one costs a segment latency."""
    nc = plan.nchunks
    dev = slot.device
    stream = slot.stream
    meta = plan.meta
    words = meta.shape[0]
    total = words + (0 if extra is None else extra.shape[0])
    host = slot.meta_host.ensure(total)
    host[:words] = meta
    if extra is not None:
        host[words:total] = extra
    mptr = slot.meta_dev.ensure(total)
    cupy.cuda.runtime.memcpyAsync(mptr, slot.meta_host.ptr, 8 * total, _H2D, stream.ptr)
    cv = (slot.cv[0].ensure(max(8, plan.cv_words[0])), slot.cv[1].ensure(max(8, plan.cv_words[1])))
    dptr = slot.dig_dev.ensure(8 * nc)
    per_block = LEAF_GROUP >> plan.leaf_log
    dev.k_leaves((-(-plan.ngroups0 // per_block),), (LEAF_GROUP,),
                 (_u64(base_ptr), _u64(mptr), _u64(mptr + 8 * nc), _u64(mptr + 16 * nc),
                  np.int32(nc), np.int64(plan.ngroups0), np.int32(plan.leaf_log),
                  _u64(cv[0]), _u64(dptr)),
                 stream=stream)
    for k, level in enumerate(plan.levels, 1):
        dev.k_parents((level.ngroups,), (LEAF_GROUP,),
                      (_u64(cv[(k - 1) % 2]), _u64(mptr + 8 * level.cid),
                       _u64(mptr + 8 * level.in0), _u64(mptr + 8 * level.cnt),
                       _u64(mptr + 8 * level.grp0), np.int32(level.nactive), _u64(cv[k % 2]),
                       _u64(dptr)),
                      stream=stream)
    slot.dig_host.ensure(8 * nc)
    cupy.cuda.runtime.memcpyAsync(slot.dig_host.ptr, dptr, 32 * nc, _D2H, stream.ptr)
    slot.hash_ev.record(stream)
    return 0 if extra is None else mptr + 8 * words


def digests(slot: _Slot, nc: int) -> list[bytes]:
    raw = slot.dig_host.array[:8 * nc].tobytes()
    return [raw[32 * i:32 * i + 32] for i in range(nc)]


# --- streams --------------------------------------------------------------------------

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

    slot: _Slot
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
    parity: tuple[RaggedPlan, _HostArray | None] | None = None


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
        self._parity = None if parity is None else _ParityStage(rt, *parity)
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

    @property
    def fed(self) -> int:
        return self._fed

    @property
    def pending(self) -> int:
        return self._fed - self._returned

    def feed(self, piece: BytesLike) -> list[Chunk]:
        return _as_chunks(self.feed_batch(piece))

    def finish(self) -> list[Chunk]:
        return _as_chunks(self.finish_batch())

    def feed_pinned(self, count: int) -> list[Chunk]:
        return _as_chunks(self.feed_pinned_batch(count))

    # -- batch forms --------------------------------------------------------------------

    def feed_batch(self, piece: BytesLike) -> list[ChunkBatch]:
        self._check_open()
        src = _byte_array(piece)
        pos = 0
        total = src.shape[0]
        while pos < total:
            use = self._current()
            take = min(total - pos, self._rt.buffer_size - use.fill)
            if self._on_device:  # host bytes in a device stream: straight to the device
                slot = use.slot
                slot.device.activate()
                cupy.cuda.runtime.memcpyAsync(slot.data_ptr + use.fill,
                                              int(src.ctypes.data) + pos, take, _H2D,
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
                                          _DEFAULT, slot.stream.ptr)
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
                                          _DEFAULT, slot.stream.ptr)
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
                                              b - a + HIST, _H2D, stream.ptr)
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
                cupy.cuda.runtime.memcpyAsync(int(host.ctypes.data), out, 4 * (1 + want), _D2H,
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
                                     rest.nbytes, _D2H)
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
                                      count, _DEFAULT, slot.stream.ptr)

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


class _ParityStage:
    """A stream's erasure parity: per segment, after the hash kernels on the slot's CUDA
    stream (the launch plan came in with theirs), one ragged kernel launch over the
    segment's chunks of at least MIN_CHUNK bytes (read from the slot's device buffer,
    where the hash kernels read them), and one copy of their packed parity into a host
    block from the runtime's pool. The slot's hash event is recorded after that copy,
    so a segment is collected when its digests and its parity are both on the host: no
    extra wait."""

    def __init__(self, rt: GpuRuntime, k: int, m: int, min_chunk: int) -> None:
        from mosafs.erasure.spec import Code

        Code.of(k, m)  # a bad K or M is the pool's ConfigError, before any kernel builds
        self.k, self.m, self.min_chunk = k, m, max(1, int(min_chunk))
        self._rt = rt
        # Built at the first segment, in the thread that feeds: a stream is often made on
        # the client's event loop, which must not wait for a compiler.
        self._encoders: dict[int, RaggedEncoder] = {}

    def _encoder(self, device: int) -> RaggedEncoder:
        found = self._encoders.get(device)
        if found is None:
            from mosafs.erasure.gpu_batch import ragged_encoder

            found = self._encoders[device] = ragged_encoder(device, self.k, self.m)
        return found

    def plan(self, offs: I64Array, lens: I64Array) -> RaggedPlan:
        """The launch plan of a segment's chunks at OFFS (from slot.dev_ptr) of LENS bytes;
        its meta travels with the hash stage's (launch_hash's EXTRA)."""
        from mosafs.erasure.gpu_batch import ragged_plan

        return ragged_plan(offs, lens, self.k, self.m, self.min_chunk)

    def queue(self, slot: _Slot, plan: RaggedPlan,
              meta_ptr: int) -> tuple[RaggedPlan, _HostArray | None]:
        """Queue PLAN's kernel (its meta at META_PTR on the device, copied in by
        launch_hash) and the parity's copy to a host block on the slot's stream (its device
        current); (the plan, the host block the parity lands in)."""
        if not plan.count:
            return plan, None
        stream = slot.stream
        out_ptr = slot.parity_out().ensure(plan.parity_bytes)
        self._encoder(slot.device.index).launch(slot.dev_ptr, meta_ptr, plan, out_ptr, stream)
        block = self._rt.take_parity(plan.parity_bytes, slot.pinned)
        cupy.cuda.runtime.memcpyAsync(block.ptr, out_ptr, plan.parity_bytes, _D2H,
                                      stream.ptr)
        slot.hash_ev.record(stream)
        return plan, block

    def hand_over(self, queued: tuple[RaggedPlan, _HostArray | None], nchunks: int
                  ) -> BatchParity:
        """The collected segment's parity for its batch of NCHUNKS chunks: the batch owns
        the host block until it is released."""
        from mosafs.erasure.gpu_batch import BatchParity

        plan, block = queued
        if block is None:
            return BatchParity.of_plan(plan, nchunks, None)
        rt = self._rt
        return BatchParity.of_plan(plan, nchunks, block.array[:plan.parity_bytes],
                                   lambda: rt.give_parity(block))


def _byte_array(piece: BytesLike) -> ByteArray:
    view = memoryview(piece)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return np.frombuffer(view, dtype=np.uint8)


# --- hashing many buffers -------------------------------------------------------------

def hash_many(rt: GpuRuntime, buffers: Sequence[BytesLike]) -> list[bytes]:
    """BLAKE3-256 of each buffer: packed into pinned buffers, one batch per buffer-full,
    batches round-robin over the devices, two in flight per device."""
    views = [_byte_array(b) for b in buffers]
    out: list[bytes] = [b""] * len(views)
    size = rt.buffer_size
    inflight: deque[tuple[_Slot, list[int]]] = deque()
    lane = rt.first_lane()

    def drain_one() -> None:
        slot, idx = inflight.popleft()
        slot.hash_ev.synchronize()
        for i, digest in zip(idx, digests(slot, len(idx)), strict=True):
            out[i] = digest
        rt.release(slot)

    batch: list[int] = []
    used = 0

    def flush() -> None:
        nonlocal batch, used, lane
        if not batch:
            return
        if len(inflight) >= 2 * rt.lanes:
            drain_one()
        slot = rt.acquire(lane % rt.lanes)
        lane += 1
        offs = np.zeros(len(batch), dtype=np.int64)
        lens = np.zeros(len(batch), dtype=np.int64)
        pos = 0
        for k, i in enumerate(batch):
            n = views[i].shape[0]
            slot.host[HIST + pos:HIST + pos + n] = views[i]
            offs[k] = pos
            lens[k] = n
            pos += n
        slot.device.activate()
        if pos:
            cupy.cuda.runtime.memcpyAsync(slot.data_ptr, slot.host_ptr + HIST, pos, _H2D,
                                          slot.stream.ptr)
        launch_hash(slot, slot.data_ptr, tree_plan(offs, lens))
        inflight.append((slot, batch))
        batch, used = [], 0

    for i, view in enumerate(views):
        n = view.shape[0]
        if n > size:
            out[i] = _hash_big(rt, view)
            continue
        if used + n > size:
            flush()
        batch.append(i)
        used += n
    flush()
    while inflight:
        drain_one()
    return out


def _hash_big(rt: GpuRuntime, view: ByteArray) -> bytes:
    """One buffer larger than the pinned buffers: copied to the device as it is."""
    slot = rt.acquire(0)
    try:
        slot.device.activate()
        n = view.shape[0]
        dev = cupy.empty(n + READ_SLACK, dtype=cupy.uint8)
        dev[:n].set(view, stream=slot.stream)
        launch_hash(slot, int(dev.data.ptr),
                    tree_plan(np.zeros(1, dtype=np.int64), np.array([n], dtype=np.int64)))
        slot.hash_ev.synchronize()
        return digests(slot, 1)[0]
    finally:
        rt.release(slot)


def visible_devices() -> list[str]:
    count = int(cupy.cuda.runtime.getDeviceCount())
    names = []
    for i in range(count):
        name = cupy.cuda.runtime.getDeviceProperties(i)["name"]
        names.append(name.decode() if isinstance(name, bytes) else str(name))
    return names
