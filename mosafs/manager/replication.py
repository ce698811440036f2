"""Background replication (DESIGN §8): keep every referenced chunk at its pool's R live
copies.

A chunk belongs to the pool of the write that stored it first (ChunkRecord.pool; a pool
deleted since counts as "default"). Its copies that count towards R are those on live
benefactors of that pool that are not draining (`Redundancy`); copies elsewhere (a
benefactor moved to another pool, or draining) still serve reads and replication sources.

One pass (`Replicator.run_once`) scans the chunk index page by page. For each referenced
chunk (refcount > 0) it counts the copies; a chunk with fewer than R is under-replicated,
and one with no live copy at all is lost for now (a dead holder may come back). For every
under-replicated chunk with a live copy it plans copies from one live holder to live,
non-draining benefactors of its pool that hold no copy (most free space first, spread over
the targets), groups them by (source, target) and asks the source to push each group
(`copy`, a callable the process supplies: benefactors copy chunks directly to each other).
Copies that succeed are recorded in the index in one transaction per group. Raising a
pool's R makes its chunks under-replicated, so the next passes copy them; lowering it
leaves the extra copies where they are.

Priority of new writes: a pass copies at most `max_pass_bytes`, groups go one at a time,
and benefactors run replication pushes with a small concurrency of their own, so client
puts always find most of a benefactor's capacity free.

The figures of the last pass (under-replicated chunks, backlog bytes, lost chunks, the
recent copy rate) are what `GetClusterStatus` reports. No pass starts before one
benefactor lease has passed since the manager started: until then benefactors that are
alive have not all sent a heartbeat, and copies made then would be redundant.

Scale: a pass reads the whole index (one protobuf decode per chunk, a few microseconds
each); with the default 1 s interval that is fine up to about a million chunks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mosafs._proto import benefactor_pb2, metadata_pb2
from mosafs.errors import MosafsError
from mosafs.manager.metadata import MetadataStore
from mosafs.manager.pools import DEFAULT_POOL
from mosafs.manager.registry import Clock, Registry

log = logging.getLogger(__name__)

# copy(source address, target address, ids) -> copied[i] for each id
CopyFn = Callable[[str, str, Sequence[bytes]], list[bool]]
MiB = 1 << 20


@dataclass
class ReplicationFigures:
    chunks: int = 0
    under_replicated_chunks: int = 0
    replication_backlog_bytes: int = 0
    lost_chunks: int = 0
    scanned_at: float = 0.0  # clock() when the pass that produced them began; 0: none yet


@dataclass
class _Plan:
    figures: ReplicationFigures = field(default_factory=ReplicationFigures)
    # (source id, target id) -> [(chunk id, length)]
    groups: dict[tuple[str, str], list[tuple[bytes, int]]] = field(
        default_factory=lambda: defaultdict(list))
    planned_bytes: int = 0


class Redundancy:
    """One snapshot of pools and benefactors: how many copies of a chunk count, and where
    new copies may go."""

    def __init__(self, store: MetadataStore, registry: Registry) -> None:
        self.replication = {p.name: p.replication or 1 for p in store.pools()}
        draining = registry.draining()
        live = registry.live()
        self.alive = {b.id for b in live}
        self.accepting: dict[str, dict[str, benefactor_pb2.BenefactorInfo]] = defaultdict(dict)
        for b in live:
            if b.id not in draining:
                self.accepting[b.pool][b.id] = b

    def pool(self, rec: metadata_pb2.ChunkRecord) -> str:
        return rec.pool if rec.pool in self.replication else DEFAULT_POOL

    def want(self, rec: metadata_pb2.ChunkRecord) -> int:
        return self.replication.get(self.pool(rec), 1)

    def counted(self, rec: metadata_pb2.ChunkRecord) -> list[str]:
        """The copies that count towards R: live, not draining, in the chunk's pool."""
        accepting = self.accepting.get(self.pool(rec), {})
        return [b for b in rec.benefactor_ids if b in accepting]

    def missing(self, rec: metadata_pb2.ChunkRecord) -> int:
        return max(0, self.want(rec) - len(self.counted(rec)))

    def sources(self, rec: metadata_pb2.ChunkRecord) -> list[str]:
        """Live holders of any copy (draining ones and other pools' included)."""
        return [b for b in rec.benefactor_ids if b in self.alive]


