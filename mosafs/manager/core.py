"""The manager's write and read protocol (DESIGN §4, §7) on top of the metadata store, the
benefactor registry and the write leases. The gRPC servicer calls this and the store; it
holds no state of its own beyond its three parts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from mosafs._proto import common_pb2, manager_pb2
from mosafs.errors import InvalidArgument, MosafsError
from mosafs.manager.garbage import GarbageCollector
from mosafs.manager.leases import LeaseTable
from mosafs.manager.metadata import ChunkEntry, MetadataStore, check_ids
from mosafs.manager.pools import DEFAULT_POOL
from mosafs.manager.registry import Clock, Registry
from mosafs.manager.replication import CopyFn, Replicator

MAX_FIND_CHUNKS = 65_536  # ids per FindChunks call: ~2.2 MiB of request
MAX_CLIENT_ID = 256
# run_round(benefactor address) -> (deleted chunks, freed bytes, chunks waiting)
RoundFn = Callable[[str], tuple[int, int, int]]


@dataclass(frozen=True)
class ManagerConfig:
    heartbeat_interval_s: float = 1.0
    benefactor_lease_s: float = 5.0
    write_lease_s: float = 60.0
    replication_interval_s: float = 1.0
    gc_grace_s: float = 600.0


class Manager:
    def __init__(self, store: MetadataStore, config: ManagerConfig | None = None, *,
                 clock: Clock = time.monotonic, copy: CopyFn | None = None,
                 run_round: RoundFn | None = None) -> None:
        """COPY asks one benefactor to copy chunks to another (replication); RUN_ROUND asks
        one to run a garbage-collection round now (`mosafs gc`). Without them nothing is
        replicated or collected on demand (unit tests of the metadata protocol)."""
        self.config = config or ManagerConfig()
        self.store = store
        self.registry = Registry(store, lease_s=self.config.benefactor_lease_s, clock=clock)
        self.leases = LeaseTable(self.config.write_lease_s, clock=clock)
        self.replicator = (Replicator(store, self.registry, copy, clock=clock)
                           if copy is not None else None)
        self.garbage = GarbageCollector(store, self.leases, grace_s=self.config.gc_grace_s)
        self._run_round = run_round

    def pool_for(self, inode: int) -> common_pb2.PoolSettings:
        """The pool new writes of INODE use. The one place where folder-assigned pools will
        be resolved; for now every file is in the default pool."""
        return self.store.pool(DEFAULT_POOL)

    # --- write sessions -------------------------------------------------------------------

    def open_write(self, inode: int, client_id: str) -> manager_pb2.OpenWriteResponse:
        if len(client_id) > MAX_CLIENT_ID:
            raise InvalidArgument(f"client id longer than {MAX_CLIENT_ID} characters")
        base = self.store.write_base(inode)  # NotFound / IsADirectory first
        pool = self.pool_for(inode)
        # R targets at least: a pessimistic write stores every chunk on R of them.
        targets = self.registry.pick_targets(pool.name,
                                             max(pool.stripe_width, pool.replication))
        lease = self.leases.open(inode, client_id, base_inode=base.inode,
                                 base_version=base.version)
        out = manager_pb2.OpenWriteResponse(
            lease_id=lease.id, lease_ttl_ms=self.leases.ttl_ms, pool=pool, targets=targets,
            base_inode=base.inode if base.version else 0, base_version=base.version,
            base_size=base.size)
        out.base_chunks.extend(common_pb2.ChunkRef(id=cid, length=n) for cid, n in base.chunks)
        return out

    def renew_lease(self, lease_id: int) -> int:
        """Renew a write lease; returns its TTL in ms."""
        self.leases.renew(lease_id)
        return self.leases.ttl_ms

    def commit_version(
        self, lease_id: int, inode: int, chunks: Iterable[ChunkEntry],
        placements: Iterable[tuple[bytes, Sequence[str]]], *, mtime_ns: int = 0,
        new_bytes: int = 0,
    ) -> tuple[int, manager_pb2.Attr]:
        lease = self.leases.claim(lease_id, inode)
        try:
            result = self.store.commit_version(
                inode, chunks, placements, base_inode=lease.base_inode,
                base_version=lease.base_version, mtime_ns=mtime_ns, new_bytes=new_bytes)
        except BaseException:
            # The client may fix its request (e.g. store a missing chunk) and retry.
            self.leases.restore(lease)
            raise
        self.leases.finish(lease)
        return result

    def abort_write(self, lease_id: int) -> None:
        self.leases.abort(lease_id)

    def find_chunks(self, ids: Sequence[bytes]) -> list[bool]:
        """present[i]: ids[i] is referenced in the index, with a copy on a live benefactor.
        An unreferenced id is garbage on its way out: the writer stores it again (a put
        that finds the chunk present refreshes it, so collection spares it)."""
        if len(ids) > MAX_FIND_CHUNKS:
            raise InvalidArgument(f"FindChunks takes at most {MAX_FIND_CHUNKS} ids, got "
                                  f"{len(ids)}: split the batch")
        records = self.store.chunk_records(ids)  # validates the ids
        return [rec is not None and rec.refcount > 0
                and any(self.registry.is_alive(b) for b in rec.benefactor_ids)
                for rec in records]

    def locate_chunks(self, ids: Sequence[bytes]) -> manager_pb2.LocateChunksResponse:
        """Where copies of each distinct id the index holds are (live benefactors first),
        with the addresses of every benefactor named; ids the index lacks are left out."""
        if len(ids) > MAX_FIND_CHUNKS:
            raise InvalidArgument(f"LocateChunks takes at most {MAX_FIND_CHUNKS} ids, got "
                                  f"{len(ids)}: split the batch")
        distinct = list(dict.fromkeys(check_ids(ids)))
        found = [(cid, bids) for cid, bids in zip(
            distinct, self.store.chunk_locations(distinct), strict=True) if bids is not None]
        named = dict.fromkeys(bid for _, bids in found for bid in bids)
        alive = self.registry.alive_among(named)
        out = manager_pb2.LocateChunksResponse()
        for cid, bids in found:
            out.locations.add(id=cid, benefactor_ids=_live_first(bids, alive))
        addresses = self.store.benefactor_addresses(named)
        out.benefactors.extend(common_pb2.BenefactorAddress(id=bid, address=addresses[bid])
                               for bid in named if bid in addresses)
        return out

    # --- reads and status -----------------------------------------------------------------

    def block_map(self, inode: int, version: int = 0) -> manager_pb2.BlockMap:
        """The block-map with each chunk's live benefactors listed first."""
        out = self.store.block_map(inode, version)
        alive = self.registry.alive_among(b.id for b in out.benefactors)
        for location in out.locations:
            if len(location.benefactor_ids) > 1:  # one copy: nothing to order
                ordered = _live_first(location.benefactor_ids, alive)
                del location.benefactor_ids[:]
                location.benefactor_ids.extend(ordered)
        return out

    def cluster_status(self) -> manager_pb2.ClusterStatus:
        out = manager_pb2.ClusterStatus(benefactors=self.registry.statuses())
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
        out.scanned_age_ms = (int((time.monotonic() - figures.scanned_at) * 1000)
                              if figures.scanned_at else -1)
        return out

    # --- garbage collection ---------------------------------------------------------------

    def report_inventory(self, bid: str,
                         entries: Sequence[tuple[bytes, int]]) -> tuple[list[bytes], int]:
        return self.garbage.review(bid, entries)

    def collect_garbage(self) -> manager_pb2.GarbageReport:
        """Every live benefactor runs a round now; failures are reported, not raised."""
        out = manager_pb2.GarbageReport()
        if self._run_round is None:
            return out
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

    def statfs(self) -> manager_pb2.StatFsResponse:
        capacity, free = self.registry.capacity()
        return manager_pb2.StatFsResponse(capacity_bytes=capacity, free_bytes=free,
                                          files=self.store.inode_count())


def _live_first(bids: Iterable[str], alive: set[str]) -> list[str]:
    """BIDS with the live ones first (stable), so readers try those first."""
    return sorted(bids, key=lambda bid: bid not in alive)
