"""A directory listing that grows as its pages arrive (mosafs.client.files.listing): a
reader ahead of the pages waits for them, an error ends the listing after the entries that
came, and a listing whose handle went stops fetching."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import pytest
import trio

from mosafs._proto import manager_pb2 as mpb
from mosafs.client.files.listing import Listing
from mosafs.errors import Unavailable


def page(first: int, n: int) -> list[mpb.DirEntry]:
    return [mpb.DirEntry(name=f"e{i}", attr=mpb.Attr(inode=i + 2)) for i in range(first, first + n)]


async def pages(count: int, *, fail_at: int = -1,
                fetched: list[int] | None = None) -> AsyncGenerator[list[mpb.DirEntry], None]:
    for p in range(count):
        await trio.sleep(0.01)
        if p == fail_at:
            raise Unavailable("the manager went away")
        if fetched is not None:
            fetched.append(p)
        yield page(10 * p, 10)


async def read_all(listing: Listing) -> list[str]:
    names, index = [], 0
    while (entry := await listing.entry(index)) is not None:
        names.append(entry.name)
        index += 1
    return names


def test_a_reader_ahead_of_the_pages_waits_for_them() -> None:
    completed: list[list[mpb.DirEntry]] = []

    async def main() -> list[str]:
        listing = Listing(page(0, 0), done=False)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listing.fill, pages(5), completed.append)
            return await read_all(listing)

    assert trio.run(main) == [f"e{i}" for i in range(50)]
    assert len(completed) == 1 and len(completed[0]) == 50


def test_an_error_ends_the_listing_after_the_entries_that_came() -> None:
    completed: list[list[mpb.DirEntry]] = []

    async def main() -> tuple[list[str], Listing]:
        listing = Listing(done=False)
        got: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listing.fill, pages(5, fail_at=3), completed.append)
            with pytest.raises(Unavailable, match="went away"):
                index = 0
                while (entry := await listing.entry(index)) is not None:
                    got.append(entry.name)
                    index += 1
        return got, listing

    got, listing = trio.run(main)
    assert got == [f"e{i}" for i in range(30)]
    assert listing.done and completed == []  # an incomplete listing is not cached


def test_an_abandoned_listing_stops_fetching() -> None:
    fetched: list[int] = []
    completed: list[list[mpb.DirEntry]] = []

    async def main() -> None:
        listing = Listing(done=False)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listing.fill, pages(100, fetched=fetched), completed.append)
            assert (await listing.entry(0)) is not None
            listing.abandoned = True

    trio.run(main)
    assert len(fetched) <= 2 and completed == []
