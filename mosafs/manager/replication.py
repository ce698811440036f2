"""Replication (DESIGN §8): keep every referenced chunk at its pool's R live copies,
driven by the events that make copies short, with a slow full scan as a safety net.

Erasure-coded chunks (ChunkRecord.ec_k > 0, docs/erasure_pools.md) are counted here by
their fragments: one with fewer than K+M fragments on counted benefactors is short
(under-replicated), one with fewer than K live fragments and no live whole copy is lost.
Copies of whole chunks are no repair for them: the same events and the same examination
find them, and hand them to the fragment repairer (`handoff`, mosafs.manager.ec_repair),
which rebuilds or moves fragments. So are chunks whose layout is not their pool's any
more (a pool's redundancy changed: `Redundancy.converts`), which it re-encodes; replication
makes no whole copies of those.

A chunk belongs to the pool of the write that stored it first (ChunkRecord.pool; a pool
deleted since counts as "default"). Its copies that count towards R are those on live
(or, right after a manager start, presumed live) benefactors of that pool that are not
draining (`Redundancy`, mosafs.manager.redundancy_view); copies elsewhere (a benefactor
moved to another pool, or draining) still serve reads and replication sources.

Work comes from events, at once:

* a commit whose new chunks have fewer than R counted copies (optimistic writes; a
  pessimistic write that could not place R copies), `Replicator.enqueue`;
* a benefactor found dead (its lease ran out, or a presumed one never spoke after a
  start): every chunk the index names on it (`_watch`), read from the holdings index a
  page at a time while few chunks are queued (`_walk`), so that the first copies start at
  the next step whatever the benefactor held (10 million chunk records: docs/benchmarks.md,
  "Metadata") and the queue stays small;
* a copy dropped as corrupt or missing (readers, scrub), draining, a pool's R raised;
* the safety net: a full scan of the index, a page at a time within a time budget per
  step, at most once every `scan_interval_s`, queues whatever it finds short. It spends
  at most SCAN_SHARE of one core: after a slice of the scan the next waits (1 - share) /
  share times as long, so an idle manager of 10 million chunk records stays idle.

Each step (`step`, a few times a second, at once when woken) examines queued ids: a
chunk with R counted copies is done; one short of copies gets copies planned from a live
holder to live benefactors of its pool that hold none and have room, grouped by
(source, target) and pushed by the source (`copy`: chunk bytes go benefactor to
benefactor). Groups run in a small thread pool, at most `per_source` at a time per
source and `max_inflight_bytes` in all, so client puts keep most of every benefactor
(new writes have priority). Every copy request has a deadline that grows with its bytes;
a target that could not be reached is avoided for a lease, one that is full is no target
until a heartbeat says it has room again. Chunks that stay short (no live copy: lost for
now; no target with room; a failed copy) are examined again after `retry_s`, then after
twice as long at each try, up to RETRY_MAX_S, so that a store with many chunks lost for
now does not re-read them all every few seconds; a benefactor that joins or comes back
(the event that can make them whole again) starts every short chunk's tries again at once.

The figures (`figures`) are those of the known short chunks, current as of the last
step that examined everything queued before it; the copy rate is measured over the last
RATE_WINDOW_S of finished copies (mosafs.manager.transfers). `committed` keeps, per
commit, the chunks still short; when the last gets its R copies the time since the commit
goes into the close-to-fully-redundant histogram (pessimistic commits count 0).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from mosafs import metrics
from mosafs.errors import DeadlineExceeded, MosafsError, NoSpace, Unavailable
from mosafs.manager.metadata import MetadataStore
from mosafs.manager.pools import fragment_size
from mosafs.manager.redundancy_view import Redundancy
from mosafs.manager.registry import Clock, Registry
from mosafs.manager.transfers import CopyFn, RateWindow, copy_deadline

log = logging.getLogger(__name__)

MiB = 1 << 20
TICK_S = 0.2          # a step at least this often
LAPSE_SLACK_S = 0.002  # a step this long after a lease lapses (_next_tick)
EXAMINE_BATCH = 4096  # ids examined per step (a step with more queued runs again at once)
SCAN_PAGE = 4096
SCAN_SHARE = 0.02     # of one core, at most, for the safety-net scan
WALK_PAGE = 4096      # ids of a dead benefactor queued at a time
WALK_BELOW = 2 * EXAMINE_BATCH  # ... while fewer than this are queued
RETRY_MAX_S = 60.0    # the longest wait between two examinations of a chunk still short


@dataclass
class ReplicationFigures:
    chunks: int = 0  # chunk records in the index
    under_replicated_chunks: int = 0
    replication_backlog_bytes: int = 0
    lost_chunks: int = 0
    scanned_at: float = 0.0  # clock() when the figures were last current; 0: not yet
    full_scan_at: float = 0.0  # clock() when the last complete safety-net scan ended
    unreachable: list[str] = field(default_factory=list)  # pools that cannot reach R
    # Of the short chunks, the erasure-coded ones, the fragments they lack, and those lost.
    ec_short_chunks: int = 0
    ec_missing_fragments: int = 0
    ec_lost_chunks: int = 0


@dataclass
class _Short:
    length: int  # of one copy, or one fragment
    missing: int  # copies, or fragments
    lost: bool  # no live copy anywhere (a dead holder may come back)
    coded: bool = False  # erasure-coded: its fragments are short


@dataclass
class _Debt:
    started: float
    ids: set[bytes]


class Replicator:
    def __init__(self, store: MetadataStore, registry: Registry, copy: CopyFn, *,
                 clock: Clock = time.monotonic, scan_interval_s: float = 60.0,
                 scan_budget_s: float = 0.05, retry_s: float = 2.0,
                 group_bytes: int = 16 * MiB, max_inflight_bytes: int = 256 * MiB,
                 per_source: int = 2, workers: int = 8) -> None:
        self._store = store
        self._registry = registry
        self._copy = copy
        self._clock = clock
        self._scan_interval_s = scan_interval_s
        self._scan_budget_s = scan_budget_s
        self._retry_s = retry_s
        self._group_bytes = group_bytes
        self._max_inflight_bytes = max_inflight_bytes
        self._per_source = per_source
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="replicate")
        self._lock = threading.Lock()       # the state below
        self._step_lock = threading.Lock()  # one step at a time (loop, scrub, tests)
        self.wakeup = threading.Event()
        self._queue: dict[bytes, None] = {}  # ids to examine, in arrival order
        self._short: dict[bytes, _Short] = {}
        self._inflight: Counter[bytes] = Counter()  # id -> copy groups still running
        self._waiting: deque[tuple[str, str, list[tuple[bytes, int]]]] = deque()
        self._running: Counter[str] = Counter()  # source id -> requests running
        self._inflight_bytes = 0
        self._seen: set[str] | None = None  # benefactors alive or presumed, last step
        self._scan_cursor: bytes | None = None  # None: no scan under way
        self._scan_resume = clock()  # the next slice of the scan, not before (SCAN_SHARE)
        self._scan_unlimited = False  # run_once: the whole scan now
        # Benefactors whose chunks are being queued from the holdings index: id -> (the
        # last chunk id queued, whether it is dead: a walk for a death ends if it returns)
        self._walks: dict[str, tuple[bytes, bool]] = {}
        self._scan_started = 0.0
        self._next_scan = clock()  # the first scan starts at once
        self._next_retry = clock()
        # Short chunks examined again on a timer: id -> (tries so far, not before), and
        # whether a benefactor joined or came back since the last step.
        self._backoff: dict[bytes, tuple[int, float]] = {}
        self._joined = False
        self._figures = ReplicationFigures()
        self._done = RateWindow(clock)  # finished copies
        self._copied_total = 0
        self._debts: dict[int, _Debt] = {}
        self._debts_of: dict[bytes, set[int]] = defaultdict(set)
        self._debt_ids = itertools.count(1)
        # Chunks for the fragment repairer (mosafs.manager.ec_repair): coded ones short of
        # fragments, and those to re-encode. Set by the manager; None: nobody (unit tests).
        # (ids, of which (id, pool, length) to convert)
        self.handoff: Callable[[list[bytes], list[tuple[bytes, str, int]]], None] | None = None
        self.other_rate: Callable[[], float] = lambda: 0.0  # the repairer's bytes/s
        # Told the records with refcount 0 the safety-net scan comes across (garbage
        # collection's queue is soft state: this is how it learns of older garbage).
        self.unreferenced_found: Callable[[list[bytes]], None] | None = None

    # -- events ----------------------------------------------------------------------------

    def enqueue(self, ids: Iterable[bytes]) -> None:
        """Examine IDS soon (their copies may be short)."""
        with self._lock:
            for cid in ids:
                self._queue[cid] = None
        self.wakeup.set()

    def committed(self, short: Sequence[bytes]) -> None:
        """A commit whose chunks SHORT have fewer than R copies (none: fully redundant at
        close, a pessimistic write)."""
        if not short:
            metrics.MANAGER_REDUNDANT_SECONDS.observe(0.0)
            return
        with self._lock:
            key = next(self._debt_ids)
            self._debts[key] = _Debt(self._clock(), set(short))
            for cid in short:
                self._debts_of[cid].add(key)
        self.enqueue(short)

    def rescan(self) -> None:
        """Start a full scan now (a pool's R changed): its first slice at the next step,
        whatever the share the last slice used (SCAN_SHARE paces the slices after it)."""
        with self._lock:
            self._next_scan = self._scan_resume = self._clock()
        self.wakeup.set()

    # -- figures ---------------------------------------------------------------------------

    def figures(self) -> tuple[ReplicationFigures, float]:
        """The figures and the recent copy rate (bytes/s)."""
        with self._lock:
            out = ReplicationFigures(**vars(self._figures))
            out.unreachable = list(self._figures.unreachable)
            return out, self._rate()

    def _rate(self) -> float:
        return self._done.rate()

    def age_ms(self, at: float) -> int:
        """Milliseconds since AT (a clock() reading); -1 for 0 (never)."""
        return int((self._clock() - at) * 1000) if at else -1

    def pending(self, ids: Iterable[bytes]) -> bool:
        """Whether any of IDS is queued or being copied."""
        with self._lock:
            return any(cid in self._queue or self._inflight[cid] for cid in ids)

    def time_to_full_redundancy(self) -> float:
        """Seconds until every chunk has R live copies at the measured rate: 0 when it has
        now, -1 when it cannot be said (nothing copied lately, chunks lost for now, or a
        pool that cannot reach its R)."""
        figures, rate = self.figures()
        rate += self.other_rate()  # fragments the repairer rebuilds count as copies
        if figures.under_replicated_chunks == 0:
            return 0.0
        if figures.lost_chunks or figures.unreachable or rate <= 0:
            return -1.0
        return figures.replication_backlog_bytes / rate

    # -- the loop --------------------------------------------------------------------------

    def step(self) -> float:
        """One round: events, examination and copies, a slice of the safety-net scan.
        Returns the seconds to wait before the next (0: more is queued)."""
        with self._step_lock:
            return self._step()

    def _step(self) -> float:
        started = self._clock()
        self._watch()
        self._retry_short(started)
        batch, more = self._take()
        view = Redundancy(self._store, self._registry)
        self._examine(batch, view)
        self._dispatch()
        self._scan_some(view)
        self._publish(view, current=not more and not self._walks, at=started)
        return 0.0 if more else self._next_tick()

    def _next_tick(self) -> float:
        """TICK_S, or less where a lease lapses sooner: the step after it queues what the
        dead benefactor held (a death is only ever seen by a step). LAPSE_SLACK_S after the
        lapse, so that the step sees it past the lease's boundary."""
        lapse = self._registry.until_lapse()
        return TICK_S if lapse is None else min(TICK_S, lapse + LAPSE_SLACK_S)

    def run_once(self, timeout: float = 120.0) -> int:
        """A full scan and every copy it plans, now (tests, `mosafs scrub` repairs);
        returns the bytes copied."""
        with self._lock:
            before = self._copied_total
            self._next_scan = self._clock()
        deadline = time.monotonic() + timeout
        with self._step_lock:
            self._scan_unlimited = True
            try:
                self._step()
                while self._scan_cursor is not None or self._walks or self.busy():
                    if time.monotonic() > deadline:
                        break
                    if self._step() > 0:
                        time.sleep(0.02)
            finally:
                self._scan_unlimited = False
        with self._lock:
            return self._copied_total - before

    def busy(self) -> bool:
        """Whether anything is queued or being copied."""
        with self._lock:
            return bool(self._queue or self._inflight or self._walks)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- events from the registry ----------------------------------------------------------

    def _watch(self) -> None:
        """Benefactors that died since the last step: queue every chunk they held (whole
        copies and fragments)."""
        now_known = {b.id for b in self._registry.live()} | self._registry.presumed()
        if self._seen is None:
            # First step: benefactors registered but neither alive nor presumed are dead
            # already (a restart after their lease ran out).
            self._seen = set(self._store.benefactors())
        gone = self._seen - now_known
        if now_known - self._seen:
            self._joined = True
        self._seen = now_known
        with self._lock:
            for bid in sorted(gone):
                log.info("benefactor %s is dead: checking the chunks it held", bid)
                self._walks[bid] = (b"", True)
            for bid in [b for b, (_, dead) in self._walks.items() if dead and b in now_known]:
                del self._walks[bid]  # back: its copies count again
        self._walk()

    def recheck(self, bid: str) -> None:
        """Examine every chunk BID holds (its copies may count no more: draining, moved
        to another pool), queued a page at a time as a dead benefactor's are."""
        with self._lock:
            self._walks[bid] = (b"", False)
        self.wakeup.set()

    def _walk(self) -> None:
        """Queue the next page of what each dead benefactor held, while few chunks are
        queued (the holdings index, WALK_PAGE at a time)."""
        with self._lock:
            walks = list(self._walks.items())
        for bid, (after, dead) in walks:
            with self._lock:
                if len(self._queue) >= WALK_BELOW:
                    return
            page = self._store.held_by(bid, after, WALK_PAGE)
            self.enqueue(page.ids)
            with self._lock:
                if self._walks.get(bid) != (after, dead):
                    continue  # started again (another recheck) or ended meanwhile
                if page.end:
                    del self._walks[bid]
                else:
                    self._walks[bid] = (page.last, dead)
            if page.end:
                log.info("benefactor %s: every chunk it holds is queued", bid)

    def _retry_short(self, now: float) -> None:
        """Chunks still short (no live copy, no target, a failed copy) are examined again:
        each after its backoff (a benefactor may have room again, a copy may work now),
        every one at once after a benefactor joined or came back."""
        if now < self._next_retry and not self._joined:
            return
        self._next_retry = now + self._retry_s
        with self._lock:
            if self._joined:
                self._joined = False
                self._backoff.clear()
            again = []
            for cid in self._short:
                if cid in self._inflight:
                    continue
                tries, not_before = self._backoff.get(cid, (0, 0.0))
                if now < not_before:
                    continue
                again.append(cid)
                wait = min(self._retry_s * 2 ** min(tries, 16), RETRY_MAX_S)
                self._backoff[cid] = (tries + 1, now + wait)
        if again:
            self.enqueue(again)

    # -- examination -----------------------------------------------------------------------

    def _take(self) -> tuple[list[bytes], bool]:
        """Up to EXAMINE_BATCH queued ids (none while copies in flight fill the budget);
        whether more remain."""
        with self._lock:
            if self._inflight_bytes >= self._max_inflight_bytes:
                return [], False
            batch = list(itertools.islice(self._queue, EXAMINE_BATCH))
            for cid in batch:
                del self._queue[cid]
            return batch, bool(self._queue)

    def _examine(self, ids: list[bytes], view: Redundancy) -> None:
        if not ids:
            return
        with self._lock:
            # An id queued again while its copy runs (enqueue does not look) is read below
            # as it was before that copy; if the copy ends before the lock is taken again,
            # the stale record would plan it a second time. Such ids wait: the copy's end
            # queues them again, to be read afresh.
            copying = {cid for cid in ids if self._inflight[cid]}
        records = self._store.chunk_records(ids)
        groups: dict[tuple[str, str], list[tuple[bytes, int]]] = defaultdict(list)
        planned: dict[str, int] = dict(self._planned_bytes())
        handed: list[bytes] = []
        conversions: list[tuple[bytes, str, int]] = []
        with self._lock:
            for cid, rec in zip(ids, records, strict=True):
                if cid in copying or self._inflight[cid]:
                    continue  # examined again when its copies end
                self._inflight.pop(cid, None)
                missing = view.missing(rec) if rec is not None and rec.refcount else 0
                converts = rec is not None and view.converts(rec)
                coded = rec is not None and (bool(rec.ec_k) or converts)
                if coded and (missing or converts):
                    handed.append(cid)  # fragments to rebuild or move, or a conversion
                    if converts and not missing:  # only to convert: behind repairs
                        assert rec is not None
                        conversions.append((cid, view.pool(rec), rec.length))
                if missing == 0:
                    self._settle(cid)
                    continue
                assert rec is not None
                lost = view.lost(rec)
                if coded:
                    # Never copied whole: the fragment repairer rebuilds fragments, or
                    # converts the chunk (which makes its copies, or fragments, anew).
                    size = fragment_size(rec.length, rec.ec_k) if rec.ec_k else rec.length
                    self._short[cid] = _Short(size, missing, lost, coded=bool(rec.ec_k))
                    continue
                sources = view.sources(rec)
                self._short[cid] = _Short(rec.length, missing, lost)
                targets = view.targets(rec, planned)[:missing] if sources else []
                if not targets:
                    continue  # lost for now, or no room: retried every retry_s
                source = min(sources, key=lambda b: (self._running[b], hash((cid, b))))
                for target in targets:
                    groups[(source, target)].append((cid, rec.length))
                    planned[target] = planned.get(target, 0) + rec.length
                    self._inflight[cid] += 1
            for (source, target), chunks in groups.items():
                for group in _split(chunks, self._group_bytes):
                    self._waiting.append((source, target, group))
                    self._inflight_bytes += sum(n for _, n in group)
        if handed and self.handoff is not None:
            self.handoff(handed, conversions)

    def _planned_bytes(self) -> Counter[str]:
        with self._lock:
            out: Counter[str] = Counter()
            for _, target, group in self._waiting:
                out[target] += sum(n for _, n in group)
            return out

    def _settle(self, cid: bytes) -> None:
        """CID has its R copies (or is no longer referenced): off the books. Holds _lock."""
        self._short.pop(cid, None)
        self._backoff.pop(cid, None)
        for key in self._debts_of.pop(cid, ()):
            debt = self._debts.get(key)
            if debt is None:
                continue
            debt.ids.discard(cid)
            if not debt.ids:
                del self._debts[key]
                metrics.MANAGER_REDUNDANT_SECONDS.observe(self._clock() - debt.started)

    # -- copies ----------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Start waiting groups whose source has a free slot."""
        addresses = self._store.benefactor_addresses(
            {b for s, t, _ in self._waiting for b in (s, t)})
        with self._lock:
            held: deque[tuple[str, str, list[tuple[bytes, int]]]] = deque()
            while self._waiting:
                source, target, group = self._waiting.popleft()
                if self._running[source] >= self._per_source:
                    held.append((source, target, group))
                    continue
                if source not in addresses or target not in addresses:
                    self._finished(group, [False] * len(group), target)
                    continue
                self._running[source] += 1
                self._pool.submit(self._run_group, source, target, addresses[source],
                                  addresses[target], group)
            self._waiting = held

    def _run_group(self, source: str, target: str, source_address: str,
                   target_address: str, group: list[tuple[bytes, int]]) -> None:
        copied = [False] * len(group)
        try:
            copied = self._copy_group(source, target, source_address, target_address, group)
        except Exception:
            log.exception("bug in a replication request %s -> %s", source, target)
        finally:  # whatever happened, the ids are examined again and the slot is free
            with self._lock:
                self._running[source] -= 1
                self._finished(group, copied, target)
            self.wakeup.set()

    def _copy_group(self, source: str, target: str, source_address: str,
                    target_address: str, group: list[tuple[bytes, int]]) -> list[bool]:
        """Ask SOURCE to push GROUP to TARGET and record the copies made; copied[i]."""
        ids = [cid for cid, _ in group]
        copied, problem = [False] * len(ids), ""
        try:
            copied, problem = self._copy(source_address, target_address, ids,
                                         copy_deadline(sum(n for _, n in group)))
        except (Unavailable, DeadlineExceeded) as exc:
            log.info("replication %s -> %s: source unreachable: %s", source, target, exc)
            self._registry.avoid(source)
        except NoSpace as exc:
            log.info("replication %s -> %s: %s", source, target, exc)
            problem = "full"
        except MosafsError as exc:
            log.info("replication %s -> %s failed: %s", source, target, exc)
        self._registry.target_problem(target, problem)
        done = [cid for cid, ok in zip(ids, copied, strict=True) if ok]
        try:
            self._store.add_chunk_locations((cid, target) for cid in done)
        except MosafsError as exc:
            log.warning("recording %d copies on %s failed: %s", len(done), target, exc)
            return [False] * len(ids)
        return copied

    def _finished(self, group: list[tuple[bytes, int]], copied: list[bool],
                  target: str) -> None:
        """Book a group's outcome; its ids are examined again. Holds _lock."""
        moved = 0
        for (cid, n), ok in zip(group, copied, strict=True):
            self._inflight[cid] -= 1
            if self._inflight[cid] <= 0:
                del self._inflight[cid]
                self._queue[cid] = None
            moved += n if ok else 0
        self._inflight_bytes -= sum(n for _, n in group)
        if moved:
            self._copied_total += moved
            self._done.add(moved)
            metrics.MANAGER_REPLICATED.inc(moved)

    # -- the safety net --------------------------------------------------------------------

    def _scan_some(self, view: Redundancy) -> None:
        """Continue the full scan for at most scan_budget_s, queueing short chunks."""
        now = self._clock()
        if not self._scan_unlimited and now < self._scan_resume:
            return
        if self._scan_cursor is None:
            if now < self._next_scan:
                return
            self._scan_cursor, self._scan_started = b"", now
        began = time.monotonic()
        stop = began + self._scan_budget_s
        try:
            self._scan_slice(view, stop)
        finally:
            spent = time.monotonic() - began
            self._scan_resume = self._clock() + spent * (1 - SCAN_SHARE) / SCAN_SHARE

    def _scan_slice(self, view: Redundancy, stop: float) -> None:
        while self._scan_cursor is not None and time.monotonic() < stop:
            page = self._store.chunk_page(self._scan_cursor, SCAN_PAGE)
            if not page:
                with self._lock:
                    self._figures.full_scan_at = self._clock()
                self._scan_cursor = None
                self._next_scan = self._scan_started + self._scan_interval_s
                return
            self._scan_cursor = page[-1][0]
            unreferenced = [cid for cid, rec in page if not rec.refcount]
            if unreferenced and self.unreferenced_found is not None:
                self.unreferenced_found(unreferenced)
            short = [cid for cid, rec in page
                     if rec.refcount and (view.missing(rec) or view.converts(rec))]
            if short:
                with self._lock:
                    for cid in short:
                        if cid not in self._short and not self._inflight[cid]:
                            self._queue[cid] = None

    def _publish(self, view: Redundancy, *, current: bool, at: float) -> None:
        unreachable = view.unreachable(self._registry)
        chunks = self._store.chunk_count()
        with self._lock:
            f = self._figures
            f.chunks = chunks
            f.under_replicated_chunks = len(self._short)
            f.replication_backlog_bytes = sum(s.missing * s.length for s in self._short.values())
            f.lost_chunks = sum(s.lost for s in self._short.values())
            coded = [s for s in self._short.values() if s.coded]
            f.ec_short_chunks = len(coded)
            f.ec_missing_fragments = sum(s.missing for s in coded)
            f.ec_lost_chunks = sum(s.lost for s in coded)
            f.unreachable = unreachable
            if current:
                f.scanned_at = at


def _split(chunks: list[tuple[bytes, int]], limit: int) -> list[list[tuple[bytes, int]]]:
    """CHUNKS in groups of at most LIMIT bytes (a chunk larger than LIMIT goes alone)."""
    groups: list[list[tuple[bytes, int]]] = [[]]
    size = 0
    for cid, n in chunks:
        if groups[-1] and size + n > limit:
            groups.append([])
            size = 0
        groups[-1].append((cid, n))
        size += n
    return [g for g in groups if g]
