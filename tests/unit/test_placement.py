"""Where a coded chunk's fragments go (mosafs.client.files.uploads.declustered): every
order is a permutation of the stripe, and consecutive chunks spread a benefactor's
partners evenly (what bounds the rebuild after its loss, docs/erasure_pools.md)."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from mosafs.client.files.uploads import declustered


@pytest.mark.parametrize(("n", "width"), [(n, w) for n in (3, 5, 7, 11, 13)
                                           for w in (2, 3, 6) if w <= n])
def test_every_pair_shares_as_many_chunks_when_the_stripe_is_prime(n: int, width: int) -> None:
    members = [f"b{i}" for i in range(n)]
    start = 12_345  # a session starts anywhere in the rotation
    pairs: Counter[tuple[str, str]] = Counter()
    for cursor in range(start, start + n * (n - 1)):
        order = declustered(members, cursor)
        assert sorted(order) == sorted(members)  # a permutation: fallbacks are the rest
        chunk = order[:width]
        pairs.update((a, b) for a in chunk for b in chunk if a != b)
    assert len(pairs) == n * (n - 1)  # every ordered pair meets
    assert len(set(pairs.values())) == 1, pairs  # and equally often


def test_partners_stay_nearly_even_on_a_stripe_of_eight() -> None:
    members = [f"b{i}" for i in range(8)]
    partners: Counter[str] = Counter()
    for cursor in range(8 * 4 * 10):  # phi(8) = 4
        chunk = declustered(members, cursor)[:6]
        if "b0" in chunk:
            partners.update(b for b in chunk if b != "b0")
    assert len(partners) == 7
    assert max(partners.values()) <= math.ceil(1.15 * min(partners.values())), partners


def test_small_stripes_keep_their_order() -> None:
    assert declustered(["a"], 5) == ["a"]
    assert declustered(["a", "b"], 5) == ["a", "b"]
    assert declustered([], 5) == []
