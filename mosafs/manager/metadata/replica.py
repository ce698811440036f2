"""The store's side of manager replication (docs/standby.md): a consistent snapshot of the
whole database for a standby that starts from nothing, and applying the active manager's
log entries on a standby."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import lmdb

from mosafs._proto import replication_pb2
from mosafs.errors import InvalidArgument
from mosafs.manager.metadata.base import StoreBase, _rerun_if_grown
from mosafs.manager.metadata.schema import _Dbs
from mosafs.manager.replog import apply_ops, position, stamp


class ReplicaOps(StoreBase):
    def snapshot_to(self, path: Path, *, compact: bool = True) -> tuple[int, int]:
        """Write a copy of the database, as one read transaction sees it, to PATH (an
        LMDB data file); (seq, epoch): the log position it holds. COMPACT renumbers the
        pages (smallest file); a plain copy keeps every page where it is, so that two
        copies share their unchanged pages (metadata backups deduplicate by that)."""
        if not compact:
            return self._plain_copy(path)
        with self._map.gate.shared(), self._env.begin() as txn:
            where = position(txn.get, self._db.meta)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                self._env.copyfd(fd, compact=True, txn=txn)
                os.fsync(fd)
            finally:
                os.close(fd)
        return where

    def _plain_copy(self, path: Path) -> tuple[int, int]:
        """A plain copy takes its own read transaction (LMDB offers no other), so the
        position is read from the copy itself."""
        with self._map.gate.shared():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                self._env.copyfd(fd, compact=False)
                os.fsync(fd)
            finally:
                os.close(fd)
        copy = lmdb.open(str(path), subdir=False, readonly=True, lock=False,
                         max_dbs=len(fields(_Dbs)) + 1)
        try:
            with copy.begin(db=copy.open_db(b"meta", create=False)) as txn:
                return position(txn.get, None)
        finally:
            copy.close()

    @_rerun_if_grown
    def apply_log(self, entries: Sequence[replication_pb2.LogEntry]) -> tuple[int, int]:
        """Apply ENTRIES (the next ones of the log, in order) in one durable write
        transaction; the position reached. InvalidArgument, and nothing applied, for an
        entry that does not follow the one before it or names no sub-database."""
        dbs = self._dbs
        with self._write(grows=True) as tx:
            seq, epoch = position(tx.txn.get, self._db.meta)
            for entry in entries:
                if entry.seq != seq + 1 or entry.epoch < epoch:
                    raise InvalidArgument(
                        f"log entry {entry.seq} of epoch {entry.epoch} does not follow "
                        f"entry {seq} of epoch {epoch}")
                unknown = next((op.db for op in entry.ops if op.db >= len(dbs)), None)
                if unknown is not None:
                    raise InvalidArgument(f"log entry {entry.seq} names sub-database "
                                          f"{unknown}, which this schema lacks")
                apply_ops(tx.txn, dbs, ((op.db, op.key, None if op.delete else op.value)
                                        for op in entry.ops))
                seq, epoch = entry.seq, entry.epoch
            stamp(tx.txn, self._db.meta, seq, epoch)
        return seq, epoch
