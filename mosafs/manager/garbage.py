"""Garbage collection and reconciliation on the manager's side (DESIGN §8).

Chunks that lose their last reference (a file removed, a version pruned) are collected as
they become garbage: the store tells the collector the ids a committed transaction left
with refcount 0 (`MetadataStore.on_unreferenced`), which queues them in memory in the
order they became garbage, and `GarbageCollector.collect` takes them from the front, so
its work follows what became garbage, not the size of the chunk index. Records left
unreferenced before a restart (the queue is soft state) are queued as the replication's
paced safety-net scan comes across them (`found`), with the time they are found: later,
never earlier. A record is collected once BOTH hold:
  1. its last reference went at least the grace period (`--gc-grace`) ago, and
  2. no write lease still open (nor a repair or conversion in flight) was opened before
     that moment: such a write may have the chunk in its base version and reference it
     at commit without storing it again.
Then, for each benefactor the record names, one transaction re-checks that its blobs are
still unneeded, and that the record became garbage before the same bound by the time the
record itself keeps (`ChunkRecord.unreferenced_ns`: the queue's entry may date an earlier
spell, the chunk referenced and left again since), and takes the benefactor out of the
record (`release_unreferenced`), and
the benefactor is asked to delete them (DeleteChunks), each only if it was not put since
the oldest write still open began (less a clock-skew allowance): a writer that stored the
chunk again after its lease opened keeps it. A benefactor that is down, or a request that
fails, leaves its blobs behind as orphans for the inventory rounds below.

Inventory rounds are the safety net for blobs the index never named (the uploads of a write
that never committed) or names no more (deletions that did not reach their benefactor).
Benefactors report their inventories in pages (periodically, paced, after every
registration, and on `mosafs gc`); `GarbageCollector.review` answers each page:

- an id the index references (refcount > 0) is a copy: if the record does not name the
  reporting benefactor (it came back after its copies were written off, or the index lost
  a location), the benefactor is added again: its copies count again, unless this
  collector released that copy since its last put (the page left before the deletion:
  releases are remembered for RELEASED_KEEP_NS). An erasure-coded
  record needs only the whole copies it names (or any, while it has fewer than K
  fragments): the copies a conversion to fragments left behind are garbage;
- an id that is a fragment of a referenced erasure-coded chunk (the `fragments` index of
  the store says which chunks name it, docs/erasure_pools.md) is needed where a slot
  names the benefactor for it; if the chunk has an empty slot for it and the benefactor
  holds no other fragment of that chunk, the benefactor is recorded there
  (reconciliation). A fragment whose slot another benefactor holds now (rebuilt or moved
  while this one was away) is garbage like an unreferenced id;
- an unreferenced id (refcount 0 after its last version went, or never committed: the
  upload of an aborted write) may be deleted once BOTH hold:
  1. it has been seen unreferenced for the grace period (`--gc-grace`), and
  2. no write lease still open (or committing) was opened before the later of the moment
     it was first seen unreferenced and the last put of it on that benefactor (plus a
     clock-skew allowance). A write in flight may reference the chunk at commit: either
     it put the chunk (after its lease opened) or it had it in its base version, which was
     referenced when the lease opened and so became unreferenced after. A repair or
     conversion in flight (mosafs.manager.ec_repair) counts as such a write: the blobs it
     puts are recorded only when it ends.
  The index record loses the benefactor in the same transaction that re-checks that the
  id is still unreferenced; a record with no copy left is deleted.

The benefactor deletes a released chunk only if it has not been put again since its
inventory (a put refreshes the chunk file's mtime), which covers a writer that stores the
chunk again while the answer is on its way.

"First seen unreferenced" lives in memory: a manager restart starts every grace period
again (safe: later, never earlier); it dates one unreferenced spell only (a chunk that
becomes garbage again is seen anew), and the release re-checks the record's own time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from mosafs.errors import InvalidArgument, MosafsError, NotFound
from mosafs.manager.leases import LeaseTable
from mosafs.manager.metadata import (
    MetadataStore,
    blob_needed_on,
    check_benefactor_id,
    check_ids,
    fragment_needed_on,
    wants_whole_copy,
)

log = logging.getLogger(__name__)

MAX_INVENTORY_PAGE = 16_384
CLOCK_SKEW_NS = 1_000_000_000  # benefactor and manager wall clocks may differ this much
COLLECT_PAGE = 4096  # unreferenced records per collection step
COLLECT_TICK_S = 2.0  # between steps while nothing is due
# Ids queued at most (about 150 bytes each): past it, new ones wait for the safety net
MAX_QUEUED = 2_000_000
# Releases remembered (id, benefactor) -> when, so that an inventory page that was on its
# way while a copy was deleted does not count that copy again: this long, at most this many
RELEASED_KEEP_NS = 600 * 10**9
MAX_RELEASED = 1_000_000
# delete(benefactor address, blob ids, put_before_ns) -> (chunks deleted, bytes freed)
DeleteFn = Callable[[str, list[bytes], int], tuple[int, int]]


@dataclass
class Collected:
    """What collection steps did: records collected, blobs deleted, bytes freed."""

    records: int = 0
    deleted_chunks: int = 0
    freed_bytes: int = 0


def check_report(store: MetadataStore, bid: str, count: int, what: str) -> None:
    """A page of ids benefactor BID reports (inventory, corrupt copies): BID must be
    registered, COUNT at most MAX_INVENTORY_PAGE (WHAT names the page in the error)."""
    check_benefactor_id(bid)
    if count > MAX_INVENTORY_PAGE:
        raise InvalidArgument(f"{what} at most {MAX_INVENTORY_PAGE} ids, got {count}")
    if store.benefactor(bid) is None:
        raise NotFound(f"benefactor {bid} is not registered: register first")


class GarbageCollector:
    def __init__(self, store: MetadataStore, leases: LeaseTable, *, grace_s: float,
                 wall_ns: Callable[[], int] = time.time_ns) -> None:
        self._store = store
        self._leases = leases
        # wall ns when the oldest repair or conversion in flight started (None: none)
        self.oldest_work_ns: Callable[[], int | None] = lambda: None
        self._grace_ns = int(grace_s * 1e9)
        self._wall_ns = wall_ns
        self._lock = threading.Lock()
        self._first_seen: dict[bytes, int] = {}
        self._next_prune = 0
        self._collect_lock = threading.Lock()
        # What became garbage, in the order it did: (wall ns, id), and the latest time of
        # each id (an entry whose time is not its id's latest is stale: skipped).
        self._queued: deque[tuple[int, bytes]] = deque()
        self._since: dict[bytes, int] = {}
        self._overflowed = False
        # (blob id, benefactor) -> wall ns of its release, oldest first (_note_released)
        self._released: dict[tuple[bytes, str], int] = {}
        self.collected = Collected()  # since start, for status and tests

    def unreferenced(self, ids: Sequence[bytes]) -> None:
        """IDS lost their last reference now (a committed transaction)."""
        self._queue(ids, self._wall_ns(), again=True)

    def found(self, ids: Sequence[bytes]) -> None:
        """IDS had refcount 0 in the index when the safety-net scan read them: queued now
        unless they are queued already, or collected since (read again: the scan's page
        may be older than a collection)."""
        with self._lock:
            new = [cid for cid in ids if cid not in self._since]
        if not new:
            return
        records = self._store.chunk_records(new)
        self._queue([cid for cid, rec in zip(new, records, strict=True)
                     if rec is not None and rec.refcount == 0], self._wall_ns(), again=False)

    def _queue(self, ids: Sequence[bytes], now: int, *, again: bool) -> None:
        with self._lock:
            for cid in ids:
                if not again and cid in self._since:
                    continue
                # A sighting from an earlier unreferenced spell says nothing of this one.
                self._first_seen.pop(cid, None)
                if self._since.get(cid) == now:
                    continue  # queued at this very moment already
                if len(self._queued) >= MAX_QUEUED:
                    if not self._overflowed:
                        self._overflowed = True
                        log.warning("garbage collection: %d chunks wait already; more are "
                                    "collected as the safety-net scan finds them", MAX_QUEUED)
                    return
                self._since[cid] = now
                self._queued.append((now, cid))

    def waiting(self) -> int:
        """Unreferenced chunks queued for collection."""
        with self._lock:
            return len(self._since)

    def collect(self, live: Mapping[str, str], delete: DeleteFn) -> float:
        """One step of collection of what became garbage: up to COLLECT_PAGE records due
        (above), released and deleted on the benefactors of LIVE (id -> address). Seconds
        until the next step (0: more is due now)."""
        with self._collect_lock:
            now = self._wall_ns()
            oldest = self._oldest_write()
            due_before = self._due_before(now, oldest)
            taken = self._take_due(due_before)
            if not taken:
                return COLLECT_TICK_S
            due = [cid for cid, _ in taken]
            by_holder: dict[str, list[bytes]] = {}
            for cid, rec in zip(due, self._store.chunk_records(due), strict=True):
                if rec is None or rec.refcount:
                    continue  # collected already, or referenced again
                for bid in rec.benefactor_ids:
                    by_holder.setdefault(bid, []).append(cid)
                for fid, bid in zip(rec.fragment_ids, rec.fragment_holders, strict=True):
                    if bid:
                        by_holder.setdefault(bid, []).append(bytes(fid))
                self.collected.records += 1
            put_before = (now if oldest is None else oldest) - CLOCK_SKEW_NS
            try:
                for bid, blobs in by_holder.items():
                    # The store checks again, in its transaction, when each record became
                    # garbage: it may have been referenced and left again since it was
                    # queued, after a write still open began.
                    released, _ = self._store.release_unreferenced(
                        blobs, bid, unreferenced_before=due_before)
                    self._note_released(released, bid, now)
                    if released and bid in live:
                        self._delete(bid, live[bid], released, put_before, delete)
            finally:
                self._forget(taken)
            return 0.0 if len(due) == COLLECT_PAGE else COLLECT_TICK_S

    def _oldest_write(self) -> int | None:
        """Wall ns when the oldest write still open, or repair or conversion in flight,
        began (None: none)."""
        opened = [self._leases.oldest_opened_ns(), self.oldest_work_ns()]
        return min((o for o in opened if o is not None), default=None)

    def _due_before(self, now: int, oldest: int | None) -> int:
        """What became garbage before this moment may go: past the grace period at NOW,
        and before the oldest write still open (OLDEST) began."""
        return now - self._grace_ns if oldest is None else min(now - self._grace_ns, oldest)

    def _take_due(self, due_before: int) -> list[tuple[bytes, int]]:
        """Up to COLLECT_PAGE (id, since) that became garbage before DUE_BEFORE, off the
        queue. They stay known as queued until _forget: a scan that read them before
        their collection must not queue them again."""
        due: list[tuple[bytes, int]] = []
        with self._lock:
            self._overflowed = self._overflowed and len(self._queued) >= MAX_QUEUED
            while self._queued and len(due) < COLLECT_PAGE:
                since, cid = self._queued[0]
                if since >= due_before:
                    break
                self._queued.popleft()
                if self._since.get(cid) == since:
                    due.append((cid, since))
        return due

    def _forget(self, taken: Sequence[tuple[bytes, int]]) -> None:
        """TAKEN were collected (or could not be): no longer queued, unless one became
        garbage again since (a later time, and a later entry of the queue)."""
        with self._lock:
            for cid, since in taken:
                if self._since.get(cid) == since:
                    del self._since[cid]

    def _delete(self, bid: str, address: str, blobs: list[bytes], put_before: int,
                delete: DeleteFn) -> None:
        for start in range(0, len(blobs), MAX_INVENTORY_PAGE):
            try:
                deleted, freed = delete(address, blobs[start:start + MAX_INVENTORY_PAGE],
                                        put_before)
            except MosafsError as exc:
                log.info("garbage collection: benefactor %s (%s) did not delete %d chunks "
                         "(its next inventory round will): %s", bid, address,
                         len(blobs), exc.message)
                return
            self.collected.deleted_chunks += deleted
            self.collected.freed_bytes += freed

    def review(self, bid: str, entries: Sequence[tuple[bytes, int]]) -> tuple[list[bytes], int]:
        """ENTRIES: (id, last put ns) stored on BID. Returns (ids BID may delete, how many
        unreferenced ids wait for the grace period or a write in flight)."""
        check_report(self._store, bid, len(entries), "an inventory page holds")
        ids = check_ids([cid for cid, _ in entries])
        # The leases first, the records after: a commit that finished in between has its
        # references in the records read below.
        oldest = self._oldest_write()
        references = self._store.blob_references(ids)
        now = self._wall_ns()
        recount: list[tuple[bytes, str]] = []
        fragments: list[tuple[bytes, str]] = []
        candidates: list[bytes] = []
        waiting = 0
        with self._lock:
            for (cid, touched), (rec, owners) in zip(entries, references, strict=True):
                if blob_needed_on(cid, bid, rec, [o for _, o in owners]):
                    self._first_seen.pop(cid, None)
                    if self._deleted_since(cid, bid, touched):
                        continue  # the page left before the copy was deleted: not a copy
                    if (rec is not None and rec.refcount > 0 and wants_whole_copy(rec, bid)
                            and bid not in rec.benefactor_ids):
                        recount.append((cid, bid))
                    needed = [o for _, o in owners if fragment_needed_on(cid, bid, o)]
                    if needed and not any(f == cid and h == bid for o in needed for f, h in
                                          zip(o.fragment_ids, o.fragment_holders,
                                              strict=True)):
                        fragments.append((cid, bid))
                    continue
                first = self._first_seen.setdefault(cid, now)
                latest_use = max(first, touched + CLOCK_SKEW_NS)
                if now - first >= self._grace_ns and (oldest is None or oldest > latest_use):
                    candidates.append(cid)
                else:
                    waiting += 1
        if recount:
            self._store.add_chunk_locations(recount)
        if fragments:
            self._store.add_fragment_holders(fragments)
        released, _ = self._store.release_unreferenced(
            candidates, bid, unreferenced_before=self._due_before(now, oldest))
        self._note_released(released, bid, now)
        self._forget_old(now)
        return released, waiting + len(candidates) - len(released)

    def _note_released(self, ids: Sequence[bytes], bid: str, now: int) -> None:
        """IDS were released on BID at NOW: its copies are deleted, or about to be."""
        with self._lock:
            for cid in ids:
                self._released.pop((cid, bid), None)  # to the end: the newest
                self._released[(cid, bid)] = now
            while len(self._released) > MAX_RELEASED:
                del self._released[next(iter(self._released))]

    def _deleted_since(self, cid: bytes, bid: str, touched: int) -> bool:
        """Whether the copy of CID an inventory of BID reports (last put at TOUCHED) is
        one released since: its page was listed before the deletion. A copy put again
        after the release is a new one (within the clock-skew allowance: when in doubt,
        not counted, and replication makes another)."""
        released = self._released.get((cid, bid))
        return released is not None and touched <= released + CLOCK_SKEW_NS

    def _forget_old(self, now: int) -> None:
        """Drop first sightings long past the grace period (their ids were deleted
        everywhere, or will simply wait one grace period more): bounded memory. The entry
        of a released id stays a while, so its other copies need not wait again."""
        keep_ns = 4 * self._grace_ns + 3600 * 10**9
        with self._lock:
            if now < self._next_prune:
                return
            self._next_prune = now + 60 * 10**9
            for cid in [c for c, t in self._first_seen.items() if now - t > keep_ns]:
                del self._first_seen[cid]
            while self._released:
                key, at = next(iter(self._released.items()))
                if now - at <= RELEASED_KEEP_NS:
                    break
                del self._released[key]