class Replicator:
    def __init__(self, store: MetadataStore, registry: Registry, copy: CopyFn, *,
                 clock: Clock = time.monotonic, max_pass_bytes: int = 256 * MiB,
                 group_bytes: int = 32 * MiB, page: int = 4096) -> None:
        self._store = store
        self._registry = registry
        self._copy = copy
        self._clock = clock
        self._started = clock()
        self._max_pass_bytes = max_pass_bytes
        self._group_bytes = group_bytes
        self._page = page
        self._lock = threading.Lock()
        self._pass_lock = threading.Lock()  # one pass at a time (loop, scrub repairs)
        self._figures = ReplicationFigures()
        self._rate = 0.0  # bytes/s, exponentially weighted over passes that copied

    # -- figures -------------------------------------------------------------------------

    def figures(self) -> tuple[ReplicationFigures, float]:
        """The last pass's figures and the recent copy rate (bytes/s)."""
        with self._lock:
            return ReplicationFigures(**vars(self._figures)), self._rate

    def time_to_full_redundancy(self) -> float:
        """Seconds until every chunk has R live copies at the recent rate: 0 when it has
        now, -1 when unknown (nothing copied yet, or only lost chunks are missing copies)."""
        figures, rate = self.figures()
        if figures.replication_backlog_bytes == 0:
            return 0.0 if figures.lost_chunks == 0 else -1.0
        return figures.replication_backlog_bytes / rate if rate > 0 else -1.0

    # -- one pass ------------------------------------------------------------------------

    def ready(self) -> bool:
        return self._clock() - self._started >= self._registry.lease_s

    def run_once(self) -> int:
        """Scan, copy what is missing (up to a pass's budget); returns bytes copied."""
        with self._pass_lock:
            return self._run_once()

    def _run_once(self) -> int:
        # The figures are as old as the scan's start: a commit during the scan may be
        # missing from them.
        scanned_at = self._clock()
        plan = self._plan()
        start = self._clock()
        copied = self._execute(plan) if self.ready() else 0
        elapsed = self._clock() - start
        with self._lock:
            plan.figures.scanned_at = scanned_at
            self._figures = plan.figures
            if copied and elapsed > 0:
                rate = copied / elapsed
                self._rate = rate if self._rate == 0 else 0.5 * self._rate + 0.5 * rate
        return copied

    def redundancy(self) -> Redundancy:
        return Redundancy(self._store, self._registry)

    def _plan(self) -> _Plan:
        plan = _Plan()
        view = self.redundancy()
        # Targets with the most free space first; `placed` spreads one pass's copies.
        placed: dict[str, int] = defaultdict(int)
        after = b""
        while True:
            page = self._store.chunk_page(after, self._page)
            if not page:
                break
            after = page[-1][0]
            for cid, rec in page:
                if rec.refcount == 0:
                    continue  # garbage, not data: nothing to protect
                plan.figures.chunks += 1
                missing = view.missing(rec)
                if missing <= 0:
                    continue
                plan.figures.under_replicated_chunks += 1
                plan.figures.replication_backlog_bytes += missing * rec.length
                sources = view.sources(rec)
                if not sources:
                    plan.figures.lost_chunks += 1
                    continue
                if plan.planned_bytes >= self._max_pass_bytes:
                    continue  # counted; copied by a later pass
                pool = view.accepting.get(view.pool(rec), {})
                candidates = sorted((b for b in pool if b not in rec.benefactor_ids),
                                    key=lambda b: (placed[b], -pool[b].free_bytes, b))
                source = sources[hash(cid) % len(sources)]  # spread reads over the holders
                for target in candidates[:missing]:
                    plan.groups[(source, target)].append((cid, rec.length))
                    placed[target] += rec.length
                    plan.planned_bytes += rec.length
        return plan

    def _execute(self, plan: _Plan) -> int:
        copied_bytes = 0
        addresses = {b.id: b.address for b in self._registry.live()}
        for (source, target), chunks in plan.groups.items():
            if source not in addresses or target not in addresses:
                continue  # died since the plan
            for group in _split(chunks, self._group_bytes):
                ids = [cid for cid, _ in group]
                try:
                    copied = self._copy(addresses[source], addresses[target], ids)
                except MosafsError as exc:
                    log.info("replication %s -> %s failed: %s", source, target, exc)
                    break  # next pass tries again, maybe with other benefactors
                done = [(cid, n) for (cid, n), ok in zip(group, copied, strict=True) if ok]
                self._store.add_chunk_locations((cid, target) for cid, _ in done)
                copied_bytes += sum(n for _, n in done)
        if copied_bytes:
            log.info("replicated %d bytes", copied_bytes)
        return copied_bytes


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
