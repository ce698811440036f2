"""CUDA C source of the GPU erasure coder (DESIGN §10), generated per shape, compiled by
CuPy (NVRTC). Nothing here imports CuPy: tests compile the same source on the CPU.

One kernel shape does all the work: R outputs = an RxK matrix over GF(2^8) times K input
fragments (encode: the M parity rows times the data fragments; decode/rebuild: the rows
of the inverted survivors' matrix times the survivors).

* Bit-sliced arithmetic on 32-bit words holding 4 bytes: with p_b = x * 2^b (b = 0..7,
  each from the last by `XT`, the xtime of four packed bytes at once:
  ((x & 0x7f7f7f7f) << 1) ^ (((x >> 7) & 0x01010101) * 0x1d)), the product c * x is the
  XOR of the p_b whose bit b is set in c. `mac` writes that as acc ^= p_b & mask_b with
  mask_b = 0 - ((c >> b) & 1), so one function serves both kinds of coefficient below.
* Encode kernels are generated per (K, M) with the coefficients as literals: after
  inlining, the compiler folds every mask to 0 or ~0, drops the ANDs, the zero terms and
  the powers no coefficient uses, leaving xtimes and XORs (LOP3 takes three at a time).
* Decode/rebuild kernels are generated per (K, R) with the coefficients as kernel
  parameters (packed four per 32-bit word): erasure patterns are many (6195 for 16+4),
  compiling one kernel per decode matrix would take longer than decoding.
* Each thread handles 16 bytes (one uint4) of every fragment at one column position,
  so a warp reads 512 contiguous bytes of each fragment: coalesced. Inputs are loaded
  four fragments at a time before any arithmetic, so those loads are in flight together.
* Tails and alignment: every input has `have` bytes (past them it reads as zeros: the
  chunk's padding) and every output `room` bytes (past them nothing is written: a
  decoded chunk's end). A 16-byte group that is not whole, or any group when `vec` is 0
  (a base address or stride not a multiple of 16), goes byte by byte. Fragment sizes are
  multiples of 64, so with 16-byte aligned bases every group but the tail is whole.
* Batches: blockIdx.y is a chunk index; chunk c's fragments lie at in_stride * c (and
  its outputs at out_stride * c) past the addresses given, so equal-length chunks
  encode in one launch.
* Ragged batches (`ragged_kernel_source`, the GPU chunk stream's parity stage): chunks
  of any lengths at any offsets of one buffer, their parity packed into one output, one
  launch for all; a table of offsets, lengths and tile prefix sums says which chunk a
  block works on. Loads take any alignment (two aligned loads and funnel shifts), and
  bytes past a chunk's end read as zeros whatever follows it in the buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mosafs.erasure.spec import ALIGN

BLOCK = 256
"""Threads per block."""
GROUP_BYTES = 16
"""Bytes of each fragment per thread and step (one uint4)."""
LOAD_BATCH = 4
"""Input fragments whose loads are issued together before their arithmetic."""

PRELUDE = r"""
#define XT(x) ((((x) & 0x7f7f7f7fu) << 1) ^ ((((x) >> 7) & 0x01010101u) * 0x1du))

// p[w][b] = word w of the group times 2^b in GF(2^8), four bytes per word.
__device__ __forceinline__ void powers(unsigned (&p)[4][8], const uint4 v) {
    p[0][0] = v.x; p[1][0] = v.y; p[2][0] = v.z; p[3][0] = v.w;
#pragma unroll
    for (int b = 1; b < 8; ++b) {
#pragma unroll
        for (int w = 0; w < 4; ++w) p[w][b] = XT(p[w][b - 1]);
    }
}

// acc ^= c * (the group whose powers are p); c a literal folds to plain XORs.
__device__ __forceinline__ void mac(unsigned (&acc)[4], const unsigned (&p)[4][8],
                                    const unsigned c) {
#pragma unroll
    for (int b = 0; b < 8; ++b) {
        const unsigned mask = 0u - ((c >> b) & 1u);
#pragma unroll
        for (int w = 0; w < 4; ++w) acc[w] ^= p[w][b] & mask;
    }
}

