"""The ragged-batch parity of the GPU chunk stream (mosafs.erasure.gpu_batch), checked
without a GPU:

* `ragged_plan`: which chunks are coded (the pool's threshold), their fragment sizes
  (DESIGN §10), where their parity goes, the kernel's tiles and table;
* `BatchParity`: views and copies of a batch's parity, and the block given back once;
* the ragged kernel's CUDA source compiled for the CPU (the shim of
  test_erasure_random, plus `__funnelshift_r`): chunks of any lengths at any offsets of
  one buffer, packed back to back with random bytes after each, give ISA-L's parity (the
  padding is zeros, never the next chunk's bytes);
* the write pipeline's `encode` with a stream's parity gives exactly the fragments and
  ids of the CPU coder.
"""

from __future__ import annotations

import ctypes
import random
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mosafs.client.files.pipeline import encode as _encode
from mosafs.erasure import Code, fragment_size
from mosafs.erasure.gpu_batch import BatchParity, ragged_plan
from mosafs.erasure.gpu_kernels import (
    BLOCK,
    RAGGED_TILE,
    ragged_kernel_name,
    ragged_kernel_source,
)
from mosafs.erasure.isal import IsalCoder, isal_unavailable_reason, load_isal
from mosafs.errors import ConfigError, InternalError
from tests.unit.test_erasure_random import SHIM, _compiler

ISAL_REASON = isal_unavailable_reason()
needs_isal = pytest.mark.skipif(ISAL_REASON is not None, reason=f"no ISA-L: {ISAL_REASON}")
needs_cxx = pytest.mark.skipif(_compiler() is None, reason="no C++ compiler to build the "
                               "kernel source for the CPU")


# --- the plan --------------------------------------------------------------------------

