"""CUDA C source of the GPU backend's kernels (DESIGN §5, §6), compiled by CuPy (NVRTC).

Kept as a Python string so that it ships inside the package like any module; nothing here
imports CuPy. The kernels:

* ``gear_candidates``: the windowed gear hash of every byte of a buffer, one thread per
  strip of ``GEAR_STRIP`` bytes at a time (64-byte blocks read as four 16-byte loads, the
  next block loaded while the current one is hashed; the gear table in shared memory in
  16 copies, one bank pair per lane of a half-warp, so table look-ups never conflict).
  Each strip first rolls the 64 bytes before it (h_p depends only on bytes p-63..p, and
  the byte 64 back is shifted out, so rolling 64 is exact), or fewer at the start of the
  stream (positions before it are absent). Every position whose hash passes the loose
  mask (top L-2 bits zero) is a candidate; its buffer-relative position is written as
  ``pos << 1 | strict`` (strict: it passes the top L+2 bits too) to a compact array
  through one atomic counter. The order is not defined: the host sorts the few
  candidates. Only the top 32 bits of the hash are tested (both masks have at most 28
  bits for AVG <= 64 MiB).
* ``b3_leaves``: BLAKE3 of many content chunks of any lengths at once. Groups of up to
  16, 32 or 64 (chosen per launch: small content chunks, small groups, fewer idle
  threads) consecutive 1 KiB BLAKE3 chunks ("leaves") of one content chunk, 64 threads
  a block; one thread per leaf compresses its up-to-16 blocks with the message in
  registers (unaligned input: 16-byte loads from the aligned address below, then word
  selects and funnel shifts), and the group's subtree is merged in shared memory. A
  content chunk of one leaf gets the ROOT flag on its last block; one that fits in one
  group gets it on its last parent; larger ones leave one chaining value per group.
* ``b3_parents``: one more tree level: groups of up to 64 chaining values of one content
  chunk merged the same way (ROOT on the chunk's last merge). Run until every content
  chunk has its digest: at most 2 launches for chunks up to 256 MiB.

Merging aligned groups of a power of two pairwise, with an odd node carried up, builds
exactly BLAKE3's left-balanced tree: every left subtree is a complete power of two.
"""

from __future__ import annotations

GEAR_STRIP = 1024
"""Bytes of the buffer per step of a thread of the candidate kernel (a multiple of 64)."""
GEAR_BLOCK = 256
GEAR_BLOCKS_PER_SM = 8
"""Resident blocks of the candidate kernel per multiprocessor (its grid is at most this
many per SM; the blocks loop over the strips)."""
LEAF_GROUP = 64
"""Threads per block of the BLAKE3 kernels; the most leaves (1 KiB BLAKE3 chunks) in a
group of b3_leaves, and the nodes per group of b3_parents."""
LEAF_GROUP_LOGS = (4, 5, 6)
"""Leaf group sizes b3_leaves accepts, as log2."""
HISTORY_BYTES = 64
"""Bytes before a buffer that the candidate kernel reads (the gear window)."""
READ_SLACK = 256
"""Bytes past the last byte of data that the kernels may read (never use)."""

_IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
       0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
_PERMUTATION = (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)


def _schedule() -> list[list[int]]:
    rows = [list(range(16))]
    for _ in range(6):
        rows.append([rows[-1][i] for i in _PERMUTATION])
    return rows


def _rounds() -> str:
    lines = []
    for s in _schedule():
        lines.append(
            f"    B3G(v0, v4, v8, v12, m[{s[0]}], m[{s[1]}]); "
            f"B3G(v1, v5, v9, v13, m[{s[2]}], m[{s[3]}]); "
            f"B3G(v2, v6, v10, v14, m[{s[4]}], m[{s[5]}]); "
            f"B3G(v3, v7, v11, v15, m[{s[6]}], m[{s[7]}]);")
        lines.append(
            f"    B3G(v0, v5, v10, v15, m[{s[8]}], m[{s[9]}]); "
            f"B3G(v1, v6, v11, v12, m[{s[10]}], m[{s[11]}]); "
            f"B3G(v2, v7, v8, v13, m[{s[12]}], m[{s[13]}]); "
            f"B3G(v3, v4, v9, v14, m[{s[14]}], m[{s[15]}]);")
    return "\n".join(lines)


