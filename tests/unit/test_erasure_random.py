"""Erasure coding on random inputs (DESIGN §10), against references written from the
definition alone, plus the GPU kernel's arithmetic checked on the CPU.

* `gf_mul_table` / `cauchy` / `encode_reference`: GF(2^8) under 0x11D from its exponent
  table, the Cauchy rows inverse((K+i) xor j), parity by table look-ups: nothing shared
  with ISA-L. The ISA-L coder must agree for every K 1..16 with every M 1..4, and decode
  and rebuild from every erasure pattern of up to M fragments (all patterns for some
  shapes, a sample for the largest).
* `bitsliced_multiply`: the GPU kernel's algorithm (xtime on four packed bytes, XOR of
  the powers a coefficient's bits select) in NumPy; it must equal ISA-L on encode and
  decode matrices.
* The kernel's CUDA source itself, compiled for the CPU with a C++ compiler and a small
  shim (blockIdx & co. as globals, each thread run in turn): baked and parameter
  coefficients, tails, unaligned bases, strided batches, limited output room.
* Bad input: K/M out of range, wrong fragment sizes, too few fragments, bad indices.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import random
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from mosafs.erasure import MAX_K, MAX_M, Code, fragment_size, make_coder
from mosafs.erasure.gpu_kernels import (
    BLOCK,
    GROUP_BYTES,
    kernel_name,
    kernel_params,
    kernel_source,
    pack_coefficients,
)
from mosafs.erasure.isal import (
    INSTALL_HINT,
    IsaL,
    IsalCoder,
    column_ranges,
    decode_plan,
    load_isal,
)
from mosafs.errors import ConfigError, InvalidArgument

U8 = npt.NDArray[np.uint8]
LENGTHS = (1, 2, 63, 64, 65, 127, 1000, 4097)


@pytest.fixture(scope="module")
def isal() -> IsaL:
    return load_isal()


@pytest.fixture(scope="module")
def coder(isal: IsaL) -> IsalCoder:
    return IsalCoder(isal)


# --- references from the definition ----------------------------------------------------

@functools.cache
def gf_mul_table() -> U8:
    """The 256x256 product table of GF(2^8) under 0x11D, from the powers of the
    generator 2 (kept twice over so that sums of logs need no modulo)."""
    exp = np.zeros(512, dtype=np.int64)
    log = np.zeros(256, dtype=np.int64)
    x = 1
    for i in range(255):
        exp[i] = exp[i + 255] = x
        log[x] = i
        x <<= 1
        if x & 0x100:
            x ^= 0x11D
    a = np.arange(256)
    mul = exp[log[a][:, None] + log[a][None, :]]
    mul[0, :] = mul[:, 0] = 0
    return mul.astype(np.uint8)


def gf_inv(a: int) -> int:
    mul = gf_mul_table()
    return int(np.flatnonzero(mul[a] == 1)[0])


def cauchy(k: int, m: int) -> U8:
    """Parity rows of DESIGN §10: C[i][j] = inverse((K + i) xor j)."""
    return np.array([[gf_inv((k + i) ^ j) for j in range(k)] for i in range(m)], dtype=np.uint8)


def padded(chunk: bytes, k: int) -> U8:
    size = fragment_size(len(chunk), k)
    out = np.zeros(k * size, dtype=np.uint8)
    out[:len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
    return out.reshape(k, size)


def table_multiply(matrix: U8, inputs: U8) -> U8:
    """R outputs = MATRIX (RxK) times INPUTS (K rows) by product-table look-ups."""
    mul = gf_mul_table()
    out = np.zeros((matrix.shape[0], inputs.shape[1]), dtype=np.uint8)
    for r, j in itertools.product(range(matrix.shape[0]), range(matrix.shape[1])):
        out[r] ^= mul[matrix[r, j]][inputs[j]]
    return out


def encode_reference(chunk: bytes, k: int, m: int) -> U8:
    return table_multiply(cauchy(k, m), padded(chunk, k))


def xtime(x: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    """Four packed GF(2^8) elements times 2 at once (the kernel's XT)."""
    return (((x & 0x7F7F7F7F) << 1) ^ (((x >> 7) & 0x01010101) * 0x1D)).astype(np.uint32)


def bitsliced_multiply(matrix: U8, inputs: U8) -> U8:
    """The GPU kernel's arithmetic: c * x = XOR of x * 2^b over the bits b set in c."""
    words = np.ascontiguousarray(inputs).view("<u4")
    acc = np.zeros((matrix.shape[0], words.shape[1]), dtype=np.uint32)
    for j in range(matrix.shape[1]):
        power = words[j].copy()
        for b in range(8):
            for r in range(matrix.shape[0]):
                if (int(matrix[r, j]) >> b) & 1:
                    acc[r] ^= power
            power = xtime(power)
    return acc.view(np.uint8)


def random_chunk(rng: random.Random, length: int) -> bytes:
    return rng.randbytes(length)


def all_fragments(coder: IsalCoder, chunk: bytes, k: int, m: int) -> list[bytes]:
    return [bytes(f) for f in coder.fragments(chunk, k, m)]


# --- the code itself -------------------------------------------------------------------

def test_gf_reference_agrees_with_isal(isal: IsaL) -> None:
    rng = random.Random(1)
    mul = gf_mul_table()
    for a, b in [(rng.randrange(256), rng.randrange(256)) for _ in range(300)] + [(2, 0x80)]:
        assert isal.gf_mul(a, b) == mul[a, b]
    for a in range(1, 256):
        assert isal.gf_inv(a) == gf_inv(a)


def test_encode_matrix_is_the_contract(isal: IsaL) -> None:
    for k, m in itertools.product(range(1, MAX_K + 1), range(1, MAX_M + 1)):
        full = isal.encode_matrix(Code(k, m))
        assert (full[:k] == np.eye(k, dtype=np.uint8)).all()
        assert (full[k:] == cauchy(k, m)).all(), (k, m)


@pytest.mark.parametrize("k", range(1, 17))
def test_every_shape_matches_reference(coder: IsalCoder, k: int) -> None:
    """Every K 1..16 with every M 1..4, several lengths: parity equals the reference,
    decoding from a random K of the fragments and rebuilding the rest give them back."""
    rng = random.Random(k)
    for m in range(1, 5):
        for length in (1, 65, 64 * k, 64 * k + 1, rng.randrange(1, 20000)):
            chunk = random_chunk(rng, length)
            frags = all_fragments(coder, chunk, k, m)
            assert b"".join(frags[:k])[:length] == chunk
            assert (np.array([np.frombuffer(f, np.uint8) for f in frags[k:]])
                    == encode_reference(chunk, k, m)).all(), (k, m, length)
            keep = sorted(rng.sample(range(k + m), k))
            kept = {i: frags[i] for i in keep}
            assert coder.decode(kept, k, m, length) == chunk
            lost = [i for i in range(k + m) if i not in keep]
            if lost:
                rebuilt = coder.rebuild(kept, k, m, lost)
                assert [bytes(rebuilt[i]) for i in lost] == [frags[i] for i in lost]


def erasure_patterns(n: int, m: int) -> list[tuple[int, ...]]:
    return [p for e in range(1, m + 1) for p in itertools.combinations(range(n), e)]


@pytest.mark.parametrize(("k", "m", "sample"), [
    (1, 1, None), (2, 2, None), (4, 2, None), (6, 3, None), (8, 2, None), (3, 3, None),
    (10, 4, None), (12, 4, 600), (16, 4, 800), (32, 8, 250)])
def test_every_erasure_pattern(coder: IsalCoder, k: int, m: int, sample: int | None) -> None:
    """Decode and rebuild after erasing every pattern of up to M fragments (a random
    sample of them for the largest shapes); the chunk ends mid-fragment."""
    rng = random.Random(k * 100 + m)
    length = 64 * k * 3 - 37 if k > 1 else 150
    chunk = random_chunk(rng, length)
    frags = all_fragments(coder, chunk, k, m)
    if sample is None:
        patterns = erasure_patterns(k + m, m)
    else:  # C(40, 8) alone is 77 million: draw the sample without listing them
        patterns = [tuple(sorted(rng.sample(range(k + m), rng.randint(1, m))))
                    for _ in range(sample)] + [tuple(range(m)), tuple(range(k, k + m))]
    for erased in patterns:
        kept = {i: frags[i] for i in range(k + m) if i not in erased}
        assert coder.decode(kept, k, m, length) == chunk, erased
        rebuilt = coder.rebuild(kept, k, m, erased)
        assert [bytes(rebuilt[i]) for i in erased] == [frags[i] for i in erased], erased


@pytest.mark.parametrize("length", LENGTHS)
def test_lengths(coder: IsalCoder, length: int) -> None:
    """1, 63, 64, 65 and other lengths, for shapes where the chunk ends in the first,
    a middle or the last data fragment (the rest being padding)."""
    rng = random.Random(length)
    for k, m in ((1, 1), (3, 2), (4, 2), (8, 3), (16, 4)):
        chunk = random_chunk(rng, length)
        frags = all_fragments(coder, chunk, k, m)
        size = fragment_size(length, k)
        assert all(len(f) == size for f in frags)
        assert (np.array([np.frombuffer(f, np.uint8) for f in frags[k:]])
                == encode_reference(chunk, k, m)).all()
        lost = list(range(min(m, k)))  # the data fragments first: the decode path
        kept = {i: frags[i] for i in range(k + m) if i not in lost}
        assert coder.decode(kept, k, m, length) == chunk


def test_column_ranges_isolate_the_last_line() -> None:
    """Encode reads the chunk in place except the 64-byte line where it ends."""
    assert column_ranges(Code(4, 2).layout(4096)) == [(0, 1024)]
    # S = 1024; fragment 3 holds 928 bytes: whole lines to 896, the line [896, 960)
    # where the chunk ends, then padding
    assert column_ranges(Code(4, 2).layout(4000)) == [(0, 896), (896, 960), (960, 1024)]
    assert column_ranges(Code(4, 2).layout(1)) == [(0, 64)]
    assert column_ranges(Code(2, 1).layout(100)) == [(0, 64)]  # ends in fragment 1's line
    lay = Code(3, 1).layout(1000)  # S = 384, fragment 2 holds 232 bytes
    assert column_ranges(lay) == [(0, 192), (192, 256), (256, 384)]


def test_zero_copy(coder: IsalCoder) -> None:
    """Data fragments are views of the chunk; parity goes into the caller's buffer; the
    chunk (read-only bytes) is left alone."""
    rng = random.Random(5)
    chunk = random_chunk(rng, 4 * 4096 - 10)
    src = np.frombuffer(chunk, dtype=np.uint8)
    frags = coder.fragments(chunk, 4, 2)
    assert all(np.shares_memory(np.frombuffer(f, np.uint8), src) for f in frags[:3])
    assert not np.shares_memory(np.frombuffer(frags[3], np.uint8), src)  # padded copy
    out = bytearray(2 * 4096)
    parity = coder.encode(chunk, 4, 2, out=out)
    assert np.shares_memory(parity, np.frombuffer(out, np.uint8))
    assert parity.shape == (2, 4096) and bytes(out) == b"".join(frags[4:])
    assert bytes(src) == chunk


def test_multiply_keeps_temporary_tables_alive(isal: IsaL) -> None:
    """multiply(tables=<a temporary array>) must not free it during the call (it did, when
    the parameter was rebound to the address: seen as wrong rebuilt parity for K*R >= 32
    on one machine). Churn the allocator between calls to make reuse likely."""
    rng = np.random.default_rng(11)
    a = rng.integers(1, 256, (6, 8), dtype=np.uint8)
    inputs = [rng.integers(0, 256, 4096, dtype=np.uint8) for _ in range(8)]
    want = table_multiply(a, np.array(inputs))
    for _ in range(20):
        outs = [np.zeros(4096, dtype=np.uint8) for _ in range(6)]
        isal.multiply(4096, isal.tables(a), [x.ctypes.data for x in inputs],
                      [o.ctypes.data for o in outs])
        junk = [np.full(32 * 8 * 6, 0xFF, dtype=np.uint8) for _ in range(8)]
        assert (np.array(outs) == want).all()
        del junk


def test_calls_release_the_gil(isal: IsaL) -> None:
    """ctypes.CDLL functions drop the GIL for the call (PyDLL's would not)."""
    assert not isinstance(isal._lib, ctypes.PyDLL)
    assert not isal._lib.ec_encode_data._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]


