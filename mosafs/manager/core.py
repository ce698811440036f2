"""The manager's write and read protocol (DESIGN §4, §7) on top of the metadata store, the
benefactor registry and the write leases, and the administration of versions, folders,
pools and benefactors (docs/lifecycle.md). The gRPC servicer calls this and the store; it
holds no state of its own beyond its parts."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mosafs import metrics
from mosafs._proto import common_pb2, manager_pb2
from mosafs.capability import ORIGIN
from mosafs.errors import (
    InvalidArgument,
    MosafsError,
    NoSpace,
    NotADirectory,
    NotFound,
)
from mosafs.manager import pools, pruning
from mosafs.manager.ec_repair import FragmentRepairer, RecodeFn
from mosafs.manager.folders import Folders, PruneResult
from mosafs.manager.fsck import FsckResult, fsck
from mosafs.manager.garbage import DeleteFn, GarbageCollector
from mosafs.manager.integrity import HasFn, Integrity, ScrubFn
from mosafs.manager.leases import Committed, LeaseTable, content_key
from mosafs.manager.metadata import (
    FINAL_COMMIT,
    ChunkEntry,
    Fragments,
    MetadataStore,
    SessionCommit,
    check_chunks,
    check_ids,
)
from mosafs.manager.pool_admin import PoolAdmin
from mosafs.manager.redundancy_view import Redundancy
from mosafs.manager.registry import Clock, Registry
from mosafs.manager.replication import Replicator
from mosafs.manager.tokens import TokenAuthority
from mosafs.manager.transfers import CopyFn

log = logging.getLogger(__name__)

MAX_FIND_CHUNKS = 65_536  # ids per FindChunks call: ~2.2 MiB of request
MAX_CLIENT_ID = 256
# run_round(benefactor address) -> (deleted chunks, freed bytes, chunks waiting)
RoundFn = Callable[[str], tuple[int, int, int]]
MAX_GC_STEPS = 64  # collection steps `mosafs gc` runs before its inventory rounds
PRUNE_INTERVAL_S = 3600.0  # the background pass over every folder with a policy


@dataclass(frozen=True)
class ManagerConfig:
    heartbeat_interval_s: float = 1.0
    benefactor_lease_s: float = 5.0
    write_lease_s: float = 60.0
    scan_interval_s: float = 60.0  # the safety-net scan of the chunk index, at most this often
    gc_grace_s: float = 600.0


class Manager(PoolAdmin):
    def __init__(self, store: MetadataStore, config: ManagerConfig | None = None, *,
                 clock: Clock = time.monotonic, copy: CopyFn | None = None,
                 run_round: RoundFn | None = None, scrub: ScrubFn | None = None,
                 has: HasFn | None = None, tokens: TokenAuthority | None = None,
                 recode: RecodeFn | None = None, delete: DeleteFn | None = None) -> None:
        """COPY asks one benefactor to copy chunks to another (replication); RUN_ROUND asks
        one to run a garbage-collection round now (`mosafs gc`). Without them nothing is
        replicated or collected on demand (unit tests of the metadata protocol). SCRUB asks
        one to verify every chunk now, HAS which ids it holds (`mosafs scrub`). TOKENS
        signs chunk access tokens (None: none are issued: plaintext, or turned off).
        RECODE asks one to rebuild fragments or convert a chunk (with COPY: the fragment
        repairer, docs/erasure_pools.md; without, coded chunks stay short). DELETE asks
        one to delete the blobs of collected records (without it, only inventory rounds
        delete)."""
        self.config = config or ManagerConfig()
        self.tokens = tokens
        self.store = store
        # What mounts are told changed, so that their caches stay coherent (docs/client.md,
        # "Coherent caches").
        self.changes = store.changes or store.track_changes()
        # The managers of the cluster for `mosafs status` (set by the process that serves:
        # mosafs.manager.active); None: this one keeps no replication log.
        self.managers: Callable[[], list[manager_pb2.ManagerMember]] | None = None
        self.backups: Any = None  # mosafs.manager.backups.Backups, set where it serves
        self.registry = Registry(store, lease_s=self.config.benefactor_lease_s, clock=clock)
        self.leases = LeaseTable(self.config.write_lease_s, clock=clock)
        self.replicator = (Replicator(store, self.registry, copy, clock=clock,
                                      scan_interval_s=self.config.scan_interval_s)
                           if copy is not None else None)
        self.garbage = GarbageCollector(store, self.leases, grace_s=self.config.gc_grace_s)
        store.on_unreferenced = self.garbage.unreferenced
        if self.replicator is not None:
            self.replicator.unreferenced_found = self.garbage.found
        self.repairer = (FragmentRepairer(store, self.registry, recode, copy, tokens=tokens,
                                          clock=clock)
                         if recode is not None and copy is not None else None)
        if self.repairer is not None and self.replicator is not None:
            self.replicator.handoff = self.repairer.handoff
            self.replicator.other_rate = self.repairer.rate
            self.repairer.on_done = self.replicator.enqueue
            self.garbage.oldest_work_ns = self.repairer.oldest_work_ns
        self.folders = Folders(store)
        # Set when a policy changes or a commit may have made work: the pruning loop wakes.
        self.prune_wakeup = threading.Event()
        # Folder -> the soonest purge-after expiry of an image in it (soft state: the pass
        # over every folder, at start and then every PRUNE_INTERVAL_S, finds them all).
        self._expiries: dict[int, int] = {}
        self._expiries_lock = threading.Lock()
        self._next_full_prune = 0.0
        self._run_round = run_round
        self._delete = delete
        self.integrity = Integrity(store, self.registry, self.replicator, self.repairer,
                                   scrub=scrub, has=has)

    # --- write sessions -------------------------------------------------------------------

    def open_write(self, inode: int, client_id: str,
                   holder: bytes = b"") -> manager_pb2.OpenWriteResponse:
        """A write lease, the pool's settings and targets, and the base version: the file's
        newest, else the newest file of its series (the folder decides pool and series);
        a write token for the lease, issued to HOLDER (a certificate's fingerprint), which
        alone may renew, commit or abort the lease (mosafs.manager.leases)."""
        if len(client_id) > MAX_CLIENT_ID:
            raise InvalidArgument(f"client id longer than {MAX_CLIENT_ID} characters")
        # No pruning transaction in between the look at the file and its lease: either
        # pruning sees the lease (and leaves the file alone), or the file is gone first.
        # (A lock of pruning's own: opens do not wait for the group commits.)
        with self.folders.pruning:
            return self._open_write(inode, client_id, holder)

    def _open_write(self, inode: int, client_id: str,
                    holder: bytes) -> manager_pb2.OpenWriteResponse:
        context = self.folders.write_context(inode)  # NotFound / IsADirectory first
        base = context.base
        pool = self.store.pool(context.pool)
        scheme = pools.scheme(pool)
        try:
            if scheme.coded:
                self._check_ec_width(pool.name, scheme)
            # R targets at least: a pessimistic write stores every chunk on R of them (and
            # an ec:K+M chunk's fragments on K+M distinct ones).
            targets = self.registry.pick_targets(pool.name,
                                                 max(pool.stripe_width, scheme.width))
        except NoSpace as exc:
            pools.warn_unwritable(pool.name, exc.message)  # the writer only sees ENOSPC
            raise
        lease = self.leases.open(inode, client_id, base_inode=base.inode,
                                 base_version=base.version, pool=pool.name,
                                 folder=context.folder, holder=holder)
        out = manager_pb2.OpenWriteResponse(
            lease_id=lease.id, lease_ttl_ms=self.leases.ttl_ms, pool=pool, targets=targets,
            base_inode=base.inode if base.version else 0, base_version=base.version,
            base_size=base.size, write_token=self.write_token(lease.id, holder))
        out.base_chunks.extend(common_pb2.ChunkRef(id=cid, length=n) for cid, n in base.chunks)
        return out

    def _check_ec_width(self, pool: str, scheme: pools.Scheme) -> None:
        """NoSpace unless POOL has at least K+M benefactors that take new chunks (alive or
        not: a dead one may come back, and a write then fails at close, EIO): fewer can
        never hold a chunk's fragments on distinct benefactors, and storing less
        redundancy than the pool promises is never done silently."""
        members = [rec for rec in self.store.benefactors().values()
                   if rec.pool == pool and not rec.draining]
        if len(members) < scheme.width:
            raise NoSpace(
                f"pool {pool!r} is {scheme}: every chunk needs {scheme.width} distinct "
                f"benefactors and the pool has {len(members)} that take new chunks: add "
                f"benefactors (`mosafs benefactor move ID {pool}`) or choose a narrower "
                f"redundancy (`mosafs pool set {pool} --redundancy ...`)")

    def renew_lease(self, lease_id: int, holder: bytes = b"") -> int:
        """Renew HOLDER's write lease; returns its TTL in ms."""
        self.leases.renew(lease_id, holder)
        return self.leases.ttl_ms

    def write_token(self, lease_id: int, holder: bytes) -> bytes:
        """A token that lets HOLDER put chunks for LEASE_ID (b"": none issued)."""
        if self.tokens is None or not holder:
            return b""
        return self.tokens.write_token(lease_id, holder)

    def _sign_reads(self, locations: Sequence[manager_pb2.ChunkLocation],
                    holder: bytes) -> None:
        """A read token for HOLDER in each of LOCATIONS, and for each fragment of an
        erasure-coded one (none without tokens or holder)."""
        if self.tokens is None or not holder or not locations:
            return
        for location, token in zip(locations, self.tokens.read_tokens(
                [loc.id for loc in locations], holder), strict=True):
            location.token = token
        coded = [loc for loc in locations if loc.ec_k]
        if coded:
            tokens = iter(self.tokens.read_tokens(
                [fid for loc in coded for fid in loc.fragment_ids], holder))
            for loc in coded:
                del loc.fragment_tokens[:]
                loc.fragment_tokens.extend(next(tokens) for _ in loc.fragment_ids)

    def _order(self, locations: Sequence[manager_pb2.ChunkLocation]) -> None:
        """Whole copies on live benefactors first; which fragment holders are alive."""
        named = {b for loc in locations for b in (*loc.benefactor_ids, *loc.fragment_holders)}
        alive = self.registry.alive_among(named)
        for location in locations:
            if len(location.benefactor_ids) > 1:  # one copy: nothing to order
                ordered = _live_first(location.benefactor_ids, alive)
                del location.benefactor_ids[:]
                location.benefactor_ids.extend(ordered)
            if location.ec_k:
                del location.fragment_live[:]
                location.fragment_live.extend(h in alive for h in location.fragment_holders)

    def security_state(self, revoked: Iterable[bytes]) -> manager_pb2.SecurityState:
        """What benefactors must know to check callers: the certificates REVOKED and the
        keys chunk access tokens are signed with (none: tokens are off)."""
        out = manager_pb2.SecurityState(revoked=list(revoked))
        if self.tokens is not None:
            out.token_keys.extend(manager_pb2.TokenKey(id=k.id, secret=k.secret,
                                                       not_after_ms=k.not_after_ms)
                                  for k in self.tokens.published())
        return out

    def commit_version(
        self, lease_id: int, inode: int, chunks: Iterable[ChunkEntry],
        placements: Iterable[tuple[bytes, Sequence[str]]], *, mtime_ns: int = 0,
        new_bytes: int = 0, session: SessionCommit = FINAL_COMMIT,
        fragments: Iterable[tuple[bytes, Fragments]] = (), holder: bytes = b"",
    ) -> tuple[int, manager_pb2.Attr]:
        """Store the block-map of write lease LEASE_ID, which HOLDER (a certificate's
        fingerprint) opened, as a new version (SESSION: whether it is provisional, and the
        provisional version it replaces: docs/lifecycle.md)."""
        chunks = check_chunks(chunks)
        session.check()
        claimed = self.leases.claim(lease_id, inode, content_key(chunks), holder=holder)
        if isinstance(claimed, Committed):
            # A repeat of a stored commit (its reply was lost): the same version again,
            # never a second one.
            return claimed.version, claimed.attr
        lease = claimed
        placements = list(placements)
        fragments = list(fragments)
        try:
            result = self.store.commit_version(
                inode, chunks, placements, base_inode=lease.base_inode,
                base_version=lease.base_version, mtime_ns=mtime_ns, new_bytes=new_bytes,
                pool=lease.pool, session=session, fragments=fragments)
        except BaseException:
            # The client may fix its request (e.g. store a missing chunk) and retry.
            self.leases.restore(lease)
            raise
        self.leases.finish(lease, *result)
        metrics.MANAGER_COMMITS.inc()
        metrics.MANAGER_COMMITTED.inc(result[1].size)
        if self.replicator is not None:
            self.replicator.committed(sorted(self.integrity.short_of_copies(
                [cid for cid, _ in placements] + [cid for cid, _ in fragments])))
        if lease.folder:
            self._prune_after_commit(lease.folder)
        return result

    def _prune_after_commit(self, folder: int) -> None:
        """Apply the folder's policy now that a new image exists. The commit is stored
        already: a failure here is logged, never answered (the background pass retries)."""
        # Pruning is the manager's own work, though it runs inside a client's call: the
        # change list records it as nobody's (""), so that every mount hears of the names
        # it removes, the committing one too (it did not remove them from its caches).
        origin = ORIGIN.set("")
        try:
            # The new image is in FOLDER: its subfolders have nothing new to prune.
            result = self.folders.prune(folder, busy=self.leases.inodes, subtree=False)
        except MosafsError as exc:
            log.warning("pruning folder %d after a commit failed: %s", folder, exc)
            return
        except Exception:
            log.exception("bug in pruning folder %d after a commit", folder)
            return
        finally:
            ORIGIN.reset(origin)
        self._log_pruned(result)
        if self._note_expiries(result):
            self.prune_wakeup.set()  # the loop reschedules for the new image's expiry

    def abort_write(self, lease_id: int, holder: bytes = b"") -> None:
        self.leases.abort(lease_id, holder)

    def find_chunks(self, ids: Sequence[bytes]) -> list[bool]:
        """present[i]: ids[i] is referenced in the index, with a copy on a live benefactor.
        An unreferenced id is garbage on its way out: the writer stores it again (a put
        that finds the chunk present refreshes it, so collection spares it)."""
        if len(ids) > MAX_FIND_CHUNKS:
            raise InvalidArgument(f"FindChunks takes at most {MAX_FIND_CHUNKS} ids, got "
                                  f"{len(ids)}: split the batch")
        records = self.store.chunk_records(ids)  # validates the ids
        named = {b for rec in records if rec is not None
                 for b in (*rec.benefactor_ids, *rec.fragment_holders) if b}
        alive = self.registry.alive_among(named)
        return [rec is not None and rec.refcount > 0 and readable(rec, alive)
                for rec in records]

    def locate_chunks(self, ids: Sequence[bytes],
                      holder: bytes = b"") -> manager_pb2.LocateChunksResponse:
        """Where copies of each distinct id the index holds are (live benefactors first),
        with the addresses of every benefactor named; ids the index lacks are listed in
        `unindexed`. Each gets a read token for HOLDER: a writer reads back the chunks of
        its base and those it stored (a spill). Naming an id is all it takes, as for
        dedupe: whoever knows an id could commit it into a file of their own and read it
        there (docs/operations.md, "Chunk access tokens")."""
        if len(ids) > MAX_FIND_CHUNKS:
            raise InvalidArgument(f"LocateChunks takes at most {MAX_FIND_CHUNKS} ids, got "
                                  f"{len(ids)}: split the batch")
        distinct = list(dict.fromkeys(check_ids(ids)))
        locations, addresses = self.store.locations(distinct)
        out = manager_pb2.LocateChunksResponse()
        out.locations.extend(loc for loc in locations if loc is not None)
        self._order(out.locations)
        if self.tokens is not None and holder:
            known = {loc.id for loc in out.locations}
            out.unindexed.extend(manager_pb2.ChunkLocation(id=cid) for cid in distinct
                                 if cid not in known)
            self._sign_reads(out.locations, holder)
            self._sign_reads(out.unindexed, holder)
        out.benefactors.extend(common_pb2.BenefactorAddress(id=bid, address=address)
                               for bid, address in addresses.items())
        return out

    # --- versions and folders -------------------------------------------------------------

    def restore_version(self, inode: int, version: int) -> tuple[int, manager_pb2.Attr]:
        result = self.store.restore_version(inode, version)
        folder = self.folders.write_context(inode).folder
        if folder:
            self._prune_after_commit(folder)
        return result

    def set_folder(self, inode: int, *, pool: str | None, series_pattern: str | None,
                   policy: pruning.Policy | None,
                   clear_policy: bool) -> manager_pb2.FolderSettingsReply:
        reply = self.folders.set(inode, pool=pool, series_pattern=series_pattern,
                                 policy=policy, clear_policy=clear_policy)
        if policy is not None or series_pattern is not None or clear_policy:
            # Applied at once, so that the caller learns what it removed (the background
            # pass would remove the same, unreported).
            reply.prune.CopyFrom(self.prune(inode).report(dry_run=False))
        self.prune_wakeup.set()
        return reply

    def prune(self, folder: int = 0, *, dry_run: bool = False,
              policy: pruning.Policy | None = None) -> PruneResult:
        result = self.folders.prune(folder, dry_run=dry_run, busy=self.leases.inodes,
                                    policy=policy)
        if not dry_run:
            self._log_pruned(result)
            self._note_expiries(result)
        return result

    def _note_expiries(self, result: PruneResult) -> bool:
        """Keep the expiries of the folders RESULT pruned; whether one has any."""
        with self._expiries_lock:
            for directory in result.examined:
                self._expiries.pop(directory, None)
            self._expiries.update(result.expiries)
        return bool(result.expiries)

    def prune_pass(self) -> float:
        """A background pass: every folder with a policy at start and every
        PRUNE_INTERVAL_S (the safety net), otherwise only the folders where a purge-after
        rule has an image due (commits and policy changes prune their own folders at
        once), so that a pass costs what expired, not every file under a policy. Returns
        the seconds until the next one."""
        now = time.monotonic()
        if now >= self._next_full_prune:
            self._next_full_prune = now + PRUNE_INTERVAL_S
            self.prune()
        else:
            wall = time.time_ns()
            with self._expiries_lock:
                due = [f for f, expiry in self._expiries.items() if expiry <= wall]
            for folder in due:
                try:
                    self.prune(folder)
                except (NotFound, NotADirectory):
                    with self._expiries_lock:
                        self._expiries.pop(folder, None)  # the folder went
        with self._expiries_lock:
            soonest = min(self._expiries.values(), default=None)
        wait = self._next_full_prune - time.monotonic()
        if soonest is not None:
            wait = min(wait, (soonest - time.time_ns()) / 1e9)
        return min(PRUNE_INTERVAL_S, max(0.05, wait))

    @staticmethod
    def _log_pruned(result: PruneResult) -> None:
        metrics.MANAGER_PRUNED.inc(len(result.pruned))
        for image in result.pruned:
            log.info("pruned %s version %d (%s)%s", image.path, image.version, image.reason,
                     ", the file is gone" if image.whole_file else "")

    # --- reads and status -----------------------------------------------------------------

    def block_map(self, inode: int, version: int = 0,
                  holder: bytes = b"") -> manager_pb2.BlockMap:
        """The block-map with each chunk's live benefactors listed first, and a read token
        for HOLDER for each chunk (the caller may read this version)."""
        out = self.store.block_map(inode, version)
        self._sign_reads(out.locations, holder)
        self._order(out.locations)
        return out

    def cluster_status(self) -> manager_pb2.ClusterStatus:
        out = manager_pb2.ClusterStatus(benefactors=self.registry.statuses(),
                                        metadata_write_transactions=self.store.write_transactions)
        if self.managers is not None:  # this one, the active, and its standbys
            out.managers.extend(self.managers())
        collected = self.garbage.collected
        out.gc_waiting_chunks = self.garbage.waiting()
        out.gc_collected_chunks = collected.records
        out.gc_deleted_blobs = collected.deleted_chunks
        out.gc_freed_bytes = collected.freed_bytes
        if self.replicator is None:
            out.scanned_age_ms = -1
            return out
        figures, rate = self.replicator.figures()
        out.chunks = figures.chunks
        out.under_replicated_chunks = figures.under_replicated_chunks
        out.replication_backlog_bytes = figures.replication_backlog_bytes
        out.lost_chunks = figures.lost_chunks
        out.replication_rate_bytes_s = rate
        out.time_to_full_redundancy_s = self.replicator.time_to_full_redundancy()
        out.scanned_age_ms = self.replicator.age_ms(figures.scanned_at)
        out.full_scan_age_ms = self.replicator.age_ms(figures.full_scan_at)
        out.redundancy_unreachable.extend(figures.unreachable)
        out.ec_short_chunks = figures.ec_short_chunks
        out.ec_missing_fragments = figures.ec_missing_fragments
        out.ec_lost_chunks = figures.ec_lost_chunks
        if self.repairer is not None:
            out.ec_rebuilt_fragments = self.repairer.rebuilt_fragments
            out.ec_rebuilt_bytes = self.repairer.rebuilt_bytes
            out.ec_rebuild_rate_bytes_s = self.repairer.rate()
            # A full scan counts every chunk to convert once replication examined all it
            # queued (it hands them over as it examines them).
            scanned = figures.full_scan_at if figures.scanned_at >= figures.full_scan_at \
                else 0.0
            out.conversions.extend(manager_pb2.ConversionProgress(**vars(c))
                                   for c in self.repairer.conversions(scanned))
        return out

    def version_stats(self, inode: int, version: int = 0) -> manager_pb2.VersionStats:
        """A version's figures with its durability debt: chunks short of their R counted
        copies now, and of those the ones with no live copy at all."""
        out = self.store.version_stats(inode, version)
        ids = list(dict.fromkeys(c.id for c in self.store.block_map(inode, out.version).chunks))
        view = Redundancy(self.store, self.registry)
        kinds: dict[str, list[int]] = {}
        for rec in self.store.chunk_records(ids):
            if rec is None:
                continue
            kind = kinds.setdefault(view.label(rec), [0, 0])
            kind[0] += 1
            kind[1] += rec.length
            if not view.missing(rec):
                continue
            out.short_chunks += 1
            out.lost_chunks += view.lost(rec)
        out.redundancy.extend(manager_pb2.RedundancyCount(redundancy=label, chunks=n, bytes=b)
                              for label, (n, b) in sorted(kinds.items()))
        out.fully_redundant = out.short_chunks == 0
        return out

    # --- garbage collection ---------------------------------------------------------------

    def report_inventory(self, bid: str,
                         entries: Sequence[tuple[bytes, int]]) -> tuple[list[bytes], int]:
        return self.garbage.review(bid, entries)

    def collect_step(self) -> float:
        """One step of collection of what became garbage (GarbageCollector.collect);
        seconds until the next."""
        if self._delete is None:
            return 3600.0
        live = {b.id: b.address for b in self.registry.live()}
        return self.garbage.collect(live, self._delete)

    def collect_garbage(self) -> manager_pb2.GarbageReport:
        """What is due of the unreferenced records is collected, then every live
        benefactor runs an inventory round; failures are reported, not raised."""
        out = manager_pb2.GarbageReport()
        if self._run_round is None:
            return out
        before = replace(self.garbage.collected)
        for _ in range(MAX_GC_STEPS):
            if self.collect_step():
                break
        out.deleted_chunks += self.garbage.collected.deleted_chunks - before.deleted_chunks
        out.freed_bytes += self.garbage.collected.freed_bytes - before.freed_bytes
        for b in self.registry.live():
            try:
                deleted, freed, waiting = self._run_round(b.address)
            except MosafsError as exc:
                out.failures.append(f"{b.id} ({b.address}): {exc.message}")
                continue
            out.benefactors += 1
            out.deleted_chunks += deleted
            out.freed_bytes += freed
            out.waiting_chunks += waiting
        return out

    # --- integrity ------------------------------------------------------------------------

    def report_corrupt(self, bid: str, ids: Sequence[bytes]) -> int:
        return self.integrity.report_corrupt(bid, ids)

    def scrub(self) -> Iterator[manager_pb2.ScrubEvent]:
        return self.integrity.scrub()

    def fsck(self, repair: bool = False) -> FsckResult:
        return fsck(self.store, repair=repair)

    def statfs(self) -> manager_pb2.StatFsResponse:
        capacity, free = self.registry.capacity()
        return manager_pb2.StatFsResponse(capacity_bytes=capacity, free_bytes=free,
                                          files=self.store.inode_count())


def readable(rec: Any, alive: set[str]) -> bool:
    """Whether chunk record REC can be read from benefactors in ALIVE: a whole copy, or
    K fragments of an erasure-coded chunk."""
    if any(b in alive for b in rec.benefactor_ids):
        return True
    return bool(rec.ec_k) and sum(h in alive for h in rec.fragment_holders if h) >= rec.ec_k


def _live_first(bids: Iterable[str], alive: set[str]) -> list[str]:
    """BIDS with the live ones first (stable), so readers try those first."""
    return sorted(bids, key=lambda bid: bid not in alive)