_IV_DEFINES = "\n".join(f"#define B3_IV{i} 0x{v:08X}u" for i, v in enumerate(_IV))

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned char u8;

#ifndef GEAR_STRIP /* -DGEAR_STRIP=... for experiments; the launcher assumes the default */
#define GEAR_STRIP @GEAR_STRIP@
#endif
#define GEAR_COPIES 16
#define LEAF_GROUP @LEAF_GROUP@
#define CV_STRIDE 9   /* 8 words per chaining value, padded against bank conflicts */

__device__ __forceinline__ long long lmin(long long a, long long b) { return a < b ? a : b; }
__device__ __forceinline__ long long lmax(long long a, long long b) { return a > b ? a : b; }

/* ---------------------------------------------------------------- gear candidates */

__device__ __forceinline__ void gear_record(long long pos, u32 hi, u32 mask_s_hi,
                                            u32* __restrict__ out, u32 cap,
                                            u32* __restrict__ count) {
    u32 i = atomicAdd(count, 1u);
    if (i < cap) out[i] = ((u32)pos << 1) | ((hi & mask_s_hi) == 0u ? 1u : 0u);
}

#define GEAR_STEP(W, SH, J)                                                        \
    {                                                                              \
        h = (h << 1) + G[GEAR_COPIES * (((W) >> (SH)) & 255u)];                    \
        if (REC) {                                                                 \
            u32 hi = (u32)(h >> 32);                                               \
            if ((hi & mask_l_hi) == 0u)                                            \
                gear_record(pos0 + (J), hi, mask_s_hi, out, cap, count);           \
        }                                                                          \
    }

#define GEAR_WORD(W, J) GEAR_STEP(W, 0, (J)) GEAR_STEP(W, 8, (J) + 1)               \
    GEAR_STEP(W, 16, (J) + 2) GEAR_STEP(W, 24, (J) + 3)

template <bool REC>
__device__ __forceinline__ void gear_block(u64& h, const u64* G, uint4 a0, uint4 a1,
                                           uint4 a2, uint4 a3, long long pos0,
                                           u32 mask_l_hi, u32 mask_s_hi,
                                           u32* __restrict__ out, u32 cap,
                                           u32* __restrict__ count) {
    GEAR_WORD(a0.x, 0) GEAR_WORD(a0.y, 4) GEAR_WORD(a0.z, 8) GEAR_WORD(a0.w, 12)
    GEAR_WORD(a1.x, 16) GEAR_WORD(a1.y, 20) GEAR_WORD(a1.z, 24) GEAR_WORD(a1.w, 28)
    GEAR_WORD(a2.x, 32) GEAR_WORD(a2.y, 36) GEAR_WORD(a2.z, 40) GEAR_WORD(a2.w, 44)
    GEAR_WORD(a3.x, 48) GEAR_WORD(a3.y, 52) GEAR_WORD(a3.z, 56) GEAR_WORD(a3.w, 60)
}

/* data: position 0 of the buffer, 16-byte aligned, with 64 readable bytes before it (the
   bytes of the stream before the buffer, `hist` of them valid). Candidates are reported
   for positions lo..n-1 (lo < 64: the bytes before lo are only rolled), written as
   pos_base + position. Blocks loop over the strips (grid-stride), so the gear table is
   staged in shared memory once per block: GEAR_COPIES copies, entry i of copy c at
   G[i * GEAR_COPIES + c], lane l reading copy l % 16, so that the 16 lanes of a half-warp
   hit 16 different bank pairs whatever bytes they look up (no bank conflicts). */