def test_decode_prefers_data_fragments(coder: IsalCoder) -> None:
    """With every data fragment present, surplus parity (even garbage) is not read."""
    chunk = random_chunk(random.Random(3), 3000)
    frags = all_fragments(coder, chunk, 4, 2)
    kept = {i: frags[i] for i in range(4)} | {4: bytes(len(frags[4]))}
    assert coder.decode(kept, 4, 2, len(chunk)) == chunk


@pytest.mark.parametrize(("k", "r"), [(1, 1), (4, 2), (8, 3), (8, 4), (6, 6), (16, 4), (32, 8)])
def test_matmul_matches_reference(isal: IsaL, k: int, r: int) -> None:
    """The small products of decode plans, for shapes whose ISA-L tables are 1 KiB or
    more (numpy returns smaller freed buffers to a cache of its own, so a use-after-free
    of the tables showed only from K*R = 32 on, and only where malloc reused the block)."""
    rng = np.random.default_rng(k * r)
    for columns in (1, 8, k, 64):
        a = rng.integers(0, 256, (r, k), dtype=np.uint8)
        b = rng.integers(0, 256, (k, columns), dtype=np.uint8)
        assert (isal.matmul(a, b) == table_multiply(a, b)).all(), columns
    assert (isal.mul_table == gf_mul_table()).all()


