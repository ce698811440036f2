"""Inventory rounds on the benefactor's side (DESIGN §8): report every stored chunk to the
manager, page by page, and delete what it releases, unless the chunk was put again since
the inventory was taken (a writer may be about to reference it; a put of a present chunk
refreshes its mtime). Rounds run periodically, after every (re-)registration, which is how
a returning benefactor's copies are counted again, and on demand (`mosafs gc`). One round
at a time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mosafs.benefactor.chunkstore import ChunkStore, InventoryItem

log = logging.getLogger(__name__)

PAGE = 16_384  # ids per report: ~1 MiB of request
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

    def run(self) -> RoundResult:
        with self._lock:
            items = list(self._store.inventory())
            touched = {item.id: item.touched_ns for item in items}
            deleted = freed = waiting = 0
            for start in range(0, len(items), PAGE):
                release, waits = self._review(items[start:start + PAGE])
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
