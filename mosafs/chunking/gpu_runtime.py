"""The GPU runtime (CrystalGPU's role, DESIGN §6): devices, pinned buffers, streams.

Imported only by the GPU backend, lazily: it imports CuPy at module import.

Pieces:

* `_Device`: one visible GPU: the kernels of `gpu_kernels` compiled for it (NVRTC, cached
  on disk by CuPy) and the gear table in its memory.
* `Slot`: a pinned host buffer of `buffer_size` bytes (plus a 64-byte header that holds
  the stream's bytes before it, for the gear window) and its device twin, which has
  `buffer_size` bytes of head room in front of the data (where the open chunk's bytes
  from the previous buffer are copied, so that a chunk is contiguous on the device), a
  CUDA stream, events and small growable work buffers. Slots are pooled per device for
  the life of the process (`GpuRuntime.acquire` / `release`): pinned allocations are
  slow, so each is made once and reused.

The chunk stream that uses them is mosafs.chunking.gpu_stream; `hash_many` hashes whole
buffers (the hasher's batch path) on the same slots.
"""

from __future__ import annotations

import mmap
import threading
import warnings
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

with warnings.catch_warnings():
    # CuPy may warn at import about CUDA paths it cannot find; that says nothing about
    # whether it works (probe_gpu answers that), and the test suite turns warnings into
    # errors. Only this import is filtered, not the process.
    warnings.simplefilter("ignore")
    import cupy

from mosafs.chunking.base import BytesLike
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
from mosafs.chunking.gpu_select import TreePlan, tree_plan
from mosafs.chunking.spec import ChunkerSpec

if TYPE_CHECKING:
    pass

MiB = 1 << 20
DEFAULT_BUFFER = 64 * MiB
"""Bytes per pinned buffer: large enough that per-buffer host work (a few hundred
microseconds) hides behind its copy (~1.2 ms at 53 GB/s), and >= MAX_CHUNK."""
HIST = HISTORY_BYTES
ALIGN = 256
H2D, D2H, ANY_DIRECTION = 1, 2, 4  # cudaMemcpyKind
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


class HostArray:
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


class DevArray:
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


class Slot:
    """A pinned buffer, its device twin and the work buffers of one in-flight segment."""

    def __init__(self, device: _Device, size: int, *, pinned: bool = True) -> None:
        self.device = device
        self.size = size
        self.pinned = pinned
        self.head = _round_up(size, ALIGN)  # room for the carried tail (< MAX <= size)
        device.activate()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._host_mem = _host_bytes(HIST + size, pinned)
        self.host: ByteArray = np.frombuffer(self._host_mem, dtype=np.uint8, count=HIST + size)
        self.host_ptr = int(self.host.ctypes.data)
        self.dev = cupy.empty(self.head + size + READ_SLACK, dtype=cupy.uint8)
        self.dev_ptr = int(self.dev.data.ptr)
        self.data_ptr = self.dev_ptr + self.head
        self.cap = size // 16 + 4096  # candidate capacity: a hit every 16 bytes on average
        self.cand_dev = DevArray(np.uint32, 1 + self.cap)
        self.cand_host = HostArray(np.uint32, 4096, pinned=pinned)
        self.meta_dev = DevArray(np.int64)
        self.meta_host = HostArray(np.int64, pinned=pinned)
        self.cv = (DevArray(np.uint32), DevArray(np.uint32))
        self.dig_dev = DevArray(np.uint32)
        self.dig_host = HostArray(np.uint32, pinned=pinned)
        self.h2d_ev = cupy.cuda.Event(disable_timing=True)
        self.cand_ev = cupy.cuda.Event(disable_timing=True)
        self.hash_ev = cupy.cuda.Event(disable_timing=True)
        self._parity_out: DevArray | None = None

    def parity_out(self) -> DevArray:
        """Where the parity stage's kernel writes, before the copy to a host block; made
        on first use (a stream asked for parity): slots of other streams carry none."""
        if self._parity_out is None:
            self.device.activate()
            self._parity_out = DevArray(np.uint8)
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
        self._free: list[list[Slot]] = [[] for _ in self.devices]
        self._lane_of: dict[int, int] = {}
        # Reentrant: a batch's parity block comes back from its finalizer, which the
        # garbage collector may run in any thread, even one holding this lock.
        self._lock = threading.RLock()
        self.pinned_limit = pinned_limit
        self.slots_made = 0  # pinned, pooled
        self.pageable_made = 0  # past the limit, each dropped after use
        self._next_stream = 0
        self._parity_free: list[HostArray] = []
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

    def acquire(self, lane: int) -> Slot:
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
        slot = Slot(self.devices[lane], self.buffer_size, pinned=pinned)
        if pinned:
            with self._lock:
                self._lane_of[id(slot)] = lane
        return slot

    def release(self, slot: Slot) -> None:
        if not slot.pinned:
            return  # dropped: only pinned slots are pooled
        with self._lock:
            self._free[self._lane_of[id(slot)]].append(slot)

    def take_parity(self, nbytes: int, pinned: bool) -> HostArray:
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
        return HostArray(np.uint8, size, pinned=pinned)

    def give_parity(self, block: HostArray) -> None:
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


def launch_candidates(slot: Slot, base_ptr: int, pos_base: int, a: int, b: int, hist: int,
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


def launch_hash(slot: Slot, base_ptr: int, plan: TreePlan,
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
    cupy.cuda.runtime.memcpyAsync(mptr, slot.meta_host.ptr, 8 * total, H2D, stream.ptr)
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
    cupy.cuda.runtime.memcpyAsync(slot.dig_host.ptr, dptr, 32 * nc, D2H, stream.ptr)
    slot.hash_ev.record(stream)
    return 0 if extra is None else mptr + 8 * words


def digests(slot: Slot, nc: int) -> list[bytes]:
    raw = slot.dig_host.array[:8 * nc].tobytes()
    return [raw[32 * i:32 * i + 32] for i in range(nc)]


def byte_array(piece: BytesLike) -> ByteArray:
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
    views = [byte_array(b) for b in buffers]
    out: list[bytes] = [b""] * len(views)
    size = rt.buffer_size
    inflight: deque[tuple[Slot, list[int]]] = deque()
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
            cupy.cuda.runtime.memcpyAsync(slot.data_ptr, slot.host_ptr + HIST, pos, H2D,
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