def test_decode_plan_is_isal_recipe(isal: IsaL) -> None:
    """Rows for lost data are rows of the inverse; rows for lost parity are encode rows
    times the inverse (checked against the reference arithmetic)."""
    code = Code(6, 3)
    plan = decode_plan(isal, code, (0, 2, 3, 5, 6, 8), (1, 4, 7))
    full = isal.encode_matrix(code)
    picked = full[list(plan.survivors)]
    identity = table_multiply(plan.matrix[:2], picked)  # data rows: inverse rows
    assert (identity == np.eye(6, dtype=np.uint8)[[1, 4]]).all()
    assert (table_multiply(plan.matrix[2:], picked) == full[[7]]).all()


# --- the GPU kernel's algorithm, on the CPU --------------------------------------------

@pytest.mark.parametrize(("k", "m"), [(1, 1), (4, 2), (8, 2), (10, 4), (16, 4), (32, 8)])
def test_bitsliced_reference_matches_isal(isal: IsaL, coder: IsalCoder, k: int, m: int) -> None:
    rng = random.Random(k + m)
    chunk = random_chunk(rng, 64 * k * 2 - 5)
    parity = coder.encode(chunk, k, m)
    assert (bitsliced_multiply(cauchy(k, m), padded(chunk, k)) == parity).all()
    frags = np.array([np.frombuffer(f, np.uint8) for f in all_fragments(coder, chunk, k, m)])
    erased = tuple(sorted(rng.sample(range(k + m), m)))
    chosen = tuple(i for i in range(k + m) if i not in erased)[:k]
    plan = decode_plan(isal, Code(k, m), chosen, erased)
    assert (bitsliced_multiply(plan.matrix, frags[list(chosen)]) == frags[list(erased)]).all()


