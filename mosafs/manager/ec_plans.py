"""What the fragment repairer does for one chunk (docs/erasure_pools.md, "Repair" and
"Conversion"): pure planning over one chunk record and one snapshot of the cluster
(redundancy_view.Redundancy); mosafs.manager.ec_repair runs the plans.

- CONVERT: the record's layout is not the one its pool gives it now (Redundancy.converts):
  one benefactor reads the chunk (a whole copy, or K fragments), verifies it, encodes the
  new layout and puts it to the new holders: fragments of the pool's K'+M' on K'+M'
  distinct benefactors, or the pool's R whole copies. Chosen before a repair: it rewrites
  every fragment anyway.
- REBUILD: fragments whose slot is empty (an optimistic write's hole, a corrupt or missing
  fragment dropped by scrub) or whose holder is dead: one benefactor reads K fragments,
  rebuilds those, and puts each to a benefactor of the pool that holds no fragment of the
  chunk (itself, if it is one of those).
- MOVE: a fragment whose holder is alive but does not count (draining, or moved to
  another pool): that holder copies its blob to such a benefactor (ReplicateChunks, one
  transfer instead of K).

The worker (rebuilder, converter) is the least busy of the benefactors that hold part of
the chunk (a local read saves a transfer) and those that will store part of it (a local
put saves one): `Load` counts, per benefactor, the plans it has waiting or running and the
bytes planned to it, so that consecutive chunks go to different rebuilders and targets.

A REBUILD keeps the other benefactors that could take its fragments (`spare`): when its
turn comes and its links are busy, `rebound` makes the same repair with the rebuilder,
sources and targets whose links are free then (late binding). A plan bound when it was
made waited for its own target while links that could have served it stood idle.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from mosafs._proto import metadata_pb2
from mosafs.manager.metadata import FragmentMove, Layout
from mosafs.manager.pools import fragment_size
from mosafs.manager.redundancy_view import Redundancy
from mosafs.manager.registry import FULL_BELOW_BYTES

REBUILD = "rebuild"
MOVE = "move"
CONVERT = "convert"


@dataclass
class Load:
    """What is planned already: bytes to be stored on each benefactor, and plans each one
    runs or waits to run."""

    planned: Counter[str] = field(default_factory=Counter)
    work: Counter[str] = field(default_factory=Counter)

    def add(self, plan: Plan, sign: int = 1) -> None:
        self.work[plan.worker] += sign
        for bid, n in plan.stored_on().items():
            self.planned[bid] += sign * n
        self.work += Counter()  # drop zeros
        self.planned += Counter()


@dataclass(frozen=True)
class Plan:
    cid: bytes
    kind: str                 # REBUILD | MOVE | CONVERT
    worker: str               # the benefactor asked (for MOVE: the holder that copies)
    pool: str
    length: int               # of the chunk
    read_bytes: int           # bytes the worker reads from peers (at most)
    store_bytes: int          # bytes the plan stores on its targets
    moves: tuple[FragmentMove, ...] = ()  # REBUILD, MOVE: the slots it fills
    # the record's layout when planned (CONVERT swaps only if it is still so; the
    # fragment ids a repair reads)
    expect: Layout = field(default_factory=Layout)
    out_k: int = 0            # CONVERT: the new layout (0: whole copies)
    out_m: int = 0
    targets: tuple[str, ...] = ()  # CONVERT: fragment i (or copy i) -> benefactor
    copies: tuple[str, ...] = ()  # sources: holders of whole copies, usable now
    fragments: tuple[tuple[int, str], ...] = ()  # sources: (index, holder), best first
    spare: tuple[str, ...] = ()  # REBUILD: other benefactors that could take its fragments

    def transfers(self) -> list[tuple[str, str]]:
        """(sender, receiver) of each transfer between benefactors this plan makes while
        it runs: the worker's reads from peers (the whole copy, or the first K fragments
        it tries: its own come first), and its puts to other benefactors."""
        worker = self.worker
        if self.kind == MOVE:
            return [(worker, m.holder) for m in self.moves if m.holder != worker]
        k = self.expect.k
        reads = [self.copies[0]] if self.copies else [h for _, h in self.fragments[:k]]
        puts = self.targets if self.kind == CONVERT else tuple(m.holder for m in self.moves)
        return [(h, worker) for h in reads if h != worker] + \
            [(worker, t) for t in puts if t != worker]

    def stored_on(self) -> dict[str, int]:
        """Bytes this plan puts on each benefactor."""
        if self.kind == CONVERT:
            each = self.store_bytes // max(1, len(self.targets))
            return dict.fromkeys(self.targets, each)
        each = self.store_bytes // max(1, len(self.moves))
        return {move.holder: each for move in self.moves}


def plan(cid: bytes, rec: metadata_pb2.ChunkRecord, view: Redundancy,
         load: Load) -> Plan | None:
    """The next thing to do for referenced chunk record REC (None: nothing can be done
    now, or nothing is needed)."""
    if view.converts(rec):
        converted = convert_plan(cid, rec, view, load)
        if converted is not None:
            return converted
    if rec.ec_k:
        return repair_plan(cid, rec, view, load)
    return None


def readable(rec: metadata_pb2.ChunkRecord, view: Redundancy) -> list[tuple[int, str]]:
    """(index, holder) of the fragments that may be read now: holder alive and usable
    (draining ones, and those of other pools, included)."""
    return [(i, h) for i, h in enumerate(rec.fragment_holders) if h and h in view.usable]


def fragment_targets(rec: metadata_pb2.ChunkRecord, view: Redundancy, load: Load,
                     size: int, *, exclude: frozenset[str] | set[str] = frozenset()
                     ) -> list[str]:
    """Benefactors of REC's pool that may take a blob of SIZE bytes for it: live, not
    draining, not avoided, not in EXCLUDE, room after what is planned for them; least
    planned first, then most free space."""
    members = view.accepting.get(view.pool(rec), {})
    fits = [b for b, info in members.items()
            if b in view.usable and b not in exclude
            and info.free_bytes - load.planned[b] >= FULL_BELOW_BYTES + size]
    return sorted(fits, key=lambda b: (load.planned[b], -members[b].free_bytes, b))


def _worker(candidates: list[str], load: Load, cid: bytes) -> str:
    """The least busy of CANDIDATES (ties spread by the chunk id)."""
    return min(dict.fromkeys(candidates), key=lambda b: (load.work[b], hash((cid, b))))


def _sources(pairs: list[tuple[int, str]], worker: str) -> tuple[tuple[int, str], ...]:
    """Fragments to read, the worker's own first, then data before parity."""
    return tuple(sorted(pairs, key=lambda p: (p[1] != worker, p[0])))


