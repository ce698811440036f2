"""Benefactor registrations and pools, each operation in one transaction."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable

from mosafs._proto import common_pb2, metadata_pb2
from mosafs.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, NotPermitted
from mosafs.manager import pools
from mosafs.manager.metadata.base import StoreBase, _rerun_if_grown
from mosafs.manager.metadata.checks import check_benefactor_id, check_certificate

log = logging.getLogger("mosafs.manager.metadata")


TOKEN_MASTER_KEY = b"token_master"
TOKEN_MASTER_BYTES = 32


class ClusterOps(StoreBase):
    """Benefactor registrations and pools."""

    @_rerun_if_grown
    def token_master(self) -> bytes:
        """The cluster's master secret of chunk access tokens (meta `token_master`, 32
        random bytes made at the first ask): every key that signs tokens is derived from
        it (mosafs.manager.tokens), so any manager that takes over signs with the keys the
        benefactors already know. Replicated to standbys like every other write."""
        with self.transaction() as tx:
            found = tx.txn.get(TOKEN_MASTER_KEY, db=tx.db.meta)
        if found is not None and len(found) == TOKEN_MASTER_BYTES:
            return bytes(found)
        with self._write() as tx:
            found = tx.txn.get(TOKEN_MASTER_KEY, db=tx.db.meta)
            if found is None or len(found) != TOKEN_MASTER_BYTES:
                found = os.urandom(TOKEN_MASTER_BYTES)
                tx.txn.put(TOKEN_MASTER_KEY, found, db=tx.db.meta)
            return bytes(found)

    @_rerun_if_grown
    def put_benefactor(self, bid: str, rec: metadata_pb2.BenefactorRecord) -> None:
        check_benefactor_id(bid)
        with self._write() as tx:
            tx.put_benefactor(bid, rec)

    @_rerun_if_grown
    def register_benefactor(self, bid: str, address: str, pool: str, capacity_bytes: int,
                            free_bytes: int, chunks: int,
                            certificate: str = "") -> metadata_pb2.BenefactorRecord:
        """Record a (re-)registration. POOL "" keeps the pool it is in (a new benefactor:
        the default pool); a pool named joins it. Draining survives re-registration.
        CERTIFICATE: the registering certificate's name; an id first registered by another
        certificate is refused (AccessDenied), so one benefactor key cannot speak for the
        others."""
        check_benefactor_id(bid)
        with self._write() as tx:
            old = tx.benefactor(bid)
            check_certificate(bid, old, certificate)
            pool = pool or (old.pool if old is not None else pools.DEFAULT_POOL)
            if tx.pool(pool) is None:
                raise InvalidArgument(f"benefactor {bid}: no pool {pool!r} (mosafs pool list)")
            if old is not None and old.pool != pool:
                log.info("benefactor %s moves from pool %s to %s", bid, old.pool, pool)
            rec = metadata_pb2.BenefactorRecord(
                address=address, pool=pool, capacity_bytes=capacity_bytes,
                free_bytes=free_bytes, chunks=chunks, registered_ns=time.time_ns(),
                draining=old is not None and old.draining,
                certificate=certificate or (old.certificate if old is not None else ""))
            tx.put_benefactor(bid, rec)
            return rec

    @_rerun_if_grown
    def update_benefactor(self, bid: str, *, pool: str | None = None,
                          draining: bool | None = None) -> metadata_pb2.BenefactorRecord:
        """Move registered benefactor BID to POOL and/or set its draining flag."""
        check_benefactor_id(bid)
        with self._write() as tx:
            rec = tx.benefactor(bid)
            if rec is None:
                raise NotFound(f"no benefactor {bid!r} (mosafs benefactor list)")
            if pool is not None:
                if tx.pool(pool) is None:
                    raise NotFound(f"no pool {pool!r} (mosafs pool list)")
                rec.pool = pool
            if draining is not None:
                rec.draining = draining
            tx.put_benefactor(bid, rec)
            return rec

    @_rerun_if_grown
    def remove_benefactor(self, bid: str) -> int:
        """Forget benefactor BID: its registration and every location naming it, in one
        transaction (found through the holdings index). Records left with no copy and no
        reference are deleted; referenced ones stay (lost until a copy turns up). Returns
        how many records named it."""
        check_benefactor_id(bid)
        named = 0
        with self._write() as tx:
            if tx.benefactor(bid) is None:
                raise NotFound(f"no benefactor {bid!r} (mosafs benefactor list)")
            for cid in list(tx.held(bid)):  # a copy: drop_benefactor changes the index
                rec = tx.chunk(cid)
                if rec is not None and (bid in rec.benefactor_ids
                                        or bid in rec.fragment_holders):
                    named += 1
                    tx.drop_benefactor(cid, rec, bid)
            tx.txn.delete(bid.encode(), db=self._db.benefactors)
        return named

    def benefactor(self, bid: str) -> metadata_pb2.BenefactorRecord | None:
        with self._read() as tx:
            return tx.benefactor(bid)

    def benefactors(self) -> dict[str, metadata_pb2.BenefactorRecord]:
        with self._read() as tx:
            return {key.decode(): metadata_pb2.BenefactorRecord.FromString(raw)
                    for key, raw in tx.txn.cursor(db=self._db.benefactors)}

    def benefactor_addresses(self, bids: Iterable[str]) -> dict[str, str]:
        """id -> registered address, for the ids that are registered."""
        with self._read() as tx:
            out = {}
            for bid in bids:
                rec = tx.benefactor(bid)
                if rec is not None:
                    out[bid] = rec.address
            return out

    def pool(self, name: str) -> common_pb2.PoolSettings:
        with self._read() as tx:
            rec = tx.pool(name)
            if rec is None:
                raise NotFound(f"no pool {name!r}")
            return rec.settings

    def pools(self) -> list[common_pb2.PoolSettings]:
        with self._read() as tx:
            return [metadata_pb2.PoolRecord.FromString(raw).settings
                    for _, raw in tx.txn.cursor(db=self._db.pools)]

    @_rerun_if_grown
    def update_pool(
        self, name: str, *, replication: int | None = None, stripe_width: int | None = None,
        chunker: str | None = None, write_semantics: str | None = None,
        hash_backend: str | None = None, redundancy: str | None = None,
        ec_min_chunk: int | None = None, create: bool = False,
    ) -> common_pb2.PoolSettings:
        """Apply the settings that are not None to pool NAME; returns the result. CREATE:
        a new pool (AlreadyExists if there is one), the rest of its settings the defaults."""
        if create:
            pools.check_name(name)
        with self._write(grows=create) as tx:
            rec = tx.pool(name)
            if create and rec is not None:
                raise AlreadyExists(f"pool {name!r} exists (mosafs pool set changes it)")
            if not create and rec is None:
                raise NotFound(f"no pool {name!r} (mosafs pool list)")
            current = pools.default_settings(name) if rec is None else rec.settings
            settings = pools.with_overrides(
                current, replication=replication, stripe_width=stripe_width,
                chunker=chunker, write_semantics=write_semantics, hash_backend=hash_backend,
                redundancy=redundancy, ec_min_chunk=ec_min_chunk)
            if rec is None or settings != rec.settings:
                tx.put_pool(settings)
            return settings

    def pool_users(self, name: str) -> tuple[list[str], list[int]]:
        """(benefactor ids in pool NAME, folders assigned to it)."""
        with self._read() as tx:
            if tx.pool(name) is None:
                raise NotFound(f"no pool {name!r} (mosafs pool list)")
            bids = [key.decode() for key, raw in tx.txn.cursor(db=self._db.benefactors)
                    if metadata_pb2.BenefactorRecord.FromString(raw).pool == name]
            folders = [ino for ino, f in tx.folders() if f.HasField("pool") and f.pool == name]
            return bids, folders

    @_rerun_if_grown
    def delete_pool(self, name: str) -> None:
        """Delete an unused pool. Chunks stored through it keep their copies; their R
        becomes the default pool's."""
        if name == pools.DEFAULT_POOL:
            raise NotPermitted(f"pool {name!r} cannot be deleted: new files fall back to it")
        with self._write() as tx:
            if tx.pool(name) is None:
                raise NotFound(f"no pool {name!r} (mosafs pool list)")
            bids = [key.decode() for key, raw in tx.txn.cursor(db=self._db.benefactors)
                    if metadata_pb2.BenefactorRecord.FromString(raw).pool == name]
            if bids:
                raise FailedPrecondition(f"pool {name!r} still has benefactors "
                                         f"{', '.join(sorted(bids))}: move or remove them first")
            folders = [tx.path_of(ino) for ino, f in tx.folders()
                       if f.HasField("pool") and f.pool == name]
            if folders:
                raise FailedPrecondition(f"pool {name!r} is assigned to {', '.join(folders)}: "
                                         f"assign those folders another pool first")
            tx.txn.delete(name.encode(), db=self._db.pools)

