"""The store's side of manager replication (docs/standby.md): a consistent snapshot of the
whole database for a standby that starts from nothing, applying the active manager's log
entries on a standby, settling a standby's journal when the store opens, and the term of
an active manager's log."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import lmdb
from google.protobuf.message import DecodeError

from mosafs._proto import replication_pb2
from mosafs.errors import InvalidArgument
from mosafs.manager.metadata import journal
from mosafs.manager.metadata.base import StoreBase, _rerun_if_grown
from mosafs.manager.metadata.journal import JOURNAL
from mosafs.manager.metadata.schema import _U64, _Dbs
from mosafs.manager.replog import META_TERM, apply_ops, position, stamp
from mosafs.procutil import fsync_dir

log = logging.getLogger("mosafs.manager.metadata")


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
        return copy_position(path)

    @_rerun_if_grown
    def apply_log(self, entries: Sequence[replication_pb2.LogEntry]) -> tuple[int, int]:
        """Apply ENTRIES (the next ones of the log, in order) in one durable write
        transaction; the position reached. InvalidArgument, and nothing applied, for an
        entry that does not follow the one before it or names no sub-database."""
        dbs = self._dbs
        with self._write(grows=True) as tx:
            seq, epoch = position(tx.txn.get, self._db.meta)
            for entry in entries:
                check_follows(entry, seq, epoch, len(dbs), self.max_key_size)
                apply_ops(tx.txn, dbs, ((op.db, op.key, None if op.delete else op.value)
                                        for op in entry.ops))
                seq, epoch = entry.seq, entry.epoch
            stamp(tx.txn, self._db.meta, seq, epoch)
        return seq, epoch

    @property
    def sub_databases(self) -> int:
        """How many sub-databases the schema has (a log entry names them by index)."""
        return len(self._dbs)

    @property
    def max_key_size(self) -> int:
        """The longest key LMDB stores (511 bytes as py-lmdb builds it)."""
        return self._env.max_key_size()

    @_rerun_if_grown
    def start_term(self, at_least: int = 0) -> tuple[int, int, int]:
        """Begin a new term of this manager's replication log: (seq, epoch) of the last
        entry the database holds, and the term, at least AT_LEAST (with failover, the
        leadership's epoch) and past both that epoch and every term begun here before.
        The term is stored (meta `log_term`, not logged) and synced before it returns,
        so before any entry of the term can leave: a manager killed after shipping the
        first entry of its term and before committing it still holds only the previous
        epoch, and one past that epoch alone would be the same term again, under which
        its standbys' entry (seq, term) would pass for one of the new history."""
        meta = self._db.meta
        with self._write(logged=False) as tx:  # sync=True: durable at commit
            seq, epoch = position(tx.txn.get, meta)
            last = tx.txn.get(META_TERM, db=meta)
            begun = _U64.unpack(last)[0] if last else 0
            term = max(epoch + 1, begun + 1, at_least)
            tx.txn.put(META_TERM, _U64.pack(term), db=meta)
        return seq, epoch, term

    def settle_journal(self) -> None:
        """Apply what a standby journaled in this database's directory and had not applied
        yet (mosafs.manager.metadata.journal), then remove the journal: every store opened
        does this first, so that a standby killed, restarted or promoted holds every entry
        it confirmed."""
        path = self.path / JOURNAL
        if not path.exists():
            return
        seq, epoch = self.log_position()
        entries, gap = _following(journal.read(path), seq, epoch, len(self._dbs),
                                  self.max_key_size)
        if entries:
            self.apply_log(entries)
            log.info("applied %d journaled log entries (to entry %d)", len(entries),
                     entries[-1].seq)
        if gap is not None:
            aside = path.with_name(f"{JOURNAL}.unapplied-{time.time_ns()}")
            os.rename(path, aside)
            log.error("the standby journal's entries from entry %d on cannot be applied "
                      "after entry %d of this database (%s): set aside in %s", gap[0],
                      entries[-1].seq if entries else seq, gap[1], aside)
        else:
            path.unlink()
        fsync_dir(self.path)


def copy_position(path: Path) -> tuple[int, int]:
    """(seq, epoch) of the last log entry the copy at PATH (an LMDB data file no process
    has open) holds; lmdb.Error if it is no LMDB file, or has no meta sub-database."""
    copy = lmdb.open(str(path), subdir=False, readonly=True, lock=False,
                     max_dbs=len(fields(_Dbs)) + 1)
    try:
        with copy.begin(db=copy.open_db(b"meta", create=False)) as txn:
            return position(txn.get, None)
    finally:
        copy.close()


def check_follows(entry: replication_pb2.LogEntry, seq: int, epoch: int, dbs: int,
                  max_key: int) -> None:
    """InvalidArgument unless ENTRY follows entry (SEQ, EPOCH), names only the DBS
    sub-databases of the schema, and has only keys of 1 to MAX_KEY bytes. A key LMDB
    cannot store (the active manager's own LMDB never made one) must be refused here,
    before the entry is journaled and confirmed: applied later it would fail with no
    MosafsError, and fail again at every open of the database that journaled it. Values
    need no check: no sub-database is DUPSORT, and LMDB takes any other value a frame
    can carry."""
    if entry.seq != seq + 1 or entry.epoch < epoch:
        raise InvalidArgument(f"log entry {entry.seq} of epoch {entry.epoch} does not "
                              f"follow entry {seq} of epoch {epoch}")
    unknown = next((op.db for op in entry.ops if op.db >= dbs), None)
    if unknown is not None:
        raise InvalidArgument(f"log entry {entry.seq} names sub-database {unknown}, which "
                              f"this schema lacks")
    bad = next((op.key for op in entry.ops if not 0 < len(op.key) <= max_key), None)
    if bad is not None:
        raise InvalidArgument(f"log entry {entry.seq} has a key of {len(bad)} bytes (LMDB "
                              f"stores 1 to {max_key})")


def _following(raw: list[bytes], seq: int, epoch: int, dbs: int, max_key: int
               ) -> tuple[list[replication_pb2.LogEntry], tuple[int, str] | None]:
    """The journaled entries RAW that follow (SEQ, EPOCH), skipping those already held;
    and the seq of the first that does not follow it or that check_follows refuses, with
    why (None: none; a journal an older version wrote may hold an entry with a key LMDB
    refuses). The journal ends at the first entry that does not follow the entry before
    it in the file (a record of an earlier round)."""
    entries: list[replication_pb2.LogEntry] = []
    before: int | None = None
    for data in raw:
        try:
            entry = replication_pb2.LogEntry.FromString(data)
        except DecodeError:
            break  # whole by its CRC yet no entry: the journal ends here all the same
        if before is not None and entry.seq != before + 1:
            break
        before = entry.seq
        if entry.seq <= seq:
            continue  # applied already: the journal had not started over after that commit
        try:
            check_follows(entry, seq, epoch, dbs, max_key)
        except InvalidArgument as exc:
            return entries, (entry.seq, exc.message)
        entries.append(entry)
        seq, epoch = entry.seq, entry.epoch
    return entries, None
