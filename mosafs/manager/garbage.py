"""Garbage collection and reconciliation on the manager's side (DESIGN §8).

Benefactors report their inventories in pages (periodically, after every registration, and
on `mosafs gc`); `GarbageCollector.review` answers each page:

- an id the index references (refcount > 0) is a copy: if the record does not name the
  reporting benefactor (it came back after its copies were written off, or the index lost
  a location), the benefactor is added again: its copies count again. An erasure-coded
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
again (safe: later, never earlier).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from mosafs.errors import InvalidArgument, NotFound
from mosafs.manager.leases import LeaseTable
from mosafs.manager.metadata import (
    MetadataStore,
    blob_needed_on,
    check_benefactor_id,
    check_ids,
    fragment_needed_on,
    wants_whole_copy,
)

MAX_INVENTORY_PAGE = 16_384
CLOCK_SKEW_NS = 1_000_000_000  # benefactor and manager wall clocks may differ this much


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

    def review(self, bid: str, entries: Sequence[tuple[bytes, int]]) -> tuple[list[bytes], int]:
        """ENTRIES: (id, last put ns) stored on BID. Returns (ids BID may delete, how many
        unreferenced ids wait for the grace period or a write in flight)."""
        check_report(self._store, bid, len(entries), "an inventory page holds")
        ids = check_ids([cid for cid, _ in entries])
        # The leases first, the records after: a commit that finished in between has its
        # references in the records read below.
        opened = [self._leases.oldest_opened_ns(), self.oldest_work_ns()]
        oldest = min((o for o in opened if o is not None), default=None)
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
        released, _ = self._store.release_unreferenced(candidates, bid)
        self._forget_old(now)
        return released, waiting + len(candidates) - len(released)

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
