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
