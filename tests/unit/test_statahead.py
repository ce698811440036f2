"""Stat-ahead (mosafs.client.files.statahead): the rule that starts a listing's fetch and
what the fetch leaves in the mount's cache. The pages come from a list here; the mount's
real path (a second mount stat'ing another's files) is tests/fuse/test_fuse_two_mounts.py.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

import trio

from mosafs._proto import manager_pb2 as mpb
from mosafs.client.files import statahead
from mosafs.client.files.attrcache import LISTING_ENTRIES, AttrCache
from mosafs.client.files.statahead import StatAhead
from mosafs.errors import AccessDenied


def _entries(n: int) -> list[mpb.DirEntry]:
    return [mpb.DirEntry(name=f"f{i}", attr=mpb.Attr(inode=100 + i, size=i)) for i in range(n)]


class Directory:
    """Pages of N entries, 1,000 to a page, as ReadDir gives them; counts the pages read."""

    def __init__(self, n: int, error: Exception | None = None) -> None:
        self.entries = _entries(n)
        self.error = error
        self.pages_read = 0

    async def pages(self, inode: int) -> AsyncGenerator[Sequence[mpb.DirEntry], None]:
        if self.error is not None:
            raise self.error
        for at in range(0, len(self.entries), 1000):
            self.pages_read += 1
            await trio.lowlevel.checkpoint()
            yield self.entries[at:at + 1000]


def _run(directory: Directory, calls: list[tuple[float, int]],
         cache: AttrCache | None = None) -> tuple[StatAhead, AttrCache]:
    """found(parent) at each (time, parent) of CALLS; the fetches run to their end."""
    now = [0.0]
    cache = cache or AttrCache(1.0, 60.0, timer=lambda: now[0])
    cache.coherent = lambda: True

    async def main() -> StatAhead:
        async with trio.open_nursery() as nursery:
            ahead = StatAhead(cache, directory.pages,
                              lambda fn, *args: nursery.start_soon(fn, *args),
                              timer=lambda: now[0])
            for at, parent in calls:
                now[0] = at
                ahead.found(parent)
                await trio.sleep(0)
        return ahead

    return trio.run(main), cache


def test_four_found_names_in_a_second_fetch_the_listing() -> None:
    directory = Directory(500)
    ahead, cache = _run(directory, [(0.1 * i, 7) for i in range(statahead.MISSES)])
    assert ahead.fetches == 1 and directory.pages_read == 1
    assert cache.child(7, "f499") == 599
    got = cache.attr(599)
    assert got is not None and got.size == 499
    assert cache.listing(7) is not None  # whole: kept as a listing too


def test_found_names_spread_over_more_than_the_window_fetch_nothing() -> None:
    directory = Directory(500)
    spread = statahead.WINDOW_S * 1.5
    ahead, _ = _run(directory, [(spread * i, 7) for i in range(3 * statahead.MISSES)])
    assert ahead.fetches == 0 and directory.pages_read == 0


def test_each_directory_counts_its_own() -> None:
    directory = Directory(10)
    calls = [(0.0, parent) for _ in range(statahead.MISSES - 1) for parent in (7, 8, 9)]
    ahead, _ = _run(directory, calls)
    assert ahead.fetches == 0


def test_a_large_directory_is_fetched_up_to_its_first_entries_then_left_alone() -> None:
    directory = Directory(LISTING_ENTRIES + 2500)
    first = [(0.0, 7)] * statahead.MISSES
    again = [(1.0 + 0.01 * i, 7) for i in range(statahead.MISSES)]
    ahead, cache = _run(directory, first + again)
    assert ahead.fetches == 1, "a directory cut short was fetched again within QUIET_S"
    assert directory.pages_read == LISTING_ENTRIES // 1000
    assert cache.child(7, f"f{LISTING_ENTRIES - 1}") is not None
    assert cache.child(7, f"f{LISTING_ENTRIES}") is None
    assert cache.listing(7) is None  # not whole: no listing to hand to readdir


def test_a_refused_fetch_leaves_the_directory_alone() -> None:
    directory = Directory(10, error=AccessDenied("no read permission"))
    calls = [(0.01 * i, 7) for i in range(3 * statahead.MISSES)]
    ahead, cache = _run(directory, calls)
    assert ahead.fetches == 1
    assert cache.child(7, "f0") is None


def test_attributes_cached_already_are_not_replaced_by_the_listing() -> None:
    now = [0.0]
    cache = AttrCache(1.0, 60.0, timer=lambda: now[0])
    newer = mpb.Attr(inode=103, size=12345)
    cache.put_entry(7, "f3", newer, None)
    _run(Directory(10), [(0.0, 7)] * statahead.MISSES, cache)
    assert cache.attr(103) is newer
    assert cache.attr(104) is not None


def test_a_directory_being_fetched_is_not_fetched_twice() -> None:
    spawned: list[tuple[Any, ...]] = []
    cache = AttrCache(1.0, 60.0)
    ahead = StatAhead(cache, Directory(10).pages, lambda fn, *args: spawned.append(args))
    for _ in range(3 * statahead.MISSES):
        ahead.found(7)
    assert spawned == [(7,)] and ahead.fetches == 1


def test_a_fetch_across_a_change_here_in_its_directory_caches_nothing() -> None:
    """This mount renames a name of the directory while stat-ahead fetches its listing:
    the listing, which may still hold the old name, is not cached."""
    directory = Directory(500)
    now = [0.0]
    cache = AttrCache(1.0, 60.0, timer=lambda: now[0])
    cache.coherent = lambda: True
    asked, renamed = trio.Event(), trio.Event()

    async def pages(inode: int) -> AsyncGenerator[Sequence[mpb.DirEntry], None]:
        asked.set()
        await renamed.wait()  # the page comes back after the rename
        async for page in directory.pages(inode):
            yield page

    async def main() -> StatAhead:
        async with trio.open_nursery() as nursery:
            ahead = StatAhead(cache, pages, lambda fn, *args: nursery.start_soon(fn, *args),
                              timer=lambda: now[0])
            for _ in range(statahead.MISSES):
                ahead.found(7)
            await asked.wait()
            cache.drop_entry(7, "f3")  # a rename of f3 here, meanwhile
            renamed.set()
        return ahead

    ahead = trio.run(main)
    assert ahead.fetches == 1 and directory.pages_read == 1
    assert cache.listing(7) is None and cache.child(7, "f3") is None
    assert cache.child(7, "f4") is None  # nothing of that listing is kept
