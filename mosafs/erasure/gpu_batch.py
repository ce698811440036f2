"""Parity of a ragged batch on the GPU: every chunk of one buffer, of any lengths and at
any offsets, in one kernel launch (DESIGN §10; the GPU chunk stream's parity stage,
docs/gpu.md).

    plan = ragged_plan(offsets, lengths, 4, 2, min_chunk)   # numpy only, no GPU
    encoder = ragged_encoder(device, 4, 2)                   # compiled once per device
    encoder.launch(base_ptr, meta_ptr, plan, out_ptr, stream)
    plan, parity_dev = encode_ragged(buffer_dev, offsets, lengths, 4, 2)   # tests, bench

The chunks are read where they lie (a chunk stream's device buffer); only chunks of at
least MIN_CHUNK bytes are coded (shorter ones are stored as copies), and their parity is
packed back to back into one output: chunk i of the plan has M fragments of sizes[i]
bytes from parity_offsets[i]. The kernel's source is `gpu_kernels.ragged_kernel_source`
with the pool's Cauchy rows (from ISA-L, as every coder here) compiled in.

`BatchParity` is how a stream's batch hands the parity over: views of a host block,
valid until the batch gives the block back (`release()`), or copies.

Importing this module imports no CuPy and loads no library: CuPy and ISA-L come with the
first encoder.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from mosafs.erasure.gpu_kernels import (
    BLOCK,
    RAGGED_META_ARRAYS,
    RAGGED_TILE,
    ragged_kernel_name,
    ragged_kernel_source,
)
from mosafs.erasure.spec import ALIGN, Code

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
_NVRTC_OPTIONS = ("-std=c++17",)


# --- the plan (host only) --------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RaggedPlan:
    """One launch's work: the chunks coded (indices into the batch), each one's fragment
    size and where its M*S parity bytes start in the output, and the kernel's table."""

    code: Code
    chosen: I64
    """Indices (into the offsets/lengths given) of the chunks coded, ascending."""
    sizes: I64
    """S of each chosen chunk."""
    parity_offsets: I64
    """Where each chosen chunk's parity starts in the output (its M fragments follow)."""
    parity_bytes: int
    tiles: int
    """Blocks of the launch."""
    meta: I64
    """in_off, length, out_off (one per chosen chunk), then the tile prefix sums (one more):
    what the kernel reads from device memory."""

    @property
    def count(self) -> int:
        return int(self.chosen.shape[0])