extern "C" __global__ void gear_candidates(const u8* __restrict__ data, long long n,
                                           long long lo, int hist, long long pos_base,
                                           const u64* __restrict__ gear, u32 mask_l_hi,
                                           u32 mask_s_hi, u32* __restrict__ out, u32 cap,
                                           u32* __restrict__ count) {
    __shared__ u64 G_all[256 * GEAR_COPIES];
    for (int i = threadIdx.x; i < 256 * GEAR_COPIES; i += blockDim.x)
        G_all[i] = gear[i / GEAR_COPIES];
    __syncthreads();
    const u64* G = G_all + (threadIdx.x % GEAR_COPIES);
    long long nstrips = (n + GEAR_STRIP - 1) / GEAR_STRIP;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < nstrips;
         t += stride) {
        long long s = t * GEAR_STRIP;
        long long e = lmin(s + GEAR_STRIP, n);
        u64 h = 0;
        long long w0 = lmax(s - 64, -(long long)hist);
        if (w0 == s - 64 && s >= lo) {
            const uint4* w = (const uint4*)(data + s - 64);
            gear_block<false>(h, G, __ldg(w), __ldg(w + 1), __ldg(w + 2), __ldg(w + 3), 0,
                              mask_l_hi, mask_s_hi, out, cap, count);
            const uint4* p = (const uint4*)(data + s);
            long long nfull = (e - s) >> 6;
            uint4 a0, a1, a2, a3;
            if (nfull > 0) {
                a0 = __ldg(p); a1 = __ldg(p + 1); a2 = __ldg(p + 2); a3 = __ldg(p + 3);
            }
            for (long long b = 0; b < nfull; ++b) {
                uint4 c0 = a0, c1 = a1, c2 = a2, c3 = a3;
                if (b + 1 < nfull) {
                    const uint4* q = p + 4 * (b + 1);
                    c0 = __ldg(q); c1 = __ldg(q + 1); c2 = __ldg(q + 2); c3 = __ldg(q + 3);
                }
                gear_block<true>(h, G, a0, a1, a2, a3, pos_base + s + 64 * b, mask_l_hi,
                                 mask_s_hi, out, cap, count);
                a0 = c0; a1 = c1; a2 = c2; a3 = c3;
            }
            for (long long q = s + 64 * nfull; q < e; ++q) {
                h = (h << 1) + G[GEAR_COPIES * data[q]];
                u32 hi = (u32)(h >> 32);
                if ((hi & mask_l_hi) == 0u)
                    gear_record(pos_base + q, hi, mask_s_hi, out, cap, count);
            }
        } else {
            /* The stream's first strip (fewer than 64 bytes before it) or the strip
               holding lo: byte by byte. */
            long long from = lmax(s, lo);
            for (long long q = w0; q < e; ++q) {
                h = (h << 1) + G[GEAR_COPIES * data[q]];
                u32 hi = (u32)(h >> 32);
                if (q >= from && (hi & mask_l_hi) == 0u)
                    gear_record(pos_base + q, hi, mask_s_hi, out, cap, count);
            }
        }
    }
}

/* ---------------------------------------------------------------- BLAKE3 */

@IV_DEFINES@

#define B3ROT(x, n) __funnelshift_r((x), (x), (n))
#define B3G(a, b, c, d, x, y)                                                      \
    a = a + b + (x); d = B3ROT(d ^ a, 16); c = c + d; b = B3ROT(b ^ c, 12);        \
    a = a + b + (y); d = B3ROT(d ^ a, 8);  c = c + d; b = B3ROT(b ^ c, 7);

__device__ __forceinline__ void b3_compress(u32 cv[8], const u32 m[16], u32 ctr_lo,
                                            u32 ctr_hi, u32 blen, u32 flags) {
    u32 v0 = cv[0], v1 = cv[1], v2 = cv[2], v3 = cv[3];
    u32 v4 = cv[4], v5 = cv[5], v6 = cv[6], v7 = cv[7];
    u32 v8 = B3_IV0, v9 = B3_IV1, v10 = B3_IV2, v11 = B3_IV3;
    u32 v12 = ctr_lo, v13 = ctr_hi, v14 = blen, v15 = flags;
@ROUNDS@
    cv[0] = v0 ^ v8; cv[1] = v1 ^ v9; cv[2] = v2 ^ v10; cv[3] = v3 ^ v11;
    cv[4] = v4 ^ v12; cv[5] = v5 ^ v13; cv[6] = v6 ^ v14; cv[7] = v7 ^ v15;
}

__device__ __forceinline__ void b3_iv(u32 cv[8]) {
    cv[0] = B3_IV0; cv[1] = B3_IV1; cv[2] = B3_IV2; cv[3] = B3_IV3;
    cv[4] = B3_IV4; cv[5] = B3_IV5; cv[6] = B3_IV6; cv[7] = B3_IV7;
}