def repair_plan(cid: bytes, rec: metadata_pb2.ChunkRecord, view: Redundancy,
                load: Load) -> Plan | None:
    k = rec.ec_k
    holders = list(rec.fragment_holders)
    counted = set(view.counted_fragments(rec))
    size = fragment_size(rec.length, k)
    short = [i for i, h in enumerate(holders) if not h or h not in counted]
    if not short:
        return None
    named = {h for h in holders if h}
    pool = view.pool(rec)
    rebuild = [i for i in short if holders[i] not in view.usable]
    if rebuild:
        sources = readable(rec, view)
        if len(sources) < k:
            return None  # lost for now: a holder may come back
        eligible = fragment_targets(rec, view, load, size, exclude=named)
        targets = eligible[:len(rebuild)]
        if not targets:
            return None
        moves = tuple(FragmentMove(i, bytes(rec.fragment_ids[i]), holders[i], t)
                      for i, t in zip(rebuild, targets, strict=False))
        worker = _worker([h for _, h in sources] + targets, load, cid)
        local = sum(h == worker for _, h in sources[:k])
        return Plan(cid, REBUILD, worker, pool, rec.length, read_bytes=(k - local) * size,
                    store_bytes=len(moves) * size, moves=moves, expect=Layout.of(rec),
                    fragments=_sources(sources, worker), spare=tuple(eligible[len(moves):]))
    # Every short slot's holder is alive (draining, or moved to another pool): copy one.
    i = short[0]
    targets = fragment_targets(rec, view, load, size, exclude=named)[:1]
    if not targets:
        return None
    move = FragmentMove(i, bytes(rec.fragment_ids[i]), holders[i], targets[0])
    return Plan(cid, MOVE, holders[i], pool, rec.length, read_bytes=0, store_bytes=size,
                moves=(move,), expect=Layout.of(rec))


def convert_plan(cid: bytes, rec: metadata_pb2.ChunkRecord, view: Redundancy,
                 load: Load) -> Plan | None:
    k, m = view.wanted(rec)
    if k:
        width, size = k + m, fragment_size(rec.length, k)
    else:
        width, size = view.want(rec), rec.length
    targets = fragment_targets(rec, view, load, size)[:width]
    if len(targets) < width:
        return None  # too few benefactors with room now: retried
    copies = [b for b in rec.benefactor_ids if b in view.usable]
    sources = readable(rec, view) if rec.ec_k else []
    if not copies and len(sources) < max(rec.ec_k, 1):
        return None  # nothing readable now
    worker = _worker(copies + [h for _, h in sources] + targets, load, cid)
    if worker in copies:
        read = 0
    elif copies:
        read = rec.length
    else:
        read = (rec.ec_k - sum(h == worker for _, h in sources[:rec.ec_k])) * \
            fragment_size(rec.length, rec.ec_k)
    return Plan(cid, CONVERT, worker, view.pool(rec), rec.length, read_bytes=read,
                store_bytes=width * size, expect=Layout.of(rec), out_k=k, out_m=m,
                targets=tuple(targets), copies=tuple(sorted(copies, key=lambda b: b != worker)),
                fragments=_sources(sources, worker))


def fits(p: Plan, sending: Counter[str], receiving: Counter[str], per_link: int) -> bool:
    """Whether P's transfers fit in its benefactors' link slots: each sends and receives
    at most PER_LINK at once (a plan that needs more alone starts on idle links)."""
    transfers = p.transfers()
    out = Counter(s for s, _ in transfers)
    into = Counter(r for _, r in transfers)
    return all(sending[b] == 0 or sending[b] + n <= per_link for b, n in out.items()) and \
        all(receiving[b] == 0 or receiving[b] + n <= per_link for b, n in into.items())


