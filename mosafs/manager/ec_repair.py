"""The fragment repairer (docs/erasure_pools.md, "Repair", "Drain", "Conversion"): keeps
erasure-coded chunks at K+M fragments on distinct benefactors, and re-encodes the chunks
of a pool whose redundancy changed, planned here and done by the benefactors.

It gets its work from replication (mosafs.manager.replication), which finds it on the
same events as whole copies: a benefactor found dead, a commit with holes (optimistic
writes), a fragment reported corrupt or missing (readers, scrub), a drain or a move, a
pool's redundancy changed, and the safety-net scan of the chunk index. Replication hands
over the chunks that are coded and short of fragments, and those whose layout is not
their pool's any more (`Replicator.handoff`); each `step` examines a batch of them (one
snapshot of the cluster: `Redundancy`), plans one request per chunk (mosafs.manager.
ec_plans: CONVERT, REBUILD or MOVE) and starts what may start.

Priority of client writes, and spreading: at most `per_worker` requests run at once on
each benefactor (the benefactor itself runs at most two RecodeChunk requests at a time),
of which at most one a conversion, and repairs start before conversions; the plans
waiting and running hold at most `max_inflight_bytes` (the rest stays queued). Rebuilders
and targets are chosen least busy first, so the chunks of a dead benefactor are rebuilt by
all the survivors in parallel. Links are reserved at both ends, as Ceph reserves backfill
slots on the source and the target OSD: a request starts only while each benefactor it
reads from sends at most `per_link` transfers and each one it puts to (or reads into)
receives at most `per_link` (a request wider than that starts on idle links). Without it
the survivors that happened to hold many of the lost chunks' other fragments served many
reads at once while others served none: with six survivors the links ran at two thirds
of their speed (docs/benchmarks.md, "Rebuild"); plans waiting for a busy link let others
whose links are free go first, and a rebuild whose links are busy when its turn comes is
bound again to the benefactors whose links are free then (`ec_plans.rebound`).

A request that ends records its outcome in one transaction (`record_fragments`: the new
holders; `convert_chunk`: the new layout, swapped only if the record still has the layout
that was read), then the chunk is examined again at once (more to do: a move after a
rebuild) and by replication (its figures). A request that failed, and a chunk that cannot
be helped now (fewer than K fragments readable, no benefactor with room that holds none
of it), is examined again after `retry_s`. Targets that were full or unreachable are
marked so in the registry, as replication does. Every request has a deadline that grows
with its bytes. Garbage collection spares what running requests put (`oldest_work_ns`):
their blobs are recorded only when they end.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mosafs import metrics
from mosafs._proto import benefactor_pb2, metadata_pb2
from mosafs.errors import DeadlineExceeded, MosafsError, Unavailable
from mosafs.ids import ID_LEN
from mosafs.manager.ec_plans import CONVERT, MOVE, REBUILD, Load, Plan, fits, plan, rebound
from mosafs.manager.metadata import Fragments, MetadataStore
from mosafs.manager.pools import scheme
from mosafs.manager.redundancy_view import Redundancy
from mosafs.manager.registry import Clock, Registry
from mosafs.manager.tokens import TokenAuthority
from mosafs.manager.transfers import CopyFn, RateWindow, copy_deadline

log = logging.getLogger(__name__)

MiB = 1 << 20
# recode(benefactor address, request, timeout) -> its answer (mosafs.rpc.peers)
RecodeFn = Callable[[str, benefactor_pb2.RecodeChunkRequest, float],
                    benefactor_pb2.RecodeChunkResponse]
TICK_S = 0.2
EXAMINE_BATCH = 1024


@dataclass
class Conversion:
    """A pool's conversion, for `mosafs status`."""

    pool: str
    redundancy: str
    done_chunks: int = 0
    done_bytes: int = 0
    remaining_chunks: int = 0
    remaining_bytes: int = 0
    counted: bool = False
    stuck_chunks: int = 0


