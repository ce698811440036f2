"""The GPU backend's host side, on any machine: cut selection over sparse candidates
(split into buffers at random points, the open chunk carried) equals the CPU chunker,
and the BLAKE3 tree plan has the shape the kernels expect."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from mosafs.chunking import make_chunker, parse_spec
from mosafs.chunking.gear import GEAR
from mosafs.chunking.gpu_kernels import LEAF_GROUP
from mosafs.chunking.gpu_select import fixed_cuts, leaf_group_log, select_cuts, tree_plan

from .conftest import mixed


def candidates(data: bytes, mask_l: int, mask_s: int) -> np.ndarray:
    """What the gear kernel reports: pos << 1 | strict for every loose hit (sorted)."""
    g = GEAR[np.frombuffer(data, dtype=np.uint8)]
    h = np.zeros(len(data), dtype=np.uint64)
    for k in range(min(64, len(data))):
        h[k:] += g[:len(data) - k] << np.uint64(k)
    pos = np.flatnonzero((h & np.uint64(mask_l)) == 0)
    strict = (h[pos] & np.uint64(mask_s)) == 0
    return (pos.astype(np.uint32) << np.uint32(1)) | strict.astype(np.uint32)


@pytest.mark.parametrize("text", ["cdc:1:256:1024", "cdc:64:256:2048", "cdc:256:256:256",
                                  "cdc:300:512:700", "cdc:2048:8192:32768",
                                  "cdc:4096:65536:262144", "fixed:1000", "fixed:1"])
def test_selection_over_buffers_equals_cpu(text: str) -> None:
    spec = parse_spec(text)
    rng = random.Random(text)
    for data in (rng.randbytes(400_000), mixed(rng, 400_000), bytes(100_000), b"", b"x"):
        want = [c.offset + c.length for c in make_chunker(spec, "cpu").chunk_all(data)]
        cands = (candidates(data, spec.mask_l, spec.mask_s) if spec.kind == "cdc"
                 else np.zeros(0, dtype=np.uint32))
        pos = cands >> np.uint32(1)
        for _ in range(5):
            points = sorted(rng.sample(range(1, max(2, len(data))), min(len(data) - 1, 12))
                            if len(data) > 1 else [])
            bounds = [0, *points, len(data)]
            cuts: list[int] = []
            start = 0  # stream offset of the open chunk
            for i, (a, b) in enumerate(itertools.pairwise(bounds)):
                mine = cands[(pos >= a) & (pos < b)]
                rel = ((mine >> np.uint32(1)) - np.uint32(a)) << np.uint32(1) | (mine & 1)
                found, new_start = select_cuts(rel.astype(np.uint32), b - a, start - a, spec,
                                               final=(i == len(bounds) - 2))
                cuts += [a + c for c in found]
                start = a + new_start
            assert cuts == want, (text, bounds)


def test_fixed_cuts() -> None:
    assert fixed_cuts(10, 0, 3, False) == ([3, 6, 9], 9)
    assert fixed_cuts(10, 0, 3, True) == ([3, 6, 9, 10], 10)
    assert fixed_cuts(5, -2, 3, False) == ([1, 4], 4)
    assert fixed_cuts(0, 0, 3, True) == ([], 0)


def test_tree_plan_shapes() -> None:
    lengths = np.array([0, 1, 1024, 1025, 64 * 1024, 64 * 1024 + 1, 4 * 1024 * 1024 + 3,
                        64 * 1024 * 1024], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    plan = tree_plan(offsets, lengths, leaf_log=6)
    leaves = np.maximum(1, (lengths + 1023) // 1024)
    groups = (leaves + LEAF_GROUP - 1) // LEAF_GROUP
    assert plan.nchunks == len(lengths)
    assert plan.ngroups0 == int(groups.sum())
    meta = plan.meta
    assert list(meta[:len(lengths)]) == list(offsets)
    assert list(meta[len(lengths):2 * len(lengths)]) == list(lengths)
    # Chunks of 65, 4097 and 65536 leaves have 2, 65 and 1024 groups: the first finishes
    # at level 1, the others (2 and 16 groups left) at level 2.
    assert [lv.nactive for lv in plan.levels] == [3, 2]
    assert plan.levels[0].ngroups == 1 + 2 + 16
    assert plan.levels[1].ngroups == 2
    empty = tree_plan(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert empty.nchunks == 0 and empty.ngroups0 == 0 and empty.levels == []


def test_leaf_group_size_follows_chunk_sizes() -> None:
    def log_for(kib: list[int]) -> int:
        return leaf_group_log(np.maximum(1, np.array(kib, dtype=np.int64)))

    assert log_for([1024] * 10) == 6          # 1 MiB chunks: full groups of 64
    assert log_for([16] * 100) == 4           # 16 KiB chunks: groups of 16
    assert log_for([20, 30, 17, 25] * 10) == 5
    assert leaf_group_log(np.zeros(0, dtype=np.int64)) == 6
    plan = tree_plan(np.zeros(3, dtype=np.int64), np.array([0, 16 << 10, 40 << 10]))
    assert plan.leaf_log == 4 and plan.ngroups0 == 1 + 1 + 3
    assert [lv.nactive for lv in plan.levels] == [1]  # the 40 KiB chunk: 3 groups of 16
