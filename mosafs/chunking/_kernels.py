"""Compiled gear-hash scan for the CPU backend (numba, no GIL held while it runs).

Why it is shaped like this (measured on a 2.6 GHz Xeon, see docs/chunking.md):

* The rolling form `h = (h << 1) + G[b]` is a chain of two dependent additions per byte,
  so one hash runs at about 2 cycles a byte (~1.4 GB/s) however the loop is unrolled:
  LLVM folds any "two bytes a step" rewrite back into the same chain.
* The windowed definition (h_p depends only on bytes p-63..p) lets independent hashes run
  side by side: a block of 4 lanes x LANE bytes is scanned as 4 interleaved chains, each
  started 63 bytes before its lane. The CPU overlaps the chains: ~3 GB/s, plus 63 bytes
  of warm-up per lane (1.5 %).
* The loop only asks "did any lane hit?"; cut points are rare, so when one does the block
  is rescanned lane by lane with the plain scalar loop to find the first hit in stream
  order. The hot loop keeps no per-lane bookkeeping (that spilled registers and cost 40 %).
* Indexing goes through slices walked from 0, so LLVM can prove indices non-negative and
  drops numba's negative-index wraparound code.

Every function takes buffer-relative positions. Rolling starts at max(0, lo - 63): either
63 bytes of history are there, or position 0 of the buffer is position 0 of the stream
(the caller keeps that invariant; positions before the stream are absent, DESIGN §5).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np

_ONE = np.uint64(1)
_ZERO = np.uint64(0)
_HISTORY = 63
LANE = 4096
"""Bytes per lane and block step; regions shorter than LANES * LANE run the scalar loop."""
LANES = 4


def _jit(fn: Callable[..., Any]) -> Any:
    """njit without the GIL, cached on disk when a cache directory can be had.

    numba refuses `cache=True` at decoration time when neither the package's __pycache__
    nor a user cache directory is writable (a read-only install for a daemon user); the
    chunker must still work there, compiled at first use instead.
    """
    try:
        return numba.njit(nogil=True, cache=True)(fn)
    except RuntimeError:
        return numba.njit(nogil=True)(fn)


@_jit
def first_hit_scalar(data, gear, mask, lo, hi):  # type: ignore[no-untyped-def]
    """The first p in [lo, hi) with h_p & mask == 0, or -1: one rolling hash."""
    h = _ZERO
    warm = data[max(0, lo - _HISTORY):lo]
    for i in range(warm.shape[0]):
        h = (h << _ONE) + gear[warm[i]]
    seg = data[lo:hi]
    for i in range(seg.shape[0]):
        h = (h << _ONE) + gear[seg[i]]
        if (h & mask) == _ZERO:
            return lo + i
    return -1


@_jit
def _warm(data, gear, lo, hi):  # type: ignore[no-untyped-def]
    h = _ZERO
    seg = data[lo:hi]
    for i in range(seg.shape[0]):
        h = (h << _ONE) + gear[seg[i]]
    return h


@_jit
def first_hit(data, gear, mask, lo, hi):  # type: ignore[no-untyped-def]
    """The first p in [lo, hi) with h_p & mask == 0, or -1: 4 interleaved lanes."""
    p = lo
    while hi - p >= LANES * LANE:
        h0 = _warm(data, gear, max(0, p - _HISTORY), p)
        h1 = _warm(data, gear, p + LANE - _HISTORY, p + LANE)
        h2 = _warm(data, gear, p + 2 * LANE - _HISTORY, p + 2 * LANE)
        h3 = _warm(data, gear, p + 3 * LANE - _HISTORY, p + 3 * LANE)
        blk = data[p:p + LANES * LANE]
        hit = -1
        # Two bytes per iteration halves the loop overhead; one branch covers both.
        for j in range(0, LANE, 2):
            h0 = (h0 << _ONE) + gear[blk[j]]
            h1 = (h1 << _ONE) + gear[blk[j + LANE]]
            h2 = (h2 << _ONE) + gear[blk[j + 2 * LANE]]
            h3 = (h3 << _ONE) + gear[blk[j + 3 * LANE]]
            first = (((h0 & mask) == _ZERO) | ((h1 & mask) == _ZERO)
                     | ((h2 & mask) == _ZERO) | ((h3 & mask) == _ZERO))
            h0 = (h0 << _ONE) + gear[blk[j + 1]]
            h1 = (h1 << _ONE) + gear[blk[j + 1 + LANE]]
            h2 = (h2 << _ONE) + gear[blk[j + 1 + 2 * LANE]]
            h3 = (h3 << _ONE) + gear[blk[j + 1 + 3 * LANE]]
            if (first | ((h0 & mask) == _ZERO) | ((h1 & mask) == _ZERO)
                    | ((h2 & mask) == _ZERO) | ((h3 & mask) == _ZERO)):
                hit = j
                break
        if hit >= 0:
            # No lane hit before offset `hit`, so each lane's first hit is at or after it;
            # the earliest lane with one holds the first hit in stream order.
            for k in range(LANES):
                r = first_hit_scalar(data, gear, mask, p + k * LANE + hit, p + (k + 1) * LANE)
                if r >= 0:
                    return r
        p += LANES * LANE
    return first_hit_scalar(data, gear, mask, p, hi)


@_jit
def find_cuts(data, gear, start, scan, min_size, avg_size, max_size,  # type: ignore[no-untyped-def]
              mask_s, mask_l, out):
    """Content-defined cut points in `data` (DESIGN §5 selection), up to len(out) of them.

    `start` is where the current chunk begins and `scan` the first position whose hash is
    not yet known to miss (both relative to data). Positions below start + MIN - 1 are
    never hashed: no cut can end there, and h_p needs only the 63 bytes before p. Returns
    (count, start, scan) with cut ends in out[:count]; the chunk from the returned start
    has no cut yet and needs more data (or is the stream's last chunk).
    """
    n = data.shape[0]
    count = 0
    while count < out.shape[0]:
        scan = max(scan, start + min_size - 1)
        small_end = start + avg_size - 1  # first position where size >= AVG
        end = start + max_size
        cut = -1
        lim = min(small_end, n)
        if scan < lim:
            hit = first_hit(data, gear, mask_s, scan, lim)
            if hit >= 0:
                cut = hit + 1
            else:
                scan = lim
        if cut < 0 and scan >= small_end:
            lim = min(end, n)
            if scan < lim:
                hit = first_hit(data, gear, mask_l, scan, lim)
                if hit >= 0:
                    cut = hit + 1
                else:
                    scan = lim
            if cut < 0 and scan >= end:
                cut = end
        if cut < 0:
            break
        out[count] = cut
        count += 1
        start = cut
        scan = cut
    return count, start, scan


@_jit
def count_hits(data, gear, mask):  # type: ignore[no-untyped-def]
    """How many positions of data have h_p & mask == 0: the scan alone, for benchmarks."""
    count = 0
    p = 0
    n = data.shape[0]
    while p < n:
        r = first_hit(data, gear, mask, p, n)
        if r < 0:
            break
        count += 1
        p = r + 1
    return count