def _by_peers(worker: str, load: Counter[str], paired: Callable[[str], int],
              ) -> Callable[[str], tuple[bool, int, int, int]]:
    """Sort key of benefactors to exchange with WORKER: WORKER itself first (local), then
    those with the fewest transfers with others than WORKER (LOAD less PAIRED: `mixing`),
    then those already paired with it, then the least loaded."""
    def key(b: str) -> tuple[bool, int, int, int]:
        with_worker = paired(b)
        return (b != worker, load[b] - with_worker, -with_worker, load[b])
    return key


def _least_busy_sources(fragments: tuple[tuple[int, str], ...], worker: str,
                        sending: Counter[str], pairs: Counter[tuple[str, str]],
                        ) -> tuple[tuple[int, str], ...]:
    """FRAGMENTS to read, by their holders (`_by_peers` of what they send), data first."""
    key = _by_peers(worker, sending, lambda b: pairs[b, worker])
    return tuple(sorted(fragments, key=lambda f: (*key(f[1]), f[0])))


def _least_busy_targets(pool: tuple[str, ...], worker: str, receiving: Counter[str],
                        pairs: Counter[tuple[str, str]]) -> list[str]:
    """POOL by `_by_peers` of what they receive (WORKER first: its put is local)."""
    return sorted(pool, key=_by_peers(worker, receiving, lambda b: pairs[worker, b]))


def mixing(transfers: list[tuple[str, str]], sending: Counter[str], receiving: Counter[str],
           pairs: Counter[tuple[str, str]]) -> int:
    """How many running transfers would share a link with TRANSFERS but not their other
    end: a link that carries one peer's transfers only is one TCP connection, as each of
    two survivors' links is; a link shared between peers carries connections that compete
    at both of their ends and leave capacity unused (docs/erasure_pools.md, "Pairs")."""
    return sum(sending[s] + receiving[r] - 2 * pairs[s, r] for s, r in transfers)


def rebound(p: Plan, may_start: Callable[[Plan], bool], sending: Counter[str],
            receiving: Counter[str], pairs: Counter[tuple[str, str]] | None = None,
            per_link: int | None = None) -> Plan | None:
    """REBUILD P made again with the links of now: for each rebuilder that could run it
    (a holder of a readable fragment, or a benefactor that could take a rebuilt one), its
    own fragment and the least busy senders as sources, itself and the least busy
    receivers among P's targets and spares as targets; of those MAY_START allows, the one
    that leaves the busiest link least busy, then the one that mixes fewest peers on a
    link (PAIRS: running transfers per sender and receiver; `mixing`), then the one that
    adds least (None: none may start now). PER_LINK: the slots of a link each way, as
    MAY_START counts them; a plan that no choice could fit is then refused before any is
    made."""
    if p.kind != REBUILD or not p.spare:
        return None
    k = p.expect.k
    pool = tuple(dict.fromkeys((*(m.holder for m in p.moves), *p.spare)))
    if per_link is not None:
        if not p.copies and sum(sending[h] < per_link for _, h in p.fragments) < k:
            # Every choice reads K fragments: from holders with a slot free out, or its
            # own, and a rebuilder that holds one puts out of its own link. Most plans
            # waiting while the links are busy end here, at the cost of K+M counts (each
            # choice made costs a sort of the pool: a dispatch of 800 plans at 100
            # benefactors took 0.75 s of CPU; docs/erasure_pools.md, "Concurrency").
            return None
        pool = tuple(b for b in pool if receiving[b] < per_link)  # the others take nothing
        if not pool:
            return None
    best: tuple[tuple[int, int, int], Plan] | None = None
    pairs = pairs if pairs is not None else Counter()
    # Rebuilders: the holders of readable fragments, and of the benefactors that could
    # take a rebuilt one the least busy few (a large pool's every member, each with a sort
    # of the pool, would cost a dispatch milliseconds per plan).
    takers = heapq.nsmallest(len(p.moves) + 3, pool, key=lambda b: sending[b] + receiving[b])
    for worker in dict.fromkeys((*(h for _, h in p.fragments), *takers)):
        sources = _least_busy_sources(p.fragments, worker, sending, pairs)
        targets = _least_busy_targets(pool, worker, receiving, pairs)
        moves = tuple(replace(m, holder=t) for m, t in zip(p.moves, targets, strict=False))
        size = p.store_bytes // len(p.moves)
        local = sum(h == worker for _, h in sources[:k])
        q = replace(p, worker=worker, fragments=sources, moves=moves,
                    read_bytes=(k - local) * size,
                    spare=tuple(t for t in pool if t not in {m.holder for m in moves}))
        if not may_start(q):
            continue
        busiest = [sending[s] for s, _ in q.transfers()] + \
            [receiving[r] for _, r in q.transfers()]
        score = (max(busiest, default=0), mixing(q.transfers(), sending, receiving, pairs),
                 sum(busiest))
        if best is None or score < best[0]:
            best = (score, q)
    return None if best is None else best[1]