class FragmentRepairer:
    def __init__(self, store: MetadataStore, registry: Registry, recode: RecodeFn,
                 copy: CopyFn, *, tokens: TokenAuthority | None = None,
                 clock: Clock = time.monotonic, retry_s: float = 2.0, per_worker: int = 2,
                 per_link: int = 2, per_sender: int = 0,
                 max_inflight_bytes: int = 256 * MiB, workers: int = 16) -> None:
        """PER_SENDER: repairs that may wait for slots sending from one benefactor (0: two
        rounds of its link's slots)."""
        self._store = store
        self._registry = registry
        self._recode = recode
        self._copy = copy
        self._tokens = tokens
        self._clock = clock
        self._retry_s = retry_s
        self._per_worker = per_worker
        self._per_link = per_link
        self._per_sender = per_sender or 2 * per_link
        self._max_inflight_bytes = max_inflight_bytes
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="ec-repair")
        self._lock = threading.Lock()
        self._step_lock = threading.Lock()
        self.wakeup = threading.Event()
        # Told when a request ended (replication examines the chunk again: its figures).
        self.on_done: Callable[[list[bytes]], None] = lambda ids: None
        # To examine, in order: short chunks (repairs) first; chunks only to convert when
        # no repair is queued.
        self._queue: OrderedDict[bytes, None] = OrderedDict()
        self._convert_queue: OrderedDict[bytes, None] = OrderedDict()
        self._later: dict[bytes, float] = {}  # id -> clock() to examine it again
        # Repairs whose sender's window of waiting plans is full: sender -> ids (_unpark).
        self._parked: dict[str, deque[bytes]] = {}
        self._parked_ids: set[bytes] = set()
        self._plans: dict[bytes, Plan] = {}  # waiting or running, one per chunk
        self._repairs: deque[Plan] = deque()
        self._conversions: deque[Plan] = deque()
        self._running: Counter[str] = Counter()  # worker -> requests running
        self._converting: Counter[str] = Counter()  # worker -> conversions running
        self._sending: Counter[str] = Counter()  # benefactor -> transfers out, running
        self._receiving: Counter[str] = Counter()  # benefactor -> transfers in, running
        self._pairs: Counter[tuple[str, str]] = Counter()  # (sender, receiver) -> running
        self._started: dict[bytes, int] = {}  # chunk id -> wall ns its request started
        self._load = Load()
        self._inflight_bytes = 0
        self._done = RateWindow(clock)  # fragments rebuilt or moved
        self.rebuilt_fragments = 0
        self.rebuilt_bytes = 0
        self.rebound = 0  # plans started with other benefactors than planned
        self._pending: dict[bytes, tuple[str, int]] = {}  # to convert: id -> (pool, length)
        self._converted: dict[str, list[int]] = {}  # pool -> [chunks, bytes] since change
        self._changed: dict[str, float] = {}  # pool -> clock() of its last change
        self._counted: set[str] = set()  # pools a full scan counted since their change

    # -- events ----------------------------------------------------------------------------

    def enqueue(self, ids: Iterable[bytes], *, convert: bool = False) -> None:
        """Examine IDS soon: coded and short of fragments, or (CONVERT) only to convert,
        which waits while repairs are queued."""
        with self._lock:
            queue = self._convert_queue if convert else self._queue
            for cid in ids:
                if cid not in self._plans and cid not in self._later \
                        and cid not in self._queue and cid not in self._parked_ids:
                    queue[cid] = None
        self.wakeup.set()

    def pool_changed(self, pool: str) -> None:
        """POOL's settings changed: its conversion figures start again."""
        with self._lock:
            self._changed[pool] = self._clock()
            self._converted.pop(pool, None)
            self._counted.discard(pool)

    # -- figures ---------------------------------------------------------------------------

    def pending(self, ids: Iterable[bytes]) -> bool:
        """Whether any of IDS is queued or has a request waiting or running."""
        with self._lock:
            return any(cid in self._queue or cid in self._convert_queue or cid in self._plans
                       or cid in self._parked_ids
                       for cid in ids)

    def busy(self) -> bool:
        with self._lock:
            return bool(self._queue or self._convert_queue or self._plans or self._parked)

    def oldest_work_ns(self) -> int | None:
        """Wall ns when the oldest running request started (None: none runs)."""
        with self._lock:
            return min(self._started.values(), default=None)

    def rate(self) -> float:
        """Bytes of fragments rebuilt or moved per second, over the last RATE_WINDOW_S."""
        with self._lock:
            return self._done.rate()

    def conversions(self, scanned_at: float) -> list[Conversion]:
        """Per pool with chunks converted since its change, or left to convert. SCANNED_AT:
        clock() when the last full scan of the index ended whose finds were all handed
        over (0: none): a pool changed before it has every chunk to convert counted."""
        settings = {p.name: p for p in self._store.pools()}
        with self._lock:
            out: dict[str, Conversion] = {}

            def entry(pool: str) -> Conversion:
                if pool not in out:
                    if scanned_at > self._changed.get(pool, 0.0) and scanned_at > 0:
                        self._counted.add(pool)  # until its next change
                    kind = str(scheme(settings[pool])) if pool in settings else "?"
                    out[pool] = Conversion(pool, kind, counted=pool in self._counted)
                return out[pool]

            for pool, (chunks, nbytes) in self._converted.items():
                e = entry(pool)
                e.done_chunks, e.done_bytes = chunks, nbytes
            for cid, (pool, length) in self._pending.items():
                e = entry(pool)
                e.remaining_chunks += 1
                e.remaining_bytes += length
                e.stuck_chunks += cid in self._later
            return [out[p] for p in sorted(out)]

    # -- the loop --------------------------------------------------------------------------

    def handoff(self, ids: list[bytes], conversions: Sequence[tuple[bytes, str, int]]) -> None:
        """From replication: IDS to examine; CONVERSIONS (id, pool, length) are those of
        them only to convert (not short: they wait behind repairs; counted as remaining at
        once)."""
        converting = {cid for cid, _, _ in conversions}
        with self._lock:
            for cid, pool, length in conversions:
                self._pending[cid] = (pool, length)
        self.enqueue([cid for cid in ids if cid not in converting])
        self.enqueue(converting, convert=True)

    def step(self) -> float:
        """Examine a batch, plan, start what may start. Seconds to wait before the next
        (0: more is queued)."""
        with self._step_lock:
            batch, queue, waiting = self._take()
            if batch:
                view = Redundancy(self._store, self._registry)
                cap = self._cap()
                # A chunk with a request waiting or running is examined again when that
                # request ends; its record read now may be from before that end (as the
                # replicator's examination, mosafs.manager.replication._examine).
                with self._lock:
                    running = {cid for cid in batch if cid in self._plans}
                records = self._store.chunk_records(batch)
                senders = self._waiting_senders(waiting)
                for i, (cid, rec) in enumerate(zip(batch, records, strict=True)):
                    if len(waiting) >= cap:  # rounds of slots are planned: the rest later
                        with self._lock:
                            for rest in reversed(batch[i:]):
                                queue[rest] = None
                                queue.move_to_end(rest, last=False)
                        break
                    if cid not in running:
                        self._examine(cid, rec, view, senders)
            self._dispatch()
            return 0.0 if self._more() else TICK_S

    def _cap(self) -> int:
        """Plans that may wait for a slot, of each kind: four rounds of every live
        benefactor's slots, so that each plan is made with the load of its time (plans
        made all at once, long before they can run, left some workers a backlog at the
        end while the others were idle), and the dispatcher has plans on other links to
        start while some wait for a busy one. Repairs are bounded per sender too
        (`per_sender`), which binds first where every benefactor sends."""
        return 4 * self._per_worker * max(1, len(self._registry.live()))

    def _more(self) -> bool:
        """Whether a step now would find something to plan."""
        cap = self._cap()
        with self._lock:
            if self._inflight_bytes >= self._max_inflight_bytes:
                return False
            if self._queue:
                return len(self._repairs) < cap
            return bool(self._convert_queue) and len(self._conversions) < cap

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _take(self) -> tuple[list[bytes], OrderedDict[bytes, None], deque[Plan]]:
        """Up to EXAMINE_BATCH ids of one queue (repairs first; conversions only while no
        repair is queued), that queue, and the plans of its kind waiting for slots."""
        now = self._clock()
        cap = self._cap()
        with self._lock:
            for cid in [c for c, at in self._later.items() if at <= now]:
                del self._later[cid]
                self._queue[cid] = None
                self._convert_queue.pop(cid, None)
            if self._inflight_bytes >= self._max_inflight_bytes:
                return [], self._queue, self._repairs
            if self._queue:
                queue, waiting = self._queue, self._repairs
            else:
                queue, waiting = self._convert_queue, self._conversions
            if len(waiting) >= cap:
                return [], queue, waiting
            batch = list(itertools.islice(queue, EXAMINE_BATCH))
            for cid in batch:
                del queue[cid]
            return batch, queue, waiting

    def _waiting_senders(self, waiting: deque[Plan]) -> Counter[str]:
        with self._lock:
            return _senders(waiting)

    def _unpark(self) -> None:
        """Under the lock: the parked repairs of each sender with room in its window go
        back to the front of the queue, as many as it has room for."""
        if not self._parked:
            return
        senders = _senders(self._repairs)
        for sender in list(self._parked):
            ids = self._parked[sender]
            for _ in range(max(0, self._per_sender - senders[sender])):
                if not ids:
                    break
                cid = ids.popleft()
                self._parked_ids.discard(cid)
                self._queue[cid] = None
                self._queue.move_to_end(cid, last=False)
            if not ids:
                del self._parked[sender]

    def _examine(self, cid: bytes, rec: metadata_pb2.ChunkRecord | None,
                 view: Redundancy, senders: Counter[str]) -> None:
        """Plan CID's next request. SENDERS: waiting plans per benefactor they send from;
        a repair reading from one whose window is full (`per_sender`) is parked until it
        has room (`_unpark`), so that each sender's link gets its share of the plans
        waiting, whatever order the queue holds the chunks in (a queue that held one
        survivor's chunks last left its link idle for most of a rebuild and busy alone at
        the end: docs/benchmarks.md, "Rebuild"). Not possible now: examined again after
        retry_s."""
        with self._lock:
            if cid in self._plans:
                return  # examined again when its request ends
            if rec is None or rec.refcount == 0:
                self._pending.pop(cid, None)
                return
            converts = view.converts(rec)
            if converts:
                self._pending[cid] = (view.pool(rec), rec.length)
            else:
                self._pending.pop(cid, None)
            found = plan(cid, rec, view, self._load)
            if found is None:
                if converts or view.missing(rec):
                    self._later[cid] = self._clock() + self._retry_s  # not possible now
                return
            reads_from = _sending(found)
            full = [s for s in reads_from if senders[s] >= self._per_sender]
            if found.kind == REBUILD and full:
                self._parked.setdefault(full[0], deque()).append(cid)
                self._parked_ids.add(cid)
                return
            senders.update(reads_from)
            self._plans[cid] = found
            self._load.add(found)
            self._inflight_bytes += found.store_bytes
            (self._conversions if found.kind == CONVERT else self._repairs).append(found)

    def _dispatch(self) -> None:
        with self._lock:
            named = {b for q in (self._repairs, self._conversions) for p in q
                     for b in (p.worker, *p.targets, *p.copies, *(h for _, h in p.fragments),
                               *(m.holder for m in p.moves), *p.spare)}
        if not named:
            with self._lock:
                # No plan waits, so every sender's window has room: the parked repairs
                # go back to the queue (else, when the ones let out last made no plan,
                # nothing would ever let the rest out).
                self._unpark()
            return
        addresses = self._store.benefactor_addresses(named)
        with self._lock:
            for queue in (self._repairs, self._conversions):
                held: deque[Plan] = deque()
                while queue:
                    p = queue.popleft()
                    # Bound again whenever it may start: the links' peers of now decide
                    # (ec_plans.mixing), not those of when it was planned.
                    q = rebound(p, self._may_start, self._sending, self._receiving,
                                self._pairs, self._per_link)
                    if q is None and not self._may_start(p):
                        held.append(p)
                        continue
                    if q is not None:
                        self._rebind(p, q)
                        p = q
                    self._running[p.worker] += 1
                    self._converting[p.worker] += p.kind == CONVERT
                    self._reserve(p, 1)
                    self._started[p.cid] = time.time_ns()
                    self._pool.submit(self._run, p, addresses)
                queue.extend(held)
            # The plans that started left room in their senders' windows (nothing else
            # empties a window: a plan leaves it only by starting).
            self._unpark()

    def _may_start(self, p: Plan) -> bool:
        """Whether P may start now: a slot free on its worker (one conversion each), and
        on every link it uses (under the lock)."""
        return self._running[p.worker] < self._per_worker and not (
            p.kind == CONVERT and self._converting[p.worker] >= 1) and \
            fits(p, self._sending, self._receiving, self._per_link)

    def _rebind(self, p: Plan, q: Plan) -> None:
        """Q replaces waiting plan P (the same repair, other benefactors: under the lock)."""
        self._load.add(p, -1)
        self._load.add(q)
        self._plans[q.cid] = q
        self.rebound += q.transfers() != p.transfers() or q.moves != p.moves

    def _reserve(self, p: Plan, sign: int) -> None:
        for sender, receiver in p.transfers():
            self._sending[sender] += sign
            self._receiving[receiver] += sign
            self._pairs[sender, receiver] += sign
        if sign < 0:
            self._sending += Counter()  # drop zeros
            self._receiving += Counter()
            self._pairs += Counter()

    def _run(self, p: Plan, addresses: dict[str, str]) -> None:
        ok = False
        started = time.monotonic()
        try:
            ok = self._move(p, addresses) if p.kind == MOVE else self._ask(p, addresses)
        except MosafsError as exc:
            log.info("%s of chunk %s on %s failed: %s", p.kind, p.cid.hex(), p.worker,
                     exc.message)
        except Exception:
            log.exception("bug in a %s of chunk %s", p.kind, p.cid.hex())
        finally:  # whatever happened: the slot is free, the chunk is examined again
            log.debug("%s of chunk %s on %s: %s in %.3f s", p.kind, p.cid.hex()[:16], p.worker,
                      "done" if ok else "not done", time.monotonic() - started)
            with self._lock:
                self._running[p.worker] -= 1
                self._converting[p.worker] -= p.kind == CONVERT
                self._reserve(p, -1)
                self._running += Counter()
                self._converting += Counter()
                del self._plans[p.cid]
                self._started.pop(p.cid, None)
                self._load.add(p, -1)
                self._inflight_bytes -= p.store_bytes
                if ok:
                    self._queue[p.cid] = None
                else:
                    self._later[p.cid] = self._clock() + self._retry_s
            self.on_done([p.cid])
            self.wakeup.set()

    # -- requests --------------------------------------------------------------------------

    def _address(self, addresses: dict[str, str], bid: str) -> str:
        address = addresses.get(bid)
        if not address:
            raise Unavailable(f"benefactor {bid} is not registered any more")
        return address

    def _move(self, p: Plan, addresses: dict[str, str]) -> bool:
        """Ask the holder to copy its fragment (ReplicateChunks), record the new holder."""
        (move,) = p.moves
        target = self._address(addresses, move.holder)
        try:
            copied, problem = self._copy(self._address(addresses, p.worker), target,
                                         [move.fid], copy_deadline(p.store_bytes))
        except (Unavailable, DeadlineExceeded):
            self._registry.avoid(p.worker)
            raise
        self._registry.target_problem(move.holder, problem)
        if not copied or not copied[0]:
            return False
        return self._record(p, [True])

    def _ask(self, p: Plan, addresses: dict[str, str]) -> bool:
        """A RecodeChunk request to the worker; its outcome recorded."""
        request = self._request(p, addresses)
        try:
            reply = self._recode(self._address(addresses, p.worker), request,
                                 copy_deadline(p.read_bytes + p.store_bytes))
        except (Unavailable, DeadlineExceeded):
            self._registry.avoid(p.worker)
            raise
        targets = [m.holder for m in p.moves] if p.kind == REBUILD else list(p.targets)
        if len(reply.stored) != len(targets) or len(reply.target_problems) != len(targets):
            log.info("%s of chunk %s: %s answered %d of %d targets", p.kind, p.cid.hex(),
                     p.worker, len(reply.stored), len(targets))
            return False
        for bid, problem in zip(targets, reply.target_problems, strict=True):
            self._registry.target_problem(bid, problem)
        stored = list(reply.stored)
        if p.kind == REBUILD:
            return self._record(p, stored) and all(stored)
        return self._swap(p, reply, stored)

    def _request(self, p: Plan, addresses: dict[str, str]) -> benefactor_pb2.RecodeChunkRequest:
        rec_ids, k, m = list(p.expect.ids), p.expect.k, p.expect.m

        def where(bid: str) -> str:
            return "" if bid == p.worker else self._address(addresses, bid)

        blobs = [(p.cid, b) for b in p.copies] + [(rec_ids[i], h) for i, h in p.fragments]
        tokens = self._read_tokens(p.worker, [blob for blob, b in blobs if b != p.worker])
        token = iter(tokens)

        def source(index: int, blob_id: bytes, bid: str) -> benefactor_pb2.BlobSource:
            out = benefactor_pb2.BlobSource(index=index, address=where(bid))
            if bid != p.worker and tokens:
                out.token = next(token)
            return out

        request = benefactor_pb2.RecodeChunkRequest(chunk_id=p.cid, length=p.length)
        request.copies.extend(source(0, p.cid, b) for b in p.copies)
        if k:
            request.ec_k, request.ec_m = k, m
            request.fragment_ids.extend(rec_ids)
            request.fragments.extend(source(i, rec_ids[i], h) for i, h in p.fragments)
        if p.kind == REBUILD:
            request.out_k, request.out_m = k, m
            request.targets.extend(benefactor_pb2.RecodeTarget(index=mv.index,
                                                               address=where(mv.holder))
                                   for mv in p.moves)
        else:
            request.out_k, request.out_m = p.out_k, p.out_m
            request.targets.extend(benefactor_pb2.RecodeTarget(
                index=i if p.out_k else 0, address=where(t)) for i, t in enumerate(p.targets))
        return request

    def _read_tokens(self, worker: str, blobs: list[bytes]) -> list[bytes]:
        """Read tokens of BLOBS for WORKER's certificate (none without tokens)."""
        if self._tokens is None or not blobs:
            return []
        holder = self._registry.fingerprint(worker)
        if not holder:
            raise Unavailable(f"benefactor {worker} has not presented its certificate to "
                              f"this manager yet: no read tokens for it")
        return self._tokens.read_tokens(blobs, holder)

    def _record(self, p: Plan, stored: list[bool]) -> bool:
        """Record the fragments stored (one transaction); whether all were recorded."""
        moves = [mv for mv, ok in zip(p.moves, stored, strict=True) if ok]
        if not moves:
            return False
        recorded = self._store.record_fragments(p.cid, moves)
        size = p.store_bytes // len(p.moves)
        with self._lock:
            self.rebuilt_fragments += recorded
            self.rebuilt_bytes += recorded * size
            self._done.add(recorded * size)
        metrics.MANAGER_REPLICATED.inc(recorded * size)
        log.debug("%s of chunk %s: %d fragments recorded", p.kind, p.cid.hex(), recorded)
        return recorded == len(p.moves)

    def _swap(self, p: Plan, reply: benefactor_pb2.RecodeChunkResponse,
              stored: list[bool]) -> bool:
        """A conversion whose every blob was stored: the record takes the new layout."""
        if not all(stored):
            return False  # never less redundancy: the stored ones are garbage
        if p.out_k:
            ids = [bytes(f) for f in reply.fragment_ids]
            if len(ids) != p.out_k + p.out_m or any(len(f) != ID_LEN for f in ids):
                log.info("conversion of chunk %s: %s answered %d fragment ids", p.cid.hex(),
                         p.worker, len(ids))
                return False
            swapped = self._store.convert_chunk(
                p.cid, p.expect, fragments=Fragments(p.out_k, p.out_m, tuple(ids), p.targets))
        else:
            swapped = self._store.convert_chunk(p.cid, p.expect, copies=p.targets)
        if swapped:
            with self._lock:
                done = self._converted.setdefault(p.pool, [0, 0])
                done[0] += 1
                done[1] += p.length
                self._pending.pop(p.cid, None)
        return swapped


def _sending(p: Plan) -> set[str]:
    """The benefactors P's transfers leave from (what it reads from peers, and its puts'
    worker)."""
    return {s for s, _ in p.transfers()}


def _senders(plans: Iterable[Plan]) -> Counter[str]:
    """Per benefactor, how many of PLANS send from it."""
    return Counter(s for p in plans for s in _sending(p))