def test_plan_codes_chunks_from_the_threshold_on() -> None:
    lengths = [100, 5000, 4999, 1, 70000, 5000 * 4 + 3]
    offsets = np.cumsum([0, *lengths[:-1]]) + 7
    plan = ragged_plan(offsets, lengths, 4, 2, min_chunk=5000)
    assert plan.code == Code(4, 2)
    assert plan.chosen.tolist() == [1, 4, 5]
    assert plan.sizes.tolist() == [fragment_size(n, 4) for n in (5000, 70000, 20003)]
    parity = [2 * s for s in plan.sizes.tolist()]
    assert plan.parity_offsets.tolist() == [0, parity[0], parity[0] + parity[1]]
    assert plan.parity_bytes == sum(parity)
    assert all(o % 64 == 0 for o in plan.parity_offsets.tolist())  # aligned stores
    tiles = [-(-s // RAGGED_TILE) for s in plan.sizes.tolist()]
    assert plan.tiles == sum(tiles) and plan.count == 3
    n = plan.count
    meta = plan.meta.tolist()
    assert meta[:n] == [int(offsets[i]) for i in (1, 4, 5)]
    assert meta[n:2 * n] == [5000, 70000, 20003]
    assert meta[2 * n:3 * n] == plan.parity_offsets.tolist()
    assert meta[3 * n:] == [0, tiles[0], tiles[0] + tiles[1], sum(tiles)]


def test_plan_threshold_below_one_still_skips_empty_chunks() -> None:
    plan = ragged_plan([0, 0, 10], [0, 10, 1], 8, 2, min_chunk=0)
    assert plan.chosen.tolist() == [1, 2]
    assert plan.sizes.tolist() == [64, 64]


def test_plan_nothing_to_code() -> None:
    plan = ragged_plan([0, 100], [100, 50], 4, 2, min_chunk=1000)
    assert (plan.count, plan.parity_bytes, plan.tiles) == (0, 0, 0)
    assert plan.meta.tolist() == [0]
    empty = ragged_plan([], [], 4, 2)
    assert (empty.count, empty.parity_bytes) == (0, 0)


def test_plan_checks_its_input() -> None:
    with pytest.raises(ValueError, match="offsets"):
        ragged_plan([0, 1], [5], 4, 2)
    with pytest.raises(ConfigError):
        ragged_plan([0], [5], 0, 2)


def test_plan_many_tiles_for_a_large_chunk() -> None:
    length = 64 << 20
    plan = ragged_plan([3], [length], 4, 2)
    assert plan.sizes.tolist() == [16 << 20]
    assert plan.tiles == (16 << 20) // RAGGED_TILE


# --- what a batch hands over -----------------------------------------------------------

def test_batch_parity_views_copies_and_release() -> None:
    plan = ragged_plan([0, 300, 400], [300, 100, 1000], 2, 2, min_chunk=200)
    host = np.arange(plan.parity_bytes, dtype=np.uint64).astype(np.uint8)
    given: list[int] = []
    par = BatchParity.of_plan(plan, 3, host, lambda: given.append(1))
    assert len(par) == 3 and par.has(0) and not par.has(1) and par.has(2)
    assert par.fragments(1) is None and par.copy(1) is None
    first = par.fragments(0)
    assert first is not None and [len(f) for f in first] == [192, 192]
    assert bytes(first[1]) == host[192:384].tobytes()
    last = par.copy(2)
    assert last is not None and [len(f) for f in last] == [512, 512]
    assert bytes(last[0]) == host[384:896].tobytes()
    par.release()
    par.release()
    assert given == [1]
    with pytest.raises(ValueError, match="released"):
        par.fragments(0)
    assert bytes(last[1]) == host[896:1408].tobytes()  # a copy outlives the block


def test_dropped_batch_parity_gives_its_block_back() -> None:
    plan = ragged_plan([0], [100], 4, 2)
    given: list[int] = []
    par = BatchParity.of_plan(plan, 1, np.zeros(plan.parity_bytes, np.uint8),
                              lambda: given.append(1))
    del par
    assert given == [1]


# --- the kernel source, run on the CPU -------------------------------------------------

FUNNEL = r"""
static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> (shift & 31u));
}
"""


class HostRagged:
    """The ragged kernel for K+M compiled for the CPU: `launch` runs every block's threads
    in turn, with the arguments the GPU launch gets."""

    def __init__(self, k: int, m: int, workdir: Path) -> None:
        matrix = load_isal().encode_matrix(Code(k, m))[k:].tolist()
        name = ragged_kernel_name(k, m, matrix)
        driver = (
            'extern "C" void run(long long tiles, unsigned long long base, '
            "unsigned long long meta, int n, unsigned long long out) {\n"
            f"  gridDim = {{tiles, 1, 1}}; blockDim = {{{BLOCK}, 1, 1}};\n"
            "  for (long long x = 0; x < tiles; ++x)\n"
            f"    for (long long t = 0; t < {BLOCK}; ++t) {{\n"
            "      blockIdx = {x, 0, 0}; threadIdx = {t, 0, 0};\n"
            f"      {name}(base, meta, n, out);\n"
            "    }\n}\n")
        source = workdir / f"{name}.cpp"
        source.write_text(SHIM + FUNNEL + ragged_kernel_source(k, m, matrix) + driver)
        lib = workdir / f"{name}.so"
        done = subprocess.run([str(_compiler()), "-O1", "-w", "-shared", "-fPIC", "-o",
                               str(lib), str(source)], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        self._lib = ctypes.CDLL(str(lib))
        self._lib.run.argtypes = [ctypes.c_longlong, ctypes.c_ulonglong, ctypes.c_ulonglong,
                                  ctypes.c_int, ctypes.c_ulonglong]
        self.k, self.m = k, m

    def encode(self, buffer: np.ndarray, offsets: list[int], lengths: list[int],
               min_chunk: int) -> tuple[Any, np.ndarray]:
        plan = ragged_plan(offsets, lengths, self.k, self.m, min_chunk)
        meta = np.ascontiguousarray(plan.meta)
        out = np.full(plan.parity_bytes + 64, 0xA5, dtype=np.uint8)  # guard after the end
        self._lib.run(plan.tiles, buffer.ctypes.data, meta.ctypes.data, plan.count,
                      out.ctypes.data)
        assert (out[plan.parity_bytes:] == 0xA5).all(), "wrote past the parity"
        return plan, out[:plan.parity_bytes]


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory: pytest.TempPathFactory) -> Any:
    workdir = tmp_path_factory.mktemp("ragged_kernels")
    built: dict[tuple[int, int], HostRagged] = {}

    def get(k: int, m: int) -> HostRagged:
        if (k, m) not in built:
            built[(k, m)] = HostRagged(k, m, workdir)
        return built[(k, m)]
    return get


def packed_chunks(rng: random.Random, lengths: list[int], lead: int) -> tuple[np.ndarray,
                                                                                list[int]]:
    """Random bytes holding the chunks back to back from LEAD on (and 256 more after, as a
    stream's device buffer has), 64-byte aligned at its start: (buffer, offsets)."""
    total = lead + sum(lengths) + 256
    keeper = np.frombuffer(rng.randbytes(total + 64), dtype=np.uint8).copy()
    start = (-keeper.ctypes.data) % 64
    buffer = keeper[start:start + total]
    offsets = (lead + np.cumsum([0, *lengths[:-1]])).tolist()
    return buffer, offsets


def check_parity(coder: IsalCoder, buffer: np.ndarray, offsets: list[int],
                 lengths: list[int], plan: Any, parity: np.ndarray, k: int, m: int) -> None:
    for n, i in enumerate(plan.chosen.tolist()):
        chunk = buffer[offsets[i]:offsets[i] + lengths[i]].tobytes()
        want = coder.encode(chunk, k, m)
        start, size = int(plan.parity_offsets[n]), int(plan.sizes[n])
        got = parity[start:start + m * size].reshape(m, size)
        assert (got == want).all(), (k, m, i, lengths[i], offsets[i] % 16)


@needs_isal
@needs_cxx
@pytest.mark.parametrize(("k", "m"), [(4, 2), (8, 2), (3, 3), (1, 1), (10, 4)])
def test_kernel_source_matches_isal(host_kernels: Any, k: int, m: int) -> None:
    """Lengths at every edge (1 byte, a 16-byte group, 64K +- 1, several tiles), every
    alignment of a chunk's start; chunks below the threshold are skipped, and the bytes
    after a chunk (the next chunk's) never enter its parity."""
    coder = IsalCoder()
    kernel = host_kernels(k, m)
    rng = random.Random(k * 10 + m)
    edges = [1, 15, 16, 17, 63, 64, 65, 64 * k - 1, 64 * k, 64 * k + 1, 1000, 4097,
             RAGGED_TILE * k + 5, 2 * RAGGED_TILE * k - 64 * k + 3]
    lengths = edges + [rng.randrange(1, 3 * RAGGED_TILE) for _ in range(12)]
    rng.shuffle(lengths)
    for lead in (0, 3, 16, 61):
        buffer, offsets = packed_chunks(rng, lengths, lead)
        plan, parity = kernel.encode(buffer, offsets, lengths, 1)
        assert plan.count == len(lengths)
        check_parity(coder, buffer, offsets, lengths, plan, parity, k, m)
    threshold = 1000
    buffer, offsets = packed_chunks(rng, lengths, 5)
    plan, parity = kernel.encode(buffer, offsets, lengths, threshold)
    assert plan.chosen.tolist() == [i for i, n in enumerate(lengths) if n >= threshold]
    check_parity(coder, buffer, offsets, lengths, plan, parity, k, m)


# --- the write pipeline uses a stream's parity as it is --------------------------------

@needs_isal
@pytest.mark.parametrize(("k", "m", "length"), [(4, 2, 1 << 20), (8, 2, 300001),
                                                (4, 2, 129), (10, 4, 64 * 10 * 3)])
def test_pipeline_encode_with_stream_parity_is_the_cpu_coders(k: int, m: int,
                                                              length: int) -> None:
    """The fragments (ids and bytes) from a stream's parity equal the CPU
    coder's, bit for bit: the GPU and CPU write paths store the same fragments."""
    coder = IsalCoder()
    data = random.Random(length).randbytes(length)
    parity = tuple(memoryview(row.tobytes()) for row in coder.encode(data, k, m))
    expect = _shown(_encode(coder, data, k, m))
    assert _shown(_encode(coder, data, k, m, parity)) == expect
    assert _shown(_encode(None, data, k, m, parity)) == expect


def _shown(encoded: tuple[list[bytes], list[Any]]) -> tuple[list[bytes], list[bytes]]:
    """The fragment ids, and the fragments' bytes (views compared by content)."""
    return encoded[0], [bytes(f) for f in encoded[1]]


def test_pipeline_encode_refuses_parity_of_another_shape() -> None:
    data = bytes(1000)
    with pytest.raises(InternalError, match="ec:4\\+2"):
        _encode(None, data, 4, 2, (memoryview(bytes(256)),))
    with pytest.raises(InternalError, match="ec:4\\+2"):
        _encode(None, data, 4, 2, (memoryview(bytes(64)), memoryview(bytes(64))))
