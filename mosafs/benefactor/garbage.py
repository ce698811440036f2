"""Garbage collection on the benefactor's side (DESIGN §8, docs/durability.md "Garbage
collection").

Deletions the manager asks for (DeleteChunks): chunks whose last reference went more than
the grace period ago, which the manager queues as they become garbage. Each is deleted
only if it was not put since the time the request names (a put of a present chunk
refreshes its mtime: a writer may be about to reference it).

Inventory rounds, the safety net for what the index never named (the uploads of a write
that never committed) or names no more (deletions that did not reach this benefactor):
report every stored chunk to the manager, page by page, and delete what it releases,
unless the chunk was put again since the inventory was taken. Rounds run after every
(re-)registration, which is how a returning benefactor's copies are counted again, and on
demand (`mosafs gc`), at full speed; and periodically, paced to RATE ids a second so that
the manager's review of a large store stays a small share of a core. One round at a time:
a round asked for while a paced one runs makes that one go at full speed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mosafs.benefactor.store import ChunkStore, InventoryItem
from mosafs.errors import InvalidArgument
from mosafs.ids import check_id

log = logging.getLogger(__name__)

PAGE = 16_384  # ids per report: ~1 MiB of request
MAX_DELETE = 16_384  # ids per DeleteChunks request
# A page listed longer ago than this is looked up again before it leaves; the manager
# remembers its releases ten times as long (mosafs.manager.garbage.RELEASED_KEEP_NS).
STALE_S = 60.0
# review(page) -> (ids to delete, how many unreferenced ids wait)
ReviewFn = Callable[[Sequence[InventoryItem]], tuple[list[bytes], int]]


@dataclass(frozen=True)
class RoundResult:
    reported: int = 0
    deleted_chunks: int = 0
    freed_bytes: int = 0
    waiting_chunks: int = 0


class GarbageRounds:
    def __init__(self, store: ChunkStore, review: ReviewFn) -> None:
        self._store = store
        self._review = review
        self._lock = threading.Lock()
        self._hurry = threading.Event()  # a full-speed round waits for the paced one

    def run(self, rate: float = 0.0) -> RoundResult:
        """One inventory round; RATE > 0: at most RATE ids a second (periodic rounds)."""
        if not rate:
            self._hurry.set()
        with self._lock:
            if not rate:
                self._hurry.clear()
            return self._round(rate)

    def _round(self, rate: float) -> RoundResult:
        items = list(self._store.inventory())
        deleted = freed = waiting = 0
        started = time.monotonic()
        for start in range(0, len(items), PAGE):
            if rate and start:
                self._hurry.wait(started + start / rate - time.monotonic())
            page = items[start:start + PAGE]
            if time.monotonic() - started > STALE_S:
                # As the page stands now: a paced round's listing may be an hour old,
                # and the manager counts what a page reports as copies here (a fresher
                # one it checks against the deletions it made since: mosafs.manager.garbage).
                page = self._store.refresh(page)
            if not page:
                continue
            touched = {item.id: item.touched_ns for item in page}
            release, waits = self._review(page)
            waiting += waits
            for cid in release:
                if cid not in touched:
                    continue  # not in what we reported: never delete on hearsay
                size = self._store.delete(cid, touched_ns=touched[cid])
                if size:
                    deleted += 1
                    freed += size
        if deleted:
            log.info("garbage collection: deleted %d chunks, %d bytes", deleted, freed)
        return RoundResult(len(items), deleted, freed, waiting)

    def delete(self, ids: Sequence[bytes], put_before_ns: int) -> tuple[int, int]:
        """The manager's DeleteChunks: delete each of IDS unless it was put at or after
        PUT_BEFORE_NS. Returns (chunks deleted, bytes freed)."""
        if len(ids) > MAX_DELETE:
            raise InvalidArgument(f"a deletion names at most {MAX_DELETE} ids, got {len(ids)}")
        for raw_id in ids:
            check_id(raw_id)
        deleted = freed = 0
        for raw_id in ids:
            size = self._store.delete(raw_id, touched_ns=put_before_ns - 1)
            if size:
                deleted += 1
                freed += size
        if deleted:
            log.debug("garbage collection: deleted %d released chunks, %d bytes", deleted,
                      freed)
        return deleted, freed