def ragged_plan(offsets: Any, lengths: Any, k: int, m: int, min_chunk: int = 1) -> RaggedPlan:
    """The plan for chunks at OFFSETS (bytes from the launch's base address) of LENGTHS
    bytes under K+M: those of at least MIN_CHUNK bytes (and at least 1) are coded."""
    code = Code.of(k, m)
    offs = np.asarray(offsets, dtype=np.int64).reshape(-1)
    lens = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if offs.shape != lens.shape:
        raise ValueError(f"{offs.shape[0]} offsets for {lens.shape[0]} lengths")
    chosen = np.flatnonzero(lens >= max(1, min_chunk)).astype(np.int64)
    coded = lens[chosen]
    sizes = ALIGN * -(-coded // (ALIGN * k))  # DESIGN §10: S = 64 * ceil(L / 64K)
    parity = m * sizes
    ends = np.cumsum(parity)
    starts = ends - parity
    tile0 = np.zeros(chosen.shape[0] + 1, dtype=np.int64)
    np.cumsum(-(-sizes // RAGGED_TILE), out=tile0[1:])
    meta = np.concatenate([offs[chosen], coded, starts, tile0]).astype(np.int64)
    assert meta.shape[0] == RAGGED_META_ARRAYS * chosen.shape[0] + 1
    return RaggedPlan(code, chosen, sizes, starts, int(ends[-1]) if ends.shape[0] else 0,
                      int(tile0[-1]), meta)


# --- the parity a batch hands over -------------------------------------------------------

class BatchParity:
    """The parity of a batch of chunks, in one host block (pinned memory a stream copied
    it into): chunk i's M fragments of size[i] bytes each start at at[i] (-1: the chunk
    is below the pool's threshold and has no parity).

    Lifetime: `fragments(i)` are views of the block, valid until `release()` (or until
    this object is dropped, which releases it): the block then goes back to its pool and
    is overwritten by a later batch. `copy(i)` outlives that."""

    __slots__ = ("_give", "at", "host", "k", "m", "released", "size")

    def __init__(self, k: int, m: int, at: I64, size: I64, host: U8 | None,
                 give: Callable[[], None] | None = None) -> None:
        self.k = k
        self.m = m
        self.at = at
        self.size = size
        self.host = host
        self._give = give
        self.released = False

    @classmethod
    def of_plan(cls, plan: RaggedPlan, nchunks: int, host: U8 | None,
                give: Callable[[], None] | None = None) -> BatchParity:
        """The parity of a batch of NCHUNKS chunks that PLAN coded into HOST."""
        at = np.full(nchunks, -1, dtype=np.int64)
        size = np.zeros(nchunks, dtype=np.int64)
        at[plan.chosen] = plan.parity_offsets
        size[plan.chosen] = plan.sizes
        return cls(plan.code.k, plan.code.m, at, size, host, give)

    def __len__(self) -> int:
        return int(self.at.shape[0])

    def has(self, i: int) -> bool:
        return bool(self.at[i] >= 0)

    def fragments(self, i: int) -> tuple[memoryview, ...] | None:
        """Chunk i's M parity fragments as views of the block (None: no parity)."""
        start = self._start(i)
        if start < 0 or self.host is None:
            return None
        size = int(self.size[i])
        view = self.host.data
        return tuple(view[start + r * size:start + (r + 1) * size] for r in range(self.m))

    def copy(self, i: int) -> tuple[memoryview, ...] | None:
        """Chunk i's parity fragments copied out of the block (one bytes object, M views
        of it), valid for as long as they are referenced."""
        start = self._start(i)
        if start < 0 or self.host is None:
            return None
        size = int(self.size[i])
        whole = memoryview(self.host[start:start + self.m * size].tobytes())
        return tuple(whole[r * size:(r + 1) * size] for r in range(self.m))

    def _start(self, i: int) -> int:
        if self.released:
            raise ValueError("this batch's parity was released")
        return int(self.at[i])

    def release(self) -> None:
        """Give the host block back (idempotent): views from fragments() are then invalid."""
        self.released = True
        give, self._give, self.host = self._give, None, None
        if give is not None:
            give()

    def __del__(self) -> None:
        self.release()


# --- the launch (CuPy) ------------------------------------------------------------------

class RaggedEncoder:
    """The ragged encode kernel of one K+M compiled for one device."""

    def __init__(self, device: int, k: int, m: int) -> None:
        from mosafs.erasure.gpu import _cupy, _quiet
        from mosafs.erasure.isal import load_isal

        code = Code.of(k, m)
        matrix = load_isal().encode_matrix(code)[k:].tolist()
        cupy = _cupy()
        self.code = code
        self.device = device
        with cupy.cuda.Device(device):
            self._module = _quiet(lambda: cupy.RawModule(
                code=ragged_kernel_source(k, m, matrix), options=_NVRTC_OPTIONS))
            self._fn = _quiet(self._module.get_function, ragged_kernel_name(k, m, matrix))

    def launch(self, base_ptr: int, meta_ptr: int, plan: RaggedPlan, out_ptr: int,
               stream: Any) -> None:
        """Queue PLAN's launch on STREAM (this encoder's device current): chunks at
        base_ptr + offset, the plan's meta already at meta_ptr on the device (it is read
        when the kernel runs), parity to out_ptr (plan.parity_bytes, 16-byte aligned).
        The buffer must be readable 15 bytes past every chunk's end."""
        if plan.code != self.code:
            raise ValueError(f"plan for {plan.code}, encoder for {self.code}")
        if plan.tiles:
            self._fn((plan.tiles,), (BLOCK,),
                     (np.uint64(base_ptr), np.uint64(meta_ptr), np.int32(plan.count),
                      np.uint64(out_ptr)), stream=stream)


_ENCODERS: dict[tuple[int, int, int], RaggedEncoder] = {}
_ENCODERS_LOCK = threading.Lock()


def ragged_encoder(device: int, k: int, m: int) -> RaggedEncoder:
    """The encoder for K+M on DEVICE, compiled once per process (NVRTC; CuPy keeps the
    binary on disk)."""
    key = (device, k, m)
    with _ENCODERS_LOCK:
        found = _ENCODERS.get(key)
        if found is None:
            found = _ENCODERS[key] = RaggedEncoder(device, k, m)
        return found


def encode_ragged(buffer_dev: Any, offsets: Any, lengths: Any, k: int, m: int,
                  min_chunk: int = 1, *, stream: Any = None) -> tuple[RaggedPlan, Any]:
    """The parity of chunks at OFFSETS of LENGTHS bytes in the uint8 CuPy array
    BUFFER_DEV, queued on STREAM (default: the current one): (the plan, a CuPy array of
    plan.parity_bytes). Allocates per call: for tests and benchmarks; a stream keeps its
    buffers (GpuStream's parity stage)."""
    from mosafs.erasure.gpu import _cupy

    cupy = _cupy()
    plan = ragged_plan(offsets, lengths, k, m, min_chunk)
    device = int(buffer_dev.device.id)
    with cupy.cuda.Device(device):
        current = stream if stream is not None else cupy.cuda.get_current_stream()
        meta = cupy.asarray(plan.meta)
        parity = cupy.empty(max(plan.parity_bytes, 1), dtype=cupy.uint8)
        ragged_encoder(device, k, m).launch(int(buffer_dev.data.ptr), int(meta.data.ptr),
                                            plan, int(parity.data.ptr), current)
        current.synchronize()  # before META, which the kernel reads, is freed
    return plan, parity[:plan.parity_bytes]


__all__ = ["BatchParity", "RaggedEncoder", "RaggedPlan", "encode_ragged", "ragged_encoder",
           "ragged_plan"]
