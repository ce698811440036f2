"""The mount's attribute cache (mosafs.client.files.attrcache): a listing keeps all its
entries, and the names and attributes of its first LISTING_ENTRIES one by one (the kernel
has the others from the listing itself)."""

from __future__ import annotations

from mosafs._proto import manager_pb2 as mpb
from mosafs.client.files import attrcache
from mosafs.client.files.attrcache import AttrCache


def _entries(n: int) -> list[mpb.DirEntry]:
    return [mpb.DirEntry(name=f"f{i}", attr=mpb.Attr(inode=100 + i, size=i)) for i in range(n)]


def test_a_large_listing_caches_its_first_entries_one_by_one() -> None:
    cache = AttrCache(60.0)
    entries = _entries(attrcache.LISTING_ENTRIES + 5)
    cache.put_listing(7, entries)
    assert cache.listing(7) == entries  # the whole listing
    last = attrcache.LISTING_ENTRIES - 1
    assert cache.child(7, f"f{last}") == 100 + last
    kept = cache.attr(100 + last)
    assert kept is not None and kept.size == last
    assert cache.child(7, f"f{last + 1}") is None  # asked of the manager when needed
    assert cache.attr(100 + last + 1) is None


def test_a_small_listing_caches_every_entry() -> None:
    cache = AttrCache(60.0)
    cache.put_listing(7, _entries(3))
    assert [cache.child(7, f"f{i}") for i in range(3)] == [100, 101, 102]


def test_ttl_dict_expires_entries_and_empties_itself_when_full() -> None:
    from mosafs.client.files.attrcache import TtlDict

    now = [100.0]
    d: TtlDict[str, int] = TtlDict(3, 1.0, timer=lambda: now[0])
    d["a"] = 1
    now[0] += 0.5
    d["b"] = 2
    assert (d.get("a"), d.get("b")) == (1, 2)
    now[0] += 0.6  # a is 1.1 s old, b 0.6 s
    assert (d.get("a"), d.get("b")) == (None, 2)
    assert d.pop("b") == 2 and d.pop("b") is None and d.pop("x", 7) == 7
    for i, key in enumerate("cde"):
        d[key] = i
    d["c"] = 9  # a key it holds: no room needed
    assert len(d) == 3 and d.get("c") == 9
    d["f"] = 5  # full: emptied, then F
    assert len(d) == 1 and d.get("f") == 5 and d.get("c") is None
