"""The size of the manager's LMDB map (docs/metadata.md, "Map size"): it grows by itself
before it is full, up to a ceiling (`--map-size`) and the free space of the disk, and a
reserve below the ceiling is kept for the writes that free space.

- Growth: before every write transaction, when the file's high-water mark has passed half
  the map, the map doubles (at most to the ceiling and to what the disk can still hold).
  A transaction that finds the map full all the same (one larger than the whole store so
  far) grows it too and is run again by the store: it was aborted whole, so a second run
  is the first that counts.
- Reserve: writes that add namespace or versions (create, mkdir, commit, setxattr, ...)
  are refused with ENOSPC when the pages in use plus the reserve would pass the limit (the
  ceiling, or the disk). Every other write (unlink, rmdir, rename, garbage collection,
  registrations) may use the reserve, and one that still does not fit may grow the map
  past the ceiling, bounded by the disk: refusing a deletion would leave no way to free
  space without a restart.

Coordination: mdb_env_set_mapsize may only be called while this process has no
transaction open, and py-lmdb aborts (invalidates) the open ones, in every thread. So every
transaction of the store runs inside TransactionGate.shared(), and a resize takes
TransactionGate.exclusive(): new transactions wait, the open ones finish, the map is
resized, everyone goes on. A thread that holds a transaction never waits for a resize (it
would wait for itself); a resize that cannot get the store to itself within
DRAIN_TIMEOUT_S gives up (a reader may be waiting on something a blocked thread holds)
and is tried again later.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mosafs.errors import NoSpace

log = logging.getLogger(__name__)

MiB = 1 << 20
GiB = 1 << 30
INITIAL_MAX = 64 * MiB  # first map: half the ceiling, at most this
MIN_RESERVE = 256 * 1024  # 64 pages: a deletion of a small file, with room to spare
MAX_RESERVE = 1 * GiB
GROW_AT = 0.5  # grow once the high-water mark passes this fraction of the map
DRAIN_TIMEOUT_S = 2.0  # longest a resize waits for open transactions to end
RETRY_AFTER_S = 1.0  # after a resize gave up, before the next proactive attempt

DiskFree = Callable[[], int]


class MapGrown(NoSpace):
    """A write transaction found the map full and the map has grown since: the store runs
    the operation again. Should it reach a caller (a transaction it cannot re-run, such as
    fsck's), it is an ordinary ENOSPC that is worth retrying."""


def reserve_for(ceiling: int) -> int:
    """Bytes below CEILING that only writes freeing space may use: an eighth of it, within
    MIN_RESERVE..MAX_RESERVE."""
    return max(MIN_RESERVE, min(MAX_RESERVE, ceiling // 8))


def initial_size(ceiling: int) -> int:
    """The map a store opens with (LMDB raises it to the data's size when that is
    larger): half the ceiling, at most INITIAL_MAX, so that a small store stays small and
    growth is exercised from the start, not first after months."""
    return _pages(min(ceiling // 2, INITIAL_MAX))


def _pages(size: int) -> int:
    """SIZE rounded down to whole OS pages (what mdb_env_set_mapsize wants)."""
    return size - size % mmap.PAGESIZE


def disk_free_of(path: Path) -> DiskFree:
    def free() -> int:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize
    return free


class TransactionGate:
    """Many transactions at once, or one resize and no transaction. Re-entrant per thread
    for transactions (a transaction opened inside another passes at once)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0  # threads inside shared()
        self._resizing = False  # a resize waits or runs: new transactions wait
        self._local = threading.local()

    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)  # type: ignore[no-any-return]

    def held(self) -> bool:
        """Whether this thread is inside a transaction (and so may not resize)."""
        return self._depth() > 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        depth = self._depth()
        if depth == 0:
            with self._cond:
                while self._resizing:
                    self._cond.wait()
                self._active += 1
        self._local.depth = depth + 1
        try:
            yield
        finally:
            self._local.depth = depth
            if depth == 0:
                with self._cond:
                    self._active -= 1
                    if self._active == 0:
                        self._cond.notify_all()

    def exclusive(self, work: Callable[[], None], *, timeout: float = DRAIN_TIMEOUT_S) -> bool:
        """Run WORK with no transaction open in this process. False, without running it,
        when this thread holds a transaction or the open ones did not end in TIMEOUT."""
        if self.held():
            return False
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._resizing:  # another thread resizes: wait, then the caller rechecks
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    return False
            self._resizing = True
            try:
                while self._active:
                    if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                        return False
                work()
                return True
            finally:
                self._resizing = False
                self._cond.notify_all()


@dataclass(frozen=True)
class Figures:
    map_size: int  # bytes mapped
    high_water: int  # bytes up to the last page ever used: what the file holds
    disk_free: int  # bytes the file system can still give the file


class MapSizer:
    """Grows ENV's map and keeps the reserve (the policy above). DBS: every named
    sub-database (their pages are the store's live data)."""

    def __init__(self, env: Any, dbs: Sequence[Any], path: Path, ceiling: int, *,
                 disk_free: DiskFree | None = None) -> None:
        self.gate = TransactionGate()
        self.path = path
        self.ceiling = _pages(ceiling)
        self.reserve = reserve_for(self.ceiling)
        self._env = env
        self._dbs = list(dbs)
        self._disk_free = disk_free or disk_free_of(path)
        self._psize = int(env.stat()["psize"])
        self.map_size = int(env.info()["map_size"])  # changed only under exclusive()
        self._retry_at = 0.0
        self._refusing = False  # creates are refused now: log the change once
        if self.ceiling < self.map_size:
            log.warning("the metadata in %s already takes %d bytes, more than --map-size "
                        "%d: creates are refused until deletions free space", path,
                        self.map_size, self.ceiling)

    # -- figures ---------------------------------------------------------------------------

    def figures(self) -> Figures:
        with self.gate.shared():  # env.info() reads the map: never during a resize
            return self._figures_now()

    def _figures_now(self) -> Figures:
        """figures() for a caller that holds the gate (either way)."""
        info = self._env.info()
        return Figures(int(info["map_size"]), (int(info["last_pgno"]) + 1) * self._psize,
                       self._disk_free())

    def live_bytes(self) -> int:
        """Bytes of the pages the store's trees use now: the high-water mark less the free
        pages that LMDB reuses (a deletion shrinks this, never the file)."""
        with self.gate.shared(), self._env.begin() as txn:
            stats = [self._env.stat(), *(txn.stat(db) for db in self._dbs)]
        pages = sum(s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"] for s in stats)
        return (pages + 2) * self._psize  # + the two meta pages

    # -- before and after a write transaction ----------------------------------------------

    def prepare(self, *, grows: bool) -> None:
        """Before a write transaction: grow the map when its high-water mark passed
        GROW_AT; with GROWS (the write adds data), refuse it (NoSpace) when it would eat
        into the reserve."""
        fig = self.figures()
        # Decided on these figures first: going exclusive stalls every transaction, so it
        # happens only when there is room to grow into.
        if (fig.high_water > fig.map_size * GROW_AT and time.monotonic() >= self._retry_at
                and self._target(fig, beyond_ceiling=False) > fig.map_size):
            self._grow(fig.map_size, beyond_ceiling=False)
        if grows:
            self._admit(fig)

    def _admit(self, fig: Figures) -> None:
        limit = self._limit(fig)
        if fig.high_water + self.reserve <= limit:  # the cheap answer: live <= high water
            self._note_refusing(False)
            return
        live = self.live_bytes()
        if live + self.reserve <= limit:
            self._note_refusing(False)
            return
        raise self._refusal(live, limit, fig)

    def _limit(self, fig: Figures) -> int:
        """Where the store's data must stop: the ceiling, or what its disk can hold."""
        return min(self.ceiling, fig.high_water + fig.disk_free)

    def _refusal(self, live: int, limit: int, fig: Figures) -> NoSpace:
        """The NoSpace for a write that adds data to a store at its limit (logged once)."""
        self._note_refusing(True)
        where = (f"--map-size {self.ceiling}" if limit == self.ceiling
                 else f"what its disk can hold ({fig.disk_free} bytes free)")
        return NoSpace(f"the metadata store {self.path} is full: {live} bytes in use, and "
                       f"the last {self.reserve} below {where} are kept for deletions; delete "
                       f"files or restart the manager with a larger --map-size")

    def _note_refusing(self, refusing: bool) -> None:
        if refusing == self._refusing:
            return
        self._refusing = refusing  # a race here only doubles a log line
        if refusing:
            log.warning("metadata store %s is full (ceiling --map-size %d, reserve %d "
                        "bytes): creates get ENOSPC, deletions go on", self.path,
                        self.ceiling, self.reserve)
        else:
            log.info("metadata store %s has room again: creates are accepted", self.path)

    def full(self, seen_map: int, *, grows: bool) -> NoSpace:
        """A write transaction begun with the map at SEEN_MAP failed with MapFullError:
        grow the map if the rules allow. MapGrown (the caller runs it again) when it grew,
        here or in another thread; else the NoSpace to raise."""
        if self._grow(seen_map, beyond_ceiling=not grows):
            return MapGrown(f"the metadata map of {self.path} was full and has grown to "
                            f"{self.map_size} bytes: try again")
        if grows and self.map_size >= self.ceiling:
            # Admitted by live_bytes(), yet the pages it counted free were not reusable
            # (the last commit's, or a reader's snapshot): the store is full for creates.
            fig = self.figures()
            return self._refusal(self.live_bytes(), self._limit(fig), fig)
        return NoSpace(f"the metadata store {self.path} is full ({self.map_size} bytes "
                       f"mapped, --map-size {self.ceiling}): delete files or restart the "
                       f"manager with a larger --map-size")

    # -- growth ----------------------------------------------------------------------------

    def _grow(self, seen_map: int, *, beyond_ceiling: bool) -> bool:
        """Grow the map past SEEN_MAP (to twice it, within the limits). True when the map
        is larger than SEEN_MAP afterwards."""
        def resize() -> None:
            if self.map_size > seen_map:
                return  # another thread grew it meanwhile
            fig = self._figures_now()
            target = self._target(fig, beyond_ceiling=beyond_ceiling)
            if target <= fig.map_size:
                return
            self._env.set_mapsize(target)
            self.map_size = int(self._env.info()["map_size"])
            level = logging.WARNING if self.map_size > self.ceiling else logging.INFO
            log.log(level, "metadata map of %s grown from %d to %d bytes (%d in the file; "
                    "ceiling --map-size %d%s)", self.path, fig.map_size, self.map_size,
                    fig.high_water, self.ceiling,
                    ", passed for a deletion" if self.map_size > self.ceiling else "")

        if self.gate.held():
            return self.map_size > seen_map  # inside a transaction: a later write grows it
        if not self.gate.exclusive(resize):
            self._retry_at = time.monotonic() + RETRY_AFTER_S
            log.info("metadata map of %s not grown now: transactions stayed open for %g s; "
                     "trying again later", self.path, DRAIN_TIMEOUT_S)
        return self.map_size > seen_map

    def _target(self, fig: Figures, *, beyond_ceiling: bool) -> int:
        """Twice the map, within the ceiling (the disk only, once at the ceiling, for a
        write that frees space) and within what the disk can hold."""
        on_disk = fig.high_water + fig.disk_free
        cap = on_disk if beyond_ceiling and fig.map_size >= self.ceiling \
            else min(self.ceiling, on_disk)
        return _pages(min(2 * fig.map_size, cap))
