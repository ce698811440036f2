"""`Redundancy`: one snapshot of the cluster's pools and benefactors, as the repairs plan
with it (replication in mosafs.manager.replication, fragments in mosafs.manager.ec_plans):
which copies or fragments of a chunk count towards its pool's redundancy, what layout the
pool gives it now, and where new copies may come from and go (docs/durability.md,
docs/erasure_pools.md).

A chunk belongs to the pool of the write that stored it first (ChunkRecord.pool; a pool
deleted since counts as "default"). Its copies that count are those on live (or, right
after a manager start, presumed live) benefactors of that pool that are not draining;
copies elsewhere (a benefactor moved to another pool, or draining) still serve reads and
replication sources.
"""

from __future__ import annotations

from collections import defaultdict

from mosafs._proto import benefactor_pb2, metadata_pb2
from mosafs.manager.metadata import MetadataStore
from mosafs.manager.pools import DEFAULT_POOL, ec_min_chunk, scheme
from mosafs.manager.registry import FULL_BELOW_BYTES, Registry


class Redundancy:
    """One snapshot of pools and benefactors: how many copies of a chunk count, and where
    new copies may come from and go."""

    def __init__(self, store: MetadataStore, registry: Registry) -> None:
        settings = store.pools()
        self.replication = {p.name: p.replication or 1 for p in settings}
        self.schemes = {p.name: scheme(p) for p in settings}
        self.min_chunk = {p.name: ec_min_chunk(p) for p in settings}
        records = store.benefactors()
        draining = {bid for bid, rec in records.items() if rec.draining}
        live = registry.live()
        self.alive = {b.id for b in live}
        self.usable = registry.usable()
        self.accepting: dict[str, dict[str, benefactor_pb2.BenefactorInfo]] = defaultdict(dict)
        for b in live:
            if b.id not in draining:
                self.accepting[b.pool][b.id] = b
        # Presumed alive (not heard from since the start, first lease): copies count.
        self._presumed: dict[str, set[str]] = defaultdict(set)
        for bid in registry.presumed():
            rec = records.get(bid)
            if rec is not None and not rec.draining:
                self._presumed[rec.pool].add(bid)

    def pool(self, rec: metadata_pb2.ChunkRecord) -> str:
        return rec.pool if rec.pool in self.replication else DEFAULT_POOL

    def want(self, rec: metadata_pb2.ChunkRecord) -> int:
        return self.replication.get(self.pool(rec), 1)

    def counted(self, rec: metadata_pb2.ChunkRecord) -> list[str]:
        """The copies that count towards R: live (or presumed), not draining, in the
        chunk's pool."""
        pool = self.pool(rec)
        accepting = self.accepting.get(pool, {})
        presumed = self._presumed.get(pool, set())
        return [b for b in rec.benefactor_ids if b in accepting or b in presumed]

    def missing(self, rec: metadata_pb2.ChunkRecord, *, without: str = "") -> int:
        """Copies (fragments, for an erasure-coded chunk) short of what the chunk needs,
        not counting any held by WITHOUT (a benefactor being drained)."""
        if rec.ec_k:
            return rec.ec_k + rec.ec_m - len([
                h for h in self.counted_fragments(rec) if h != without])
        return max(0, self.want(rec) - len([b for b in self.counted(rec) if b != without]))

    def counted_fragments(self, rec: metadata_pb2.ChunkRecord) -> list[str]:
        """Holders of an erasure-coded chunk's fragments that count: as counted()."""
        pool = self.pool(rec)
        accepting = self.accepting.get(pool, {})
        presumed = self._presumed.get(pool, set())
        return [h for h in rec.fragment_holders if h and (h in accepting or h in presumed)]

    def lost(self, rec: metadata_pb2.ChunkRecord) -> bool:
        """No live whole copy, and (erasure-coded) fewer than K live fragments: unreadable
        now (a dead holder may come back)."""
        if any(b in self.alive for b in rec.benefactor_ids):
            return False
        return not rec.ec_k or sum(h in self.alive for h in rec.fragment_holders) < rec.ec_k

    def wanted(self, rec: metadata_pb2.ChunkRecord) -> tuple[int, int]:
        """The layout REC's pool gives a chunk of its length now: (K, M) of its fragments,
        or (0, 0) for whole copies (replicas, or shorter than the pool's EC threshold)."""
        pool = self.pool(rec)
        kind = self.schemes.get(pool)
        if kind is None or not kind.coded or rec.length < self.min_chunk[pool]:
            return 0, 0
        return kind.k, kind.m

    def converts(self, rec: metadata_pb2.ChunkRecord) -> bool:
        """Whether referenced REC is stored in another layout than its pool gives it now
        (whole copies where it wants fragments, fragments of another K+M, or fragments
        where it wants copies) and the pool has the live benefactors the new layout needs
        (else the chunk keeps its layout, and replication its copies, until it has)."""
        if not rec.refcount:
            return False
        k, m = self.wanted(rec)
        if (k, m) == (rec.ec_k, rec.ec_m):
            return False
        width = k + m if k else self.want(rec)
        return len(self.accepting.get(self.pool(rec), {})) >= width

    def label(self, rec: metadata_pb2.ChunkRecord) -> str:
        """How REC is stored, for people: "ec:K+M", or "replicas:R" (its pool's R)."""
        return f"ec:{rec.ec_k}+{rec.ec_m}" if rec.ec_k else f"replicas:{self.want(rec)}"

    def sources(self, rec: metadata_pb2.ChunkRecord) -> list[str]:
        """Holders a copy may be read from now: live and not avoided (draining ones and
        other pools' included)."""
        return [b for b in rec.benefactor_ids if b in self.usable]

    def targets(self, rec: metadata_pb2.ChunkRecord, planned: dict[str, int]) -> list[str]:
        """Benefactors of the chunk's pool that may take a copy: live, not draining, not
        avoided, no copy yet, room for it after what is PLANNED for them; least planned,
        then most free space first."""
        pool = self.accepting.get(self.pool(rec), {})
        fits = [b for b, info in pool.items()
                if b not in rec.benefactor_ids and b in self.usable
                and info.free_bytes - planned.get(b, 0) >= FULL_BELOW_BYTES + rec.length]
        return sorted(fits, key=lambda b: (planned.get(b, 0), -pool[b].free_bytes, b))

    def unreachable(self, registry: Registry) -> list[str]:
        """Pools whose R is more than their live benefactors with room can hold (presumed
        ones count: right after a start nothing is known yet)."""
        out = []
        for name, want in sorted(self.replication.items()):
            kind = self.schemes[name]
            if kind.coded:
                want, what = kind.width, f"{kind}"
            else:
                what = f"R={want}"
            members = [*self.accepting.get(name, {}), *self._presumed.get(name, ())]
            with_room = [b for b in members if registry.takes(b)]
            if len(with_room) < want:
                full = len(members) - len(with_room)
                out.append(f"pool {name}: {what} needs {want} live benefactor"
                           f"{'s' if want > 1 else ''} with space, {len(members)} alive"
                           + (f" ({full} full)" if full else ""))
        return out
