"""Host-side parts of the GPU backend that need no GPU: cut selection over the sparse
candidates the gear kernel finds, and the launch plan of the BLAKE3 tree kernels.

Importing this module imports numpy only; numba is imported when the CDC selection is
first compiled (`select_cuts`), CuPy never.

Selection (DESIGN §5) is sequential but looks only at candidates: a candidate is a
position whose hash passes the loose mask (top L-2 bits zero), flagged strict when it
also passes the strict one (top L+2 bits; MASK_L is a subset of MASK_S, so every strict
hit is a candidate). From a chunk start s the chunk ends after the first strict
candidate p with s + MIN - 1 <= p < s + AVG - 1, else after the first candidate with
max(s + MIN - 1, s + AVG - 1) <= p < s + MAX, else at s + MAX. A buffer's candidates
are consumed once: when the rule cannot decide yet, every candidate seen so far is known
not to matter for any later chunk start.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from mosafs.chunking.gpu_kernels import LEAF_GROUP, LEAF_GROUP_LOGS
from mosafs.chunking.spec import ChunkerSpec

I64 = npt.NDArray[np.int64]
CUTS_PER_CALL = 1 << 16
"""Cut ends returned per call of the compiled selection (bounds its output array)."""


def _select_py(cands, ncand, i, n, start, min_size, avg_size, max_size,  # type: ignore[no-untyped-def]
               final, out):
    """Cut ends after `start` (buffer-relative, may be negative: the open chunk began in
    an earlier buffer) given the sorted candidates of positions [.., n) not yet consumed.

    cands[i:ncand] hold `pos << 1 | strict`, sorted. `final`: the stream ends at n, so
    the last chunk ends there. Returns (count, start, i): cut ends in out[:count], the
    open chunk's start and the first unconsumed candidate. Stops early when out is full.
    """
    count = 0
    cap = out.shape[0]
    while count < cap and start < n:
        lo = start + min_size - 1
        small_end = start + avg_size - 1
        end = start + max_size
        while i < ncand and (cands[i] >> 1) < lo:
            i += 1
        j = i
        cut = -1
        while j < ncand:
            p = cands[j] >> 1
            if p >= small_end:
                break
            if cands[j] & 1:
                cut = p + 1
                break
            j += 1
        if cut < 0:
            if j >= ncand and small_end > n:
                # The strict range runs past the known bytes: undecided unless they end.
                if final:
                    cut = n if end > n else end
                else:
                    break
            elif j < ncand and (cands[j] >> 1) < end:
                cut = (cands[j] >> 1) + 1  # first candidate at or after the strict range
            elif end <= n:
                cut = end
            elif final:
                cut = n
            else:
                break
        out[count] = cut
        count += 1
        start = cut
        i = j
    return count, start, i


@functools.cache
def _compiled() -> Callable[..., Any]:
    from mosafs.chunking._kernels import _jit

    return _jit(_select_py)  # type: ignore[no-any-return]


def select_cuts(cands: npt.NDArray[np.uint32], n: int, start: int, spec: ChunkerSpec,
                final: bool) -> tuple[list[int], int]:
    """All cut ends (buffer-relative) that the candidates of positions < n decide, and the
    new open-chunk start. `cands` sorted, each `pos << 1 | strict`."""
    if spec.kind == "fixed":
        return fixed_cuts(n, start, spec.max_size, final)
    fn = _compiled()
    out = np.empty(min(CUTS_PER_CALL, (n - start) // spec.min_size + 2), dtype=np.int64)
    found: list[int] = []
    i = 0
    ncand = cands.shape[0]
    while True:
        count, start, i = fn(cands, ncand, i, n, start, spec.min_size, spec.avg_size,
                             spec.max_size, final, out)
        found.extend(out[:count].tolist())
        if count < out.shape[0]:
            return found, int(start)


def fixed_cuts(n: int, start: int, size: int, final: bool) -> tuple[list[int], int]:
    """Cut ends of a fixed chunker: every `size` bytes from the open chunk's start."""
    cuts = list(range(start + size, n + 1, size))
    if final and (cuts[-1] if cuts else start) < n:
        cuts.append(n)
    return cuts, (cuts[-1] if cuts else start)


@dataclass(slots=True)
class TreeLevel:
    """One launch of b3_parents: element offsets of its arrays in the packed metadata."""

    cid: int
    in0: int
    cnt: int
    grp0: int
    nactive: int
    ngroups: int


@dataclass(slots=True)
class TreePlan:
    """The BLAKE3 launches for a batch of content chunks (lengths known on the host).

    meta packs int64 arrays: offs, lens, grp0 (leaf groups per chunk, prefix), then per
    parent level cid, in0, cnt, grp0. Level 0 (b3_leaves) writes group chaining values to
    cv buffer 0, level k writes to buffer k % 2 and reads buffer (k - 1) % 2.
    """

    meta: I64
    nchunks: int
    ngroups0: int
    levels: list[TreeLevel]
    cv_words: tuple[int, int]
    leaf_log: int = 6
    """log2 of the leaves per group of b3_leaves."""


def leaf_group_log(nleaves: I64) -> int:
    """The leaf group size for these content chunks: the largest of 64, 32, 16 whose
    groups waste at most 15 % more thread slots than the best (idle threads of a chunk's
    last group cost as much as busy ones; larger groups mean fewer parent launches)."""
    if nleaves.shape[0] == 0:
        return LEAF_GROUP_LOGS[-1]
    slots = {log: int((((nleaves + (1 << log) - 1) >> log) << log).sum())
             for log in LEAF_GROUP_LOGS}
    best = min(slots.values())
    return max(log for log, used in slots.items() if used <= 1.15 * best)


def tree_plan(offsets: I64, lengths: I64, leaf_log: int | None = None) -> TreePlan:
    """Launch plan for BLAKE3 of content chunks base[offsets[i]:offsets[i] + lengths[i]]."""
    nc = int(lengths.shape[0])
    nleaves = np.maximum(1, (lengths + 1023) >> 10)
    log = leaf_group_log(nleaves) if leaf_log is None else leaf_log
    ng = (nleaves + (1 << log) - 1) >> log
    grp0 = np.zeros(nc + 1, dtype=np.int64)
    np.cumsum(ng, out=grp0[1:])
    parts: list[I64] = [offsets.astype(np.int64, copy=False),
                        lengths.astype(np.int64, copy=False), grp0]
    pos = 2 * nc + nc + 1
    levels: list[TreeLevel] = []
    cv_words = [int(grp0[-1]) * 8, 0]
    active = np.flatnonzero(ng > 1)
    in0 = grp0[:-1][active]
    cnt = ng[active]
    cid = active.astype(np.int64)
    while active.size:
        a = int(cid.shape[0])
        lng = (cnt + LEAF_GROUP - 1) // LEAF_GROUP
        lgrp0 = np.zeros(a + 1, dtype=np.int64)
        np.cumsum(lng, out=lgrp0[1:])
        parts += [cid, in0, cnt, lgrp0]
        levels.append(TreeLevel(pos, pos + a, pos + 2 * a, pos + 3 * a, a, int(lgrp0[-1])))
        pos += 4 * a + 1
        side = len(levels) % 2
        cv_words[side] = max(cv_words[side], int(lgrp0[-1]) * 8)
        keep = lng > 1
        active = np.flatnonzero(keep)
        cid = cid[keep]
        in0 = lgrp0[:-1][keep]
        cnt = lng[keep]
    meta = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return TreePlan(meta, nc, int(grp0[-1]), levels, (cv_words[0], cv_words[1]), log)