/* 64 bytes from any address p, little-endian words: five aligned 16-byte loads from
   p & ~15 (reads up to 79 bytes past p), then word selects and a funnel shift. */
__device__ __forceinline__ void b3_load(const u8* p, u32 m[16]) {
    unsigned long long addr = (unsigned long long)p;
    const uint4* q = (const uint4*)(addr & ~15ull);
    uint4 x0 = __ldg(q), x1 = __ldg(q + 1), x2 = __ldg(q + 2), x3 = __ldg(q + 3),
          x4 = __ldg(q + 4);
    u32 w[20] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w, x2.x, x2.y,
                 x2.z, x2.w, x3.x, x3.y, x3.z, x3.w, x4.x, x4.y, x4.z, x4.w};
    u32 sel = (u32)(addr >> 2) & 3u;
    u32 sh = ((u32)addr & 3u) * 8u;
    u32 x[17];
#pragma unroll
    for (int k = 0; k < 17; ++k)
        x[k] = sel == 0u ? w[k] : sel == 1u ? w[k + 1] : sel == 2u ? w[k + 2] : w[k + 3];
#pragma unroll
    for (int j = 0; j < 16; ++j) m[j] = __funnelshift_r(x[j], x[j + 1], sh);
}

/* The chaining value (or, with root, the digest) of one 1 KiB BLAKE3 chunk of `len`
   (0..1024) bytes at p, chunk counter `counter`. */
__device__ __forceinline__ void b3_leaf(const u8* p, long long len, u64 counter, bool root,
                                        u32 cv[8]) {
    b3_iv(cv);
    int nb = len == 0 ? 1 : (int)((len + 63) >> 6);
#pragma unroll 1
    for (int b = 0; b < nb; ++b) {
        int blen = (int)lmin(64, len - 64 * (long long)b);
        u32 m[16];
        if (blen > 0) {
            b3_load(p + 64 * b, m);
        } else {
#pragma unroll
            for (int j = 0; j < 16; ++j) m[j] = 0u;
        }
        if (blen < 64) {
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                int k = blen - 4 * j;
                if (k <= 0) m[j] = 0u;
                else if (k < 4) m[j] &= (1u << (8 * k)) - 1u;
            }
        }
        u32 flags = (b == 0 ? 1u : 0u) | (b == nb - 1 ? 2u : 0u) |
                    ((root && b == nb - 1) ? 8u : 0u);
        b3_compress(cv, m, (u32)counter, (u32)(counter >> 32), (u32)blen, flags);
    }
}

__device__ __forceinline__ void b3_parent(const u32* l, const u32* r, bool root, u32 out[8]) {
    u32 m[16];
#pragma unroll
    for (int k = 0; k < 8; ++k) { m[k] = l[k]; m[k + 8] = r[k]; }
    b3_iv(out);
    b3_compress(out, m, 0u, 0u, 64u, 4u | (root ? 8u : 0u));
}

/* Merge the cnt nodes of this thread's group (threads [t - local, t - local + size) of the
   block, nodes in s_cv at those thread indices) pairwise, an odd node carried up, until
   one is left at the group's first index. With root, the last merge is the root: its
   output goes to digest. Every thread of the block calls it with the same size (it
   holds barriers). */
__device__ __forceinline__ void b3_reduce(u32* s_cv, int local, int size, int cnt, bool root,
                                          u32* __restrict__ digest) {
    int t = threadIdx.x;
    for (int step = 1; step < size; step <<= 1) {
        if ((local & (2 * step - 1)) == 0 && local + step < cnt) {
            u32 o[8];
            bool last = root && 2 * step >= cnt;
            b3_parent(s_cv + t * CV_STRIDE, s_cv + (t + step) * CV_STRIDE, last, o);
            if (last) {
#pragma unroll
                for (int k = 0; k < 8; ++k) digest[k] = o[k];
            } else {
#pragma unroll
                for (int k = 0; k < 8; ++k) s_cv[t * CV_STRIDE + k] = o[k];
            }
        }
        __syncthreads();
    }
}

/* Largest i in [0, n) with prefix[i] <= g (prefix non-decreasing, prefix[0] == 0). */
__device__ __forceinline__ int b3_find(const long long* __restrict__ prefix, int n, long long g) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (prefix[mid] <= g) lo = mid; else hi = mid - 1;
    }
    return lo;
}

