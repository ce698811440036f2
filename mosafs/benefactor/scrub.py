"""Scrubbing (DESIGN §8): re-read every stored chunk and check that it still hashes to its
id. A copy that does not (bit rot, a torn or edited file) is deleted by the store and
reported to the manager, which stops counting it as a copy; background replication then
pushes a good replica back here or elsewhere.

Two kinds of pass share this code:
- background passes, one after another, throttled to `rate` bytes/s (`--scrub-rate`;
  0 turns them off), so that a scrub never competes with client traffic for the disk;
  each chunk counts as at least MIN_CHARGE bytes against the rate, since checking a chunk
  costs a file's open, read and close whatever its size;
- a full pass now, unthrottled, when the manager asks (`mosafs scrub`), which streams its
  progress back.

Corrupt ids that could not be reported (the manager unreachable) are kept and sent with the
next report. Domain code: no gRPC here; REPORT is a callable the process supplies.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from mosafs import metrics
from mosafs.benefactor.store import CORRUPT, GONE, ChunkStore, InventoryItem
from mosafs.errors import MosafsError

log = logging.getLogger(__name__)

# report(ids): tell the manager these copies are gone (corrupt and deleted here)
ReportFn = Callable[[Sequence[bytes]], None]
# wait(seconds) -> True when the pass should stop (a threading.Event's wait)
WaitFn = Callable[[float], bool]
MAX_PENDING = 100_000  # corrupt ids kept for the manager while it is unreachable
# The least a chunk counts against a throttled pass's rate. Checking one costs about what
# reading 64 KiB does (the walk, the open, the stat, the read's set-up): paced by bytes
# alone, a store of 4 KiB chunks was scrubbed at 2,000 files a second at the default
# rate, a quarter of a benefactor's CPU in a commit loop of such chunks
# (docs/benefactor.md, "Scrubbing"). Chunks of the default chunker (256 KiB and more)
# are paced by their bytes as before.
MIN_CHARGE = 64 * 1024
REPORT_PAGE = 16_384


@dataclass
class ScrubProgress:
    checked_chunks: int = 0
    checked_bytes: int = 0
    total_chunks: int = 0  # stored when the pass began
    total_bytes: int = 0
    corrupt_ids: list[bytes] = field(default_factory=list)
    done: bool = False


def _never(seconds: float) -> bool:
    if seconds > 0:
        time.sleep(seconds)
    return False


class Scrubber:
    def __init__(self, store: ChunkStore, report: ReportFn | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 min_charge: int = MIN_CHARGE) -> None:
        self._store = store
        self._report = report
        self._clock = clock
        self._min_charge = min_charge
        self._lock = threading.Lock()
        self._pending: list[bytes] = []

    def run(self, rate: float = 0, *, wait: WaitFn = _never,
            progress_every: float = 0.25) -> Iterator[ScrubProgress]:
        """One pass over every stored chunk. RATE: bytes/s at most, each chunk counted as
        at least the scrubber's MIN_CHARGE bytes (0: as fast as the disk goes). Yields the
        progress every PROGRESS_EVERY seconds and, last, the final figures with done=True
        (not when WAIT said stop)."""
        usage = self._store.usage()
        progress = ScrubProgress(total_chunks=usage.chunks, total_bytes=usage.stored_bytes)
        start = last = self._clock()
        items = self._store.inventory()
        with contextlib.closing(items):  # type: ignore[type-var]
            yield from self._verify(items, progress, rate, wait, start, last, progress_every)

    def _verify(self, items: Iterator[InventoryItem], progress: ScrubProgress, rate: float,
                wait: WaitFn, start: float, last: float,
                progress_every: float) -> Iterator[ScrubProgress]:
        charged = 0  # bytes counted against RATE
        for item in items:
            verdict, size = self._store.scrub(item.id)
            charged += max(size, self._min_charge)
            if verdict == GONE:
                continue  # deleted (garbage collection) since the walk listed it: not lost
            progress.checked_chunks += 1
            progress.checked_bytes += size
            if verdict == CORRUPT:
                progress.corrupt_ids.append(item.id)
                metrics.BENEFACTOR_CORRUPT.inc()
                self._send([item.id])
            now = self._clock()
            ahead = charged / rate - (now - start) if rate > 0 else 0.0
            if wait(max(0.0, ahead)):
                return  # stopping: no final figures
            if now - last >= progress_every:
                last = now
                yield ScrubProgress(**{**vars(progress), "corrupt_ids": []})
        self._send([])  # what an earlier report could not deliver
        progress.done = True
        if progress.corrupt_ids:
            log.info("scrub: %d chunks (%d bytes) checked, %d corrupt copies deleted",
                     progress.checked_chunks, progress.checked_bytes,
                     len(progress.corrupt_ids))
        yield progress

    def check(self, raw_id: bytes) -> str:
        """Scrub one chunk now (a reader found its copy bad): a corrupt copy is deleted
        and reported like one a pass finds. The verdict (SOUND, CORRUPT, GONE)."""
        verdict, _ = self._store.scrub(raw_id)
        if verdict == CORRUPT:
            metrics.BENEFACTOR_CORRUPT.inc()  # the store logged it
            self._send([raw_id])
        return verdict

    def run_pass(self, rate: float = 0, *, wait: WaitFn = _never) -> ScrubProgress | None:
        """A whole pass; its final figures (None when WAIT said stop)."""
        final = None
        for progress in self.run(rate, wait=wait, progress_every=float("inf")):
            final = progress
        return final if final is not None and final.done else None

    def _send(self, ids: list[bytes]) -> None:
        with self._lock:
            self._pending.extend(ids)
            del self._pending[:-MAX_PENDING]
            if not self._pending or self._report is None:
                return
            pending, self._pending = self._pending, []
        try:
            for start in range(0, len(pending), REPORT_PAGE):
                self._report(pending[start:start + REPORT_PAGE])
        except MosafsError as exc:
            log.info("scrub: could not report %d corrupt chunks to the manager yet: %s",
                     len(pending), exc.message)
            with self._lock:
                self._pending[:0] = pending
                del self._pending[:-MAX_PENDING]


class ScrubLoop:
    """Background passes at RATE bytes/s, one after another (at least PAUSE seconds
    between the starts of two passes), in a daemon thread until stop()."""

    def __init__(self, scrubber: Scrubber, rate: float, *, pause: float = 5.0) -> None:
        self._scrubber = scrubber
        self._rate = rate
        self._pause = pause
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scrub", daemon=True)

    def start(self) -> None:
        if self._rate > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._scrubber.run_pass(self._rate, wait=self._stop.wait)
            except MosafsError as exc:
                log.info("scrub pass stopped: %s", exc.message)
            except Exception:
                log.exception("bug in the scrub pass")
            self._stop.wait(max(0.0, self._pause - (time.monotonic() - started)))
