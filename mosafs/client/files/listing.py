"""A directory listing that grows as its pages arrive (docs/client.md, "Directory
listings").

`opendir` waits for the first page only; the rest is fetched in the background while the
kernel reads what is there, so the manager's work on page n+1 overlaps the mount's on page
n (before, an `ls -l` of 100,000 entries spent the manager's CPU and then the mount's,
one after the other: docs/benchmarks.md, "Metadata"). A reader that gets ahead of the
pages waits for the next one; a page that fails ends the listing with the error, which the
next read past the entries already there raises.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing

import trio

from mosafs._proto import manager_pb2 as mpb
from mosafs.errors import MosafsError


class Listing:
    """EDITS: the attribute cache's edit count when the entries were read (a name of the
    directory changed here since makes them unfit to keep: AttrCache.edits)."""

    def __init__(self, entries: Sequence[mpb.DirEntry] = (), *, done: bool = True,
                 edits: int = -1) -> None:
        self.entries: list[mpb.DirEntry] = list(entries)
        self.edits = edits
        self.done = done
        self.error: MosafsError | None = None
        self.abandoned = False  # the handle went: stop fetching
        self._grown = trio.Event()

    def add(self, page: Sequence[mpb.DirEntry]) -> None:
        self.entries.extend(page)
        self._wake()

    def finish(self, error: MosafsError | None = None) -> None:
        self.done, self.error = True, error
        self._wake()

    def _wake(self) -> None:
        grown, self._grown = self._grown, trio.Event()
        grown.set()

    async def entry(self, index: int) -> mpb.DirEntry | None:
        """Entry INDEX once it has arrived; None past the end. Raises the error that
        ended the listing early."""
        while index >= len(self.entries):
            if self.done:
                if self.error is not None:
                    raise self.error
                return None
            await self._grown.wait()
        return self.entries[index]

    async def fill(self, pages: AsyncGenerator[Sequence[mpb.DirEntry], None],
                   complete: Callable[[list[mpb.DirEntry]], None]) -> None:
        """Add PAGES as they come; COMPLETE(entries) once the whole listing is here."""
        try:
            async with aclosing(pages):
                async for page in pages:
                    self.add(page)
                    if self.abandoned:
                        self.finish()
                        return
        except MosafsError as exc:
            self.finish(exc)
            return
        self.finish()
        complete(self.entries)
