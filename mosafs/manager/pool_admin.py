"""The administration of pools and benefactors (docs/lifecycle.md, docs/operations.md):
a pool's users, draining, moving and removing a benefactor, and how far a drain is. A part
of Manager (mosafs.manager.core), which provides what is declared here."""

from __future__ import annotations

from mosafs._proto import common_pb2, manager_pb2
from mosafs.errors import FailedPrecondition, NotFound
from mosafs.manager.ec_repair import FragmentRepairer
from mosafs.manager.folders import Folders, Seen
from mosafs.manager.integrity import HAS_BATCH
from mosafs.manager.metadata import MetadataStore, check_benefactor_id
from mosafs.manager.redundancy_view import Redundancy
from mosafs.manager.registry import Registry
from mosafs.manager.replication import Replicator


class PoolAdmin:
    """Pools and benefactors of Manager (attributes set by Manager.__init__)."""

    store: MetadataStore
    registry: Registry
    replicator: Replicator | None
    repairer: FragmentRepairer | None
    folders: Folders

    def pool_info(self, settings: common_pb2.PoolSettings,
                  seen: Seen | None = None) -> manager_pb2.PoolInfo:
        """A pool's settings, benefactors and folders (with SEEN: those it keeps, for a
        caller restricted to part of the namespace)."""
        bids, folders = self.store.pool_users(settings.name)
        if seen is not None:
            folders = seen(folders)
        paths = [self.folders.get(ino).path for ino in folders]
        return manager_pb2.PoolInfo(settings=settings, benefactors=bids, folders=folders,
                                    folder_paths=paths)

    def drain(self, bid: str, *, cancel: bool = False) -> manager_pb2.DrainStatus:
        self.registry.update(check_benefactor_id(bid), draining=not cancel)
        self._recheck_holdings(bid)
        return self.drain_status(bid)

    def move_benefactor(self, bid: str, pool: str) -> manager_pb2.BenefactorStatus:
        self.registry.update(check_benefactor_id(bid), pool=pool)
        self._recheck_holdings(bid)
        return next(s for s in self.registry.statuses() if s.info.id == bid)

    def pool_changed(self, pool: str = "") -> None:
        """POOL's settings changed (R raised, another redundancy): the safety-net scan runs
        now, and finds the chunks to copy or convert."""
        if self.repairer is not None and pool:
            self.repairer.pool_changed(pool)
        if self.replicator is not None:
            self.replicator.rescan()

    def _recheck_holdings(self, bid: str) -> None:
        """BID's copies may count no more (draining, moved): replication looks at them, a
        page of the holdings index at a time."""
        if self.replicator is not None:
            self.replicator.recheck(bid)

    def drain_status(self, bid: str) -> manager_pb2.DrainStatus:
        """How far draining BID is: its referenced chunks, and those still without R
        counted copies on other benefactors (replication moves them)."""
        rec = self.store.benefactor(check_benefactor_id(bid))
        if rec is None:
            raise NotFound(f"no benefactor {bid!r} (mosafs benefactor list)")
        chunks, pending, pending_bytes = self._held_by(bid)
        return manager_pb2.DrainStatus(
            id=bid, draining=rec.draining, alive=self.registry.is_alive(bid), chunks=chunks,
            pending_chunks=pending, pending_bytes=pending_bytes,
            done=rec.draining and pending == 0)

    def _held_by(self, bid: str) -> tuple[int, int, int]:
        """(referenced chunks BID holds, of those without R counted copies elsewhere, their
        bytes)."""
        view = Redundancy(self.store, self.registry)
        ids = self.store.chunks_on(bid, fragments=True)
        chunks = pending = pending_bytes = 0
        for start in range(0, len(ids), HAS_BATCH):
            for rec in self.store.chunk_records(ids[start:start + HAS_BATCH]):
                if rec is None or rec.refcount == 0:
                    continue
                chunks += 1
                if view.missing(rec, without=bid):
                    pending += 1
                    pending_bytes += rec.length
        return chunks, pending, pending_bytes

    def remove_benefactor(self, bid: str, *, force: bool = False) -> int:
        check_benefactor_id(bid)
        if not force:
            _, pending, _ = self._held_by(bid)
            if pending:
                raise FailedPrecondition(
                    f"benefactor {bid} holds {pending} chunks that have fewer than R copies "
                    f"elsewhere: drain it first (mosafs benefactor drain {bid}) or pass "
                    f"--force to lose those copies")
        return self.registry.remove(bid)