// 16 bytes at p, of which n (may be <= 0) exist: zeros past them.
__device__ __forceinline__ uint4 load16(const unsigned long long base, const long long off,
                                        const long long n, const int vec) {
    const unsigned char* p = reinterpret_cast<const unsigned char*>(base) + off;
    if (vec && n >= 16) return *reinterpret_cast<const uint4*>(p);
    unsigned w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int b = 0; b < 16; ++b) {
        if (b < n) w[b >> 2] |= (unsigned)p[b] << (8 * (b & 3));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// Store acc as 16 bytes at p, of which only the first n (may be <= 0) are written.
__device__ __forceinline__ void store16(const unsigned long long base, const long long off,
                                        const long long n, const int vec,
                                        const unsigned (&acc)[4]) {
    unsigned char* p = reinterpret_cast<unsigned char*>(base) + off;
    if (vec && n >= 16) {
        *reinterpret_cast<uint4*>(p) = make_uint4(acc[0], acc[1], acc[2], acc[3]);
        return;
    }
#pragma unroll
    for (int b = 0; b < 16; ++b) {
        if (b < n) p[b] = (unsigned char)(acc[b >> 2] >> (8 * (b & 3)));
    }
}
"""


def kernel_name(k: int, rows: int, matrix: Sequence[Sequence[int]] | None) -> str:
    """The kernel's name: baked coefficients (encode) get a digest of the matrix."""
    if matrix is None:
        return f"ec_mul_k{k}_r{rows}"
    digest = 0
    for value in (v for row in matrix for v in row):
        digest = (digest * 257 + int(value)) % (1 << 61)
    return f"ec_mul_k{k}_r{rows}_{digest:x}"


def kernel_params(k: int, rows: int, baked: bool) -> list[tuple[str, str]]:
    """(C type, name) of every kernel parameter, in order. Pointers travel as integers."""
    params = [("unsigned long long", f"in{j}") for j in range(k)]
    params += [("long long", f"have{j}") for j in range(k)]
    params += [("unsigned long long", f"out{r}") for r in range(rows)]
    params += [("long long", f"room{r}") for r in range(rows)]
    if not baked:
        params += [("unsigned", f"cw{i}") for i in range(coefficient_words(k, rows))]
    params += [("long long", "frag"), ("long long", "in_stride"), ("long long", "out_stride"),
               ("int", "vec")]
    return params


def coefficient_words(k: int, rows: int) -> int:
    """32-bit parameters holding an RxK matrix, four coefficients (row-major) a word."""
    return -(-k * rows // 4)


def pack_coefficients(matrix: Sequence[Sequence[int]]) -> list[int]:
    """The matrix as the kernel's cw parameters: coefficient i in byte i % 4 of word i // 4."""
    flat = [int(v) for row in matrix for v in row]
    flat += [0] * (-len(flat) % 4)
    return [flat[i] | flat[i + 1] << 8 | flat[i + 2] << 16 | flat[i + 3] << 24
            for i in range(0, len(flat), 4)]


def _coefficient(k: int, r: int, j: int, matrix: Sequence[Sequence[int]] | None) -> str:
    if matrix is not None:
        return f"0x{int(matrix[r][j]):02x}u"
    i = r * k + j
    return f"((cw{i // 4} >> {8 * (i % 4)}) & 0xffu)"


def _multiply_lines(k: int, rows: int, matrix: Sequence[Sequence[int]] | None,
                    load: Callable[[int], str]) -> list[str]:
    """The loop body shared by every kernel shape: accumulators a0.. for ROWS outputs,
    input j's 16 bytes from the expression load(j), LOAD_BATCH loads issued before their
    arithmetic. Inputs whose column of a baked matrix is all zeros are never read."""
    body = [f"unsigned a{r}[4] = {{0u, 0u, 0u, 0u}};" for r in range(rows)]
    body.append("unsigned p[4][8];")
    used = [j for j in range(k) if matrix is None or any(row[j] for row in matrix)]
    for first in range(0, len(used), LOAD_BATCH):
        group = used[first:first + LOAD_BATCH]
        body += [f"const uint4 v{j} = {load(j)};" for j in group]
        for j in group:
            terms = " ".join(f"mac(a{r}, p, {_coefficient(k, r, j, matrix)});"
                             for r in range(rows) if matrix is None or matrix[r][j])
            body.append(f"powers(p, v{j}); {terms}")
    return body


def kernel_source(k: int, rows: int, matrix: Sequence[Sequence[int]] | None = None) -> str:
    """CUDA source of one kernel computing ROWS outputs from K inputs: with MATRIX (RxK
    ints) baked in as literals, or (None) taking the matrix as `cw` parameters."""
    if matrix is not None and (len(matrix) != rows or any(len(row) != k for row in matrix)):
        raise ValueError(f"matrix is not {rows}x{k}")
    name = kernel_name(k, rows, matrix)
    params = ",\n    ".join(f"const {ctype} {pname}"
                            for ctype, pname in kernel_params(k, rows, matrix is not None))
    body = _multiply_lines(k, rows, matrix,
                           lambda j: f"load16(in{j}, ioff, have{j} - col, vec)")
    body += [f"store16(out{r}, ooff, room{r} - col, vec, a{r});" for r in range(rows)]
    loop = "\n".join("    " + line for line in body)
    return f"""{PRELUDE}
extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(
    {params})
{{
  const long long ioff0 = (long long)blockIdx.y * in_stride;
  const long long ooff0 = (long long)blockIdx.y * out_stride;
  const long long step = (long long)gridDim.x * blockDim.x * {GROUP_BYTES};
  for (long long col = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * {GROUP_BYTES};
       col < frag; col += step) {{
    const long long ioff = ioff0 + col;
    const long long ooff = ooff0 + col;
{loop}
  }}
}}
"""


# --- ragged batches: every chunk of a GPU stream's buffer in one launch ------------------

RAGGED_STEPS = 4
"""16-byte groups of each fragment one thread encodes per tile (strided by the block)."""
RAGGED_TILE = BLOCK * GROUP_BYTES * RAGGED_STEPS
"""Bytes of every fragment of one chunk that one block encodes (a tile): 16 KiB, so a
64 MiB buffer cut 4+2 is ~1000 blocks, about one wave of resident blocks on an H100."""
RAGGED_META_ARRAYS = 4
"""The plan the kernel reads: in_off[n], length[n], out_off[n], then tile0[n + 1]."""

RAGGED_PRELUDE = r"""
// 16 bytes at p (any alignment), of which n (may be <= 0) belong to the chunk: zeros
// past them, so a chunk's padding is zeros whatever lies after it in the buffer. A whole
// group is two aligned 16-byte loads and funnel shifts: chunks start anywhere in a
// stream's buffer, and p % 16 is the same for every group of one chunk, so the branches
// below agree across a warp. The second load reads up to 15 bytes past the group (the
// next chunk's, or the buffer's slack): they are shifted out, never used.
__device__ __forceinline__ uint4 load16u(const unsigned char* p, const long long n) {
    if (n >= 16) {
        const unsigned long long a = reinterpret_cast<unsigned long long>(p);
        const unsigned r = (unsigned)(a & 15ull);
        const uint4* q = reinterpret_cast<const uint4*>(a - r);
        const uint4 lo = q[0];
        if (r == 0u) return lo;
        const uint4 hi = q[1];
        const unsigned s = 8u * (r & 3u);
        unsigned t0, t1, t2, t3, t4;
        switch (r >> 2) {
            case 0: t0 = lo.x; t1 = lo.y; t2 = lo.z; t3 = lo.w; t4 = hi.x; break;
            case 1: t0 = lo.y; t1 = lo.z; t2 = lo.w; t3 = hi.x; t4 = hi.y; break;
            case 2: t0 = lo.z; t1 = lo.w; t2 = hi.x; t3 = hi.y; t4 = hi.z; break;
            default: t0 = lo.w; t1 = hi.x; t2 = hi.y; t3 = hi.z; t4 = hi.w; break;
        }
        return make_uint4(__funnelshift_r(t0, t1, s), __funnelshift_r(t1, t2, s),
                          __funnelshift_r(t2, t3, s), __funnelshift_r(t3, t4, s));
    }
    unsigned w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int b = 0; b < 16; ++b) {
        if (b < n) w[b >> 2] |= (unsigned)p[b] << (8 * (b & 3));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}
"""


def ragged_kernel_name(k: int, m: int, matrix: Sequence[Sequence[int]]) -> str:
    """The ragged encode kernel's name: like kernel_name's, with the matrix's digest."""
    return kernel_name(k, m, matrix).replace("ec_mul_", "ec_ragged_", 1)


def ragged_kernel_source(k: int, m: int, matrix: Sequence[Sequence[int]]) -> str:
    """CUDA source of the ragged-batch encode kernel for K+M, MATRIX (the MxK parity rows)
    baked in: the parity of many chunks of any lengths lying anywhere in one buffer, in
    one launch.

    `k(base, meta, nchunks, out)`: chunk c is length[c] bytes at base + in_off[c]; its
    fragment size is S = 64 * ceil(length / 64K) (DESIGN §10) and its parity fragment i
    goes to out + out_off[c] + i * S (out_off: multiples of 64). Block b encodes tile
    b - tile0[c] of chunk c (the c with tile0[c] <= b < tile0[c + 1], found by binary
    search over the prefix sums): RAGGED_TILE bytes of each of its fragments. Data
    fragment j holds length - jS bytes of the chunk (at most S); bytes past the chunk's
    end are read as zeros, never from the buffer."""
    if len(matrix) != m or any(len(row) != k for row in matrix):
        raise ValueError(f"matrix is not {m}x{k}")
    body = _multiply_lines(k, m, matrix,
                           lambda j: f"load16u(src + {j}LL * frag + col, len - {j}LL * frag - col)")
    body += [f"*reinterpret_cast<uint4*>(dst + {r}LL * frag + col) = "
             f"make_uint4(a{r}[0], a{r}[1], a{r}[2], a{r}[3]);" for r in range(m)]
    loop = "\n".join("    " + line for line in body)
    per_frag = ALIGN * k
    return f"""{PRELUDE}{RAGGED_PRELUDE}
extern "C" __global__ void __launch_bounds__({BLOCK}) {ragged_kernel_name(k, m, matrix)}(
    const unsigned long long base, const unsigned long long meta, const int nchunks,
    const unsigned long long out)
{{
  const long long* in_off = reinterpret_cast<const long long*>(meta);
  const long long* length = in_off + nchunks;
  const long long* out_off = length + nchunks;
  const long long* tile0 = out_off + nchunks;
  const long long tile = (long long)blockIdx.x;
  int c = 0;
  int last = nchunks - 1;
  while (c < last) {{
    const int mid = (c + last + 1) >> 1;
    if (tile0[mid] <= tile) c = mid; else last = mid - 1;
  }}
  const long long len = length[c];
  const long long frag = {ALIGN}LL * ((len + {per_frag - 1}LL) / {per_frag}LL);
  const unsigned char* src = reinterpret_cast<const unsigned char*>(base) + in_off[c];
  unsigned char* dst = reinterpret_cast<unsigned char*>(out) + out_off[c];
  const long long first = (tile - tile0[c]) * {RAGGED_TILE}LL;
  const long long end = first + {RAGGED_TILE}LL < frag ? first + {RAGGED_TILE}LL : frag;
  for (long long col = first + (long long)threadIdx.x * {GROUP_BYTES}; col < end;
       col += {BLOCK * GROUP_BYTES}LL) {{
{loop}
  }}
}}
"""


__all__ = ["BLOCK", "GROUP_BYTES", "LOAD_BATCH", "PRELUDE", "RAGGED_META_ARRAYS",
           "RAGGED_PRELUDE", "RAGGED_STEPS", "RAGGED_TILE", "coefficient_words", "kernel_name",
           "kernel_params", "kernel_source", "pack_coefficients", "ragged_kernel_name",
           "ragged_kernel_source"]