/* Content chunk c: bytes base[offs[c] .. offs[c] + lens[c]), leaf groups
   grp0[c] .. grp0[c+1] of 2^glog leaves each (glog 4..6: small content chunks use small
   groups, so fewer threads idle). A block of LEAF_GROUP threads holds
   LEAF_GROUP >> glog groups. */
extern "C" __global__ void b3_leaves(const u8* __restrict__ base,
                                     const long long* __restrict__ offs,
                                     const long long* __restrict__ lens,
                                     const long long* __restrict__ grp0, int nchunks,
                                     long long ngroups, int glog,
                                     u32* __restrict__ gcv, u32* __restrict__ digests) {
    __shared__ u32 s_cv[LEAF_GROUP * CV_STRIDE];
    int size = 1 << glog;
    int t = threadIdx.x;
    int local = t & (size - 1);
    long long g = (long long)blockIdx.x * (LEAF_GROUP >> glog) + (t >> glog);
    bool active = g < ngroups;
    int c = 0, cnt = 0;
    bool single = true;
    if (active) {
        c = b3_find(grp0, nchunks, g);
        long long len = lens[c];
        long long nleaves = len == 0 ? 1 : (len + 1023) >> 10;
        long long first = (g - grp0[c]) << glog;
        cnt = (int)lmin(size, nleaves - first);
        single = nleaves <= size;
        if (local < cnt) {
            long long leaf = first + local;
            long long lo = leaf << 10;
            u32 cv[8];
            b3_leaf(base + offs[c] + lo, lmin(1024, len - lo), (u64)leaf, nleaves == 1, cv);
#pragma unroll
            for (int k = 0; k < 8; ++k) s_cv[t * CV_STRIDE + k] = cv[k];
            if (nleaves == 1) {
#pragma unroll
                for (int k = 0; k < 8; ++k) digests[8 * (long long)c + k] = cv[k];
            }
        }
    }
    __syncthreads();
    b3_reduce(s_cv, local, size, cnt, single, digests + 8 * (long long)c);
    if (active && local == 0 && !single) {
#pragma unroll
        for (int k = 0; k < 8; ++k) gcv[8 * g + k] = s_cv[t * CV_STRIDE + k];
    }
}

/* Active content chunk a (chunk index cid[a]): nodes in_cv[in0[a] .. in0[a] + cnt[a]),
   output groups grp0[a] .. grp0[a+1]. One block (LEAF_GROUP threads) per output group. */
extern "C" __global__ void b3_parents(const u32* __restrict__ in_cv,
                                      const long long* __restrict__ cid,
                                      const long long* __restrict__ in0,
                                      const long long* __restrict__ cnts,
                                      const long long* __restrict__ grp0, int nactive,
                                      u32* __restrict__ out_cv, u32* __restrict__ digests) {
    __shared__ u32 s_cv[LEAF_GROUP * CV_STRIDE];
    long long g = blockIdx.x;
    int a = b3_find(grp0, nactive, g);
    long long total = cnts[a];
    long long first = (g - grp0[a]) * LEAF_GROUP;
    int cnt = (int)lmin(LEAF_GROUP, total - first);
    bool single = total <= LEAF_GROUP;
    int t = threadIdx.x;
    if (t < cnt) {
        const u32* src = in_cv + 8 * (in0[a] + first + t);
#pragma unroll
        for (int k = 0; k < 8; ++k) s_cv[t * CV_STRIDE + k] = src[k];
    }
    __syncthreads();
    b3_reduce(s_cv, t, LEAF_GROUP, cnt, single, digests + 8 * cid[a]);
    if (t == 0 && !single) {
#pragma unroll
        for (int k = 0; k < 8; ++k) out_cv[8 * g + k] = s_cv[k];
    }
}
"""

SOURCE = (SOURCE.replace("@GEAR_STRIP@", str(GEAR_STRIP))
          .replace("@LEAF_GROUP@", str(LEAF_GROUP))
          .replace("@IV_DEFINES@", _IV_DEFINES)
          .replace("@ROUNDS@", _rounds()))

KERNEL_NAMES = ("gear_candidates", "b3_leaves", "b3_parents")
