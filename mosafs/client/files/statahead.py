"""Stat-ahead: a directory whose names are being looked up one after another gets its
listing fetched in the background, so that the lookups after it are answered from the
cache (docs/client.md, "Stat-ahead").

A program that stats the files of a directory this mount has not listed (a job restarting
from a checkpoint another node wrote, `find`, a backup's scan) sends the kernel one LOOKUP
per name, and each was one manager call: about 2,300 stats/s with eight processes on the
2-CPU machine, against 20,000 for names the mount holds (docs/benchmarks.md, "Metadata").
A listing page carries 1,000 entries with their attributes for about the manager's cost of
a few lookups. Lustre's statahead and NFS's READDIRPLUS heuristics answer the same
pattern the same way.

The rule: when MISSES lookups in one directory, within WINDOW_S, went to the manager and
found their name, the directory's listing is fetched (its first LISTING_ENTRIES entries,
ten pages, at most) while the lookups go on. Lookups of names the manager did not find do
not count: a loop creating new names (each create's LOOKUP finds nothing) must not fetch
a growing directory again and again. A fetch whose directory had more entries than that,
or that failed (permission, an unreachable manager), is not repeated for that directory
for QUIET_S. Entries fetched live as a listing's entries do (mosafs.client.files.
attrcache: the coherent timeout while the caches are coherent, else the attribute
timeout); nothing waits for a fetch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing

from mosafs._proto import manager_pb2 as mpb
from mosafs.client.files.attrcache import LISTING_ENTRIES, AttrCache, TtlDict
from mosafs.errors import MosafsError

log = logging.getLogger(__name__)

MISSES = 4          # lookups that found their name at the manager, in one directory ...
WINDOW_S = 1.0      # ... within this long, start a fetch of its listing
QUIET_S = 10.0      # a directory whose fetch failed or was cut short rests this long
TRACKED = 1024      # directories whose misses are counted at once (then forgotten)

Pages = Callable[[int], AsyncGenerator[Sequence[mpb.DirEntry], None]]
Spawn = Callable[..., None]


class StatAhead:
    """PAGES(inode): the directory's listing, a page at a time (ManagerClient.
    readdir_pages); SPAWN(fn, *args): start a background task (ClientContext.spawn)."""

    def __init__(self, cache: AttrCache, pages: Pages, spawn: Spawn,
                 timer: Callable[[], float] = time.monotonic) -> None:
        self._cache = cache
        self._pages = pages
        self._spawn = spawn
        self._timer = timer
        self._misses: dict[int, tuple[int, float]] = {}  # directory -> (count, since)
        self._fetching: set[int] = set()
        self._quiet: TtlDict[int, bool] = TtlDict(TRACKED, QUIET_S, timer)
        self.fetches = 0  # started, for the mount's figures and tests

    def found(self, parent: int) -> None:
        """A lookup in directory PARENT went to the manager and found its name."""
        if parent in self._fetching or self._quiet.get(parent) or \
                self._cache.listing(parent) is not None:
            return
        now = self._timer()
        count, since = self._misses.get(parent, (0, now))
        if now - since > WINDOW_S:
            count, since = 0, now
        count += 1
        if count < MISSES:
            if len(self._misses) >= TRACKED and parent not in self._misses:
                self._misses.clear()
            self._misses[parent] = (count, since)
            return
        self._misses.pop(parent, None)
        self._fetching.add(parent)
        self.fetches += 1
        self._spawn(self._fetch, parent)

    async def _fetch(self, parent: int) -> None:
        mark = self._cache.mark()  # before the first page is asked for
        entries: list[mpb.DirEntry] = []
        whole = False
        try:
            pages = self._pages(parent)
            async with aclosing(pages):
                async for page in pages:
                    entries.extend(page)
                    if len(entries) >= LISTING_ENTRIES:
                        break
                else:
                    whole = True
        except MosafsError as exc:
            log.debug("stat-ahead of directory %d: %s", parent, exc)
            self._quiet[parent] = True
            return
        finally:
            self._fetching.discard(parent)
        if whole:
            self._cache.put_listing(parent, entries, mark)
        else:
            self._cache.put_entries(parent, entries, mark)
            self._quiet[parent] = True