SHIM = r"""
#include <cstdint>
struct uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) {
    return uint4{a, b, c, d};
}
struct dim3_ { long long x, y, z; };
static dim3_ blockIdx, blockDim, threadIdx, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
"""


def _compiler() -> str | None:
    return shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


class HostKernel:
    """A generated kernel compiled for the CPU: `launch` runs every thread of the grid."""

    def __init__(self, k: int, rows: int, matrix: Sequence[Sequence[int]] | None,
                 workdir: Path) -> None:
        name = kernel_name(k, rows, matrix)
        params = kernel_params(k, rows, matrix is not None)
        call = ", ".join(f"({ctype})a[{i}]" for i, (ctype, _) in enumerate(params))
        driver = (
            'extern "C" void run(long long gx, long long gy, const unsigned long long* a) {\n'
            f"  gridDim = {{gx, gy, 1}}; blockDim = {{{BLOCK}, 1, 1}};\n"
            "  for (long long y = 0; y < gy; ++y) for (long long x = 0; x < gx; ++x)\n"
            f"    for (long long t = 0; t < {BLOCK}; ++t) {{\n"
            "      blockIdx = {x, y, 0}; threadIdx = {t, 0, 0};\n"
            f"      {name}({call});\n"
            "    }\n}\n")
        source = workdir / f"{name}.cpp"
        source.write_text(SHIM + kernel_source(k, rows, matrix) + driver)
        lib = workdir / f"{name}.so"
        done = subprocess.run([str(_compiler()), "-O1", "-w", "-shared", "-fPIC", "-o", str(lib),
                               str(source)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        self._lib = ctypes.CDLL(str(lib))
        self._lib.run.argtypes = [ctypes.c_longlong, ctypes.c_longlong, ctypes.c_void_p]
        self.baked = matrix is not None

    def launch(self, inputs: Sequence[tuple[int, int]], outputs: Sequence[tuple[int, int]],
               coefficients: Sequence[int] | None, frag: int, *, nchunks: int = 1,
               in_stride: int = 0, out_stride: int = 0, vec: bool = True) -> None:
        """The same arguments, in the same order, as gpu._launch gives the device."""
        args = [a for a, _ in inputs] + [h for _, h in inputs]
        args += [a for a, _ in outputs] + [r for _, r in outputs]
        if not self.baked:
            args += list(coefficients or ())
        args += [frag, in_stride, out_stride, int(vec)]
        packed = (ctypes.c_ulonglong * len(args))(*[a % (1 << 64) for a in args])
        self._lib.run(max(1, -(-frag // (GROUP_BYTES * BLOCK))), nchunks, packed)


needs_cxx = pytest.mark.skipif(_compiler() is None, reason="no C++ compiler to build the "
                               "kernel source for the CPU")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Any:
    workdir = tmp_path_factory.mktemp("ec_kernels")
    built: dict[tuple[int, int, bool], HostKernel] = {}

    def get(k: int, rows: int, matrix: U8 | None) -> HostKernel:
        key = (k, rows, matrix is not None)
        if key not in built:
            built[key] = HostKernel(k, rows, None if matrix is None else matrix.tolist(),
                                    workdir)
        return built[key]
    return get


GARBAGE = 0xA5


def aligned_copy(data: bytes, offset: int) -> tuple[U8, U8]:
    """DATA in a fresh buffer at OFFSET bytes past a 64-byte boundary, with GARBAGE
    around it (a kernel that reads past the end, or writes there, shows): (keeper, view)."""
    keeper = np.full(len(data) + 192, GARBAGE, dtype=np.uint8)
    start = (-keeper.ctypes.data) % 64 + offset
    view = keeper[start:start + len(data)]
    view[:] = np.frombuffer(data, np.uint8)
    return keeper, view


@needs_cxx
@pytest.mark.parametrize(("k", "m"), [(1, 1), (4, 2), (5, 3), (16, 4)])
@pytest.mark.parametrize("baked", [True, False], ids=["baked", "params"])
def test_kernel_source_encodes(isal: IsaL, coder: IsalCoder, kernels: Any, k: int, m: int,
                               baked: bool) -> None:
    """The CUDA source (run on the CPU) gives ISA-L's parity: chunk ends anywhere, base
    16-byte aligned (vector path) or not (byte path)."""
    matrix = isal.encode_matrix(Code(k, m))[k:]
    kernel = kernels(k, m, matrix if baked else None)
    rng = random.Random(k * m)
    for length, offset in ((1, 0), (64 * k, 0), (64 * k * 2 + 17, 0), (64 * k * 3 - 1, 3),
                           (4096 * k, 8), (4096 * k - 100, 0)):
        chunk = random_chunk(rng, length)
        lay = Code(k, m).layout(length)
        size = lay.size
        _keep, src = aligned_copy(chunk, offset)
        parity = np.full((m, size), 0xA5, dtype=np.uint8)
        kernel.launch([(src.ctypes.data + j * size, lay.data_bytes(j)) for j in range(k)],
                      [(parity.ctypes.data + i * size, size) for i in range(m)],
                      None if baked else pack_coefficients(matrix.tolist()), size,
                      vec=offset % 16 == 0)
        assert (parity == coder.encode(chunk, k, m)).all(), (length, offset)


@needs_cxx
def test_kernel_source_batches(isal: IsaL, coder: IsalCoder, kernels: Any) -> None:
    """blockIdx.y walks chunks STRIDE bytes apart (rows of a wider array)."""
    k, m, length, stride = 4, 2, 1000, 1040
    matrix = isal.encode_matrix(Code(k, m))[k:]
    kernel = kernels(k, m, matrix)
    rng = random.Random(9)
    chunks = [random_chunk(rng, length) for _ in range(3)]
    table = np.zeros((3, stride), dtype=np.uint8)
    for c, chunk in enumerate(chunks):
        table[c, :length] = np.frombuffer(chunk, np.uint8)
    size = fragment_size(length, k)
    lay = Code(k, m).layout(length)
    parity = np.zeros((3, m, size), dtype=np.uint8)
    kernel.launch([(table.ctypes.data + j * size, lay.data_bytes(j)) for j in range(k)],
                  [(parity.ctypes.data + i * size, size) for i in range(m)], None, size,
                  nchunks=3, in_stride=stride, out_stride=m * size)
    for c, chunk in enumerate(chunks):
        assert (parity[c] == coder.encode(chunk, k, m)).all(), c


@needs_cxx
@pytest.mark.parametrize(("k", "m", "erased"), [(4, 2, (0, 3)), (6, 3, (1, 4, 7)),
                                                (10, 4, (6, 7, 9, 13)), (3, 3, (0, 1, 2))])
def test_kernel_source_decodes_into_the_chunk(isal: IsaL, coder: IsalCoder, kernels: Any,
                                              k: int, m: int, erased: tuple[int, ...]) -> None:
    """Decode as the GPU coder does: lost data fragments written straight into a buffer
    of exactly the chunk's length (the last one only up to its end), survivors read as
    they are; bytes past the chunk are never written."""
    code = Code(k, m)
    rng = random.Random(k)
    length = 64 * k * 2 - 21
    chunk = random_chunk(rng, length)
    frags = all_fragments(coder, chunk, k, m)
    lay = code.layout(length)
    size = lay.size
    lost = tuple(j for j in erased if j < lay.carrying)
    chosen = tuple(i for i in range(k + m) if i not in erased)[:k]
    plan = decode_plan(isal, code, chosen, lost)
    kernel = kernels(k, len(lost), None)
    keep = [np.frombuffer(frags[i], np.uint8) for i in chosen]
    guard, result = aligned_copy(bytes(length), 0)
    result[:] = GARBAGE
    kernel.launch([(a.ctypes.data, size) for a in keep],
                  [(result.ctypes.data + j * size, lay.data_bytes(j)) for j in lost],
                  pack_coefficients(plan.matrix.tolist()), size)
    start = result.ctypes.data - guard.ctypes.data
    assert (guard[start + length:] == GARBAGE).all(), "wrote past the chunk"
    for j in range(lay.carrying):
        have = lay.data_bytes(j)
        got = result[j * size:j * size + have].tobytes()
        if j in lost:
            assert got == chunk[j * size:j * size + have], j
        else:
            assert got == bytes([GARBAGE]) * have, f"wrote into present fragment {j}"


# --- bad input -------------------------------------------------------------------------

@pytest.mark.parametrize(("k", "m"), [(0, 1), (MAX_K + 1, 1), (4, 0), (4, MAX_M + 1),
                                      (-1, 2), (True, 1), ("4", 2), (4.0, 2)])
def test_bad_k_or_m(coder: IsalCoder, k: Any, m: Any) -> None:
    with pytest.raises(ConfigError, match=r"erasure code: [KM]"):
        Code(k, m)
    with pytest.raises(ConfigError):
        coder.encode(b"x" * 100, k, m)


def test_bad_lengths(coder: IsalCoder) -> None:
    for length in (0, -5, True):
        with pytest.raises(InvalidArgument, match="at least 1 byte"):
            fragment_size(length, 4)
    with pytest.raises(InvalidArgument, match="at least 1 byte"):
        coder.encode(b"", 4, 2)


def test_bad_fragments(coder: IsalCoder) -> None:
    chunk = random_chunk(random.Random(2), 1000)
    frags = all_fragments(coder, chunk, 4, 2)  # S = 256
    kept = {i: frags[i] for i in (0, 2, 4, 5)}
    with pytest.raises(InvalidArgument, match="differ in size"):
        coder.decode(kept | {2: frags[2][:-64]}, 4, 2, 1000)
    with pytest.raises(InvalidArgument, match="multiple of 64"):
        coder.decode({i: f[:100] for i, f in kept.items()}, 4, 2, 1000)
    with pytest.raises(InvalidArgument, match="256-byte fragments, got 192"):
        coder.decode({i: f[:192] for i, f in kept.items()}, 4, 2, 1000)
    with pytest.raises(InvalidArgument, match="need 4 fragments"):
        coder.decode({i: frags[i] for i in (0, 1, 5)}, 4, 2, 1000)
    with pytest.raises(InvalidArgument, match="need 4 fragments"):
        coder.rebuild({i: frags[i] for i in (0, 1, 5)}, 4, 2, [2])
    with pytest.raises(InvalidArgument, match=r"index must be 0\.\.5"):
        coder.decode(kept | {6: frags[0]}, 4, 2, 1000)
    with pytest.raises(InvalidArgument, match=r"index must be 0\.\.5"):
        coder.rebuild(kept, 4, 2, [-1])
    with pytest.raises(InvalidArgument, match="no fragment asked for"):
        coder.rebuild(kept, 4, 2, [])
    with pytest.raises(InvalidArgument, match="contiguous"):
        coder.decode(kept | {0: np.zeros(512, np.uint8)[::2]}, 4, 2, 1000)


def test_bad_parity_buffer(coder: IsalCoder) -> None:
    with pytest.raises(InvalidArgument, match="need M\\*S"):
        coder.encode(b"x" * 1000, 4, 2, out=bytearray(100))
    with pytest.raises(InvalidArgument, match="read-only"):
        coder.encode(b"x" * 1000, 4, 2, out=bytes(512))


def test_rebuild_returns_present_fragments_too(coder: IsalCoder) -> None:
    chunk = random_chunk(random.Random(4), 777)
    frags = all_fragments(coder, chunk, 3, 2)
    kept = {i: frags[i] for i in (1, 2, 3)}
    rebuilt = coder.rebuild(kept, 3, 2, [4, 1, 0])
    assert list(rebuilt) == [0, 1, 4]
    assert [bytes(v) for v in rebuilt.values()] == [frags[0], frags[1], frags[4]]


def test_registry_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="unknown erasure coder 'nope'; use one of isal, gpu"):
        make_coder("nope")
    with pytest.raises(ConfigError, match="ISA-L library 'bogus'"):
        load_isal("bogus")
    from mosafs.erasure import isal as isal_module
    from mosafs.erasure.gpu import gpu_unavailable_reason

    monkeypatch.setattr(isal_module, "system_library", lambda: None)
    monkeypatch.setattr(isal_module, "pyeclib_library", lambda: None)
    with pytest.raises(ConfigError, match="apt-get install libisal2") as info:
        isal_module.load_isal.__wrapped__("auto")
    assert INSTALL_HINT in info.value.message and info.value.exit_code == 2
    if gpu_unavailable_reason() is not None:
        with pytest.raises(ConfigError, match="GPU erasure coder requested but"):
            make_coder("gpu")
