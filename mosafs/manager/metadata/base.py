"""The store's base: the LMDB environment and its map, read and write transactions, and
the first open's initialisation. Every operation of the concern modules runs in one
transaction of it.

The map grows by itself up to the ceiling `map_size` (mosafs.manager.mapsize): every
transaction runs inside its gate, writes that add data are refused with NoSpace near the
ceiling while the others may use the reserve kept there, and an operation whose write
transaction found the map full runs again once the map has grown (@_rerun_if_grown).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Generic, Self, TypeVar, cast

import lmdb

from mosafs import capability
from mosafs._proto import metadata_pb2
from mosafs.errors import ConfigError, MosafsError
from mosafs.manager import pools
from mosafs.manager.changes import ChangeList
from mosafs.manager.groupcommit import GroupCommitter
from mosafs.manager.mapsize import MapGrown, MapSizer, initial_size
from mosafs.manager.metadata.schema import (
    _U64,
    DB_NAMES,
    DEFAULT_MAP_SIZE,
    DIRECTORY,
    MAX_DBS,
    ROOT_INODE,
    SCHEMA_VERSION,
    SCHEMA_WITHOUT_HOLDINGS,
    _Dbs,
)
from mosafs.manager.metadata.tx import Tx, holders_of, sync_holdings
from mosafs.manager.replog import Op, Recorder, ReplicationLog, apply_ops, position, stamp

log = logging.getLogger("mosafs.manager.metadata")
# Reader slots: py-lmdb holds one per read transaction object until Python frees it (an
# ended transaction is only reset, for reuse), not per thread. The manager runs about 80
# threads; the rest is headroom for transactions still referenced a while after they
# ended (by an error being answered). 64 bytes each in lock.mdb.
MAX_READERS = 1024
HOLDINGS_PAGE = 50_000  # chunk records per transaction while the holdings index is built

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")


@dataclass(frozen=True)
class Planned(Generic[_T]):
    """A write checked and ready to run as one operation of a group commit
    (StoreBase.run_planned): BODY(tx), and whether it may grow the map (GROWS, as for
    _write)."""

    body: Callable[[Tx], _T]
    grows: bool = False


def _rerun_if_grown(method: _F) -> _F:
    """Run METHOD again when its write transaction found the map full and the map grew
    (MapGrown): the transaction was aborted whole, so the second run is the one that
    counts. One-shot iterators among the arguments are read into lists first, so that it
    sees the same input. Growth is bounded (ceiling, disk), so this ends."""
    @functools.wraps(method)
    def run(self: StoreBase, *args: Any, **kwargs: Any) -> Any:
        args = tuple(list(a) if isinstance(a, Iterator) else a for a in args)
        kwargs = {k: list(v) if isinstance(v, Iterator) else v for k, v in kwargs.items()}
        while True:
            try:
                return method(self, *args, **kwargs)
            except MapGrown:
                continue
    return cast(_F, run)


class StoreBase:
    """The environment, its map and transactions, which every concern's operations use
    (MetadataStore joins them)."""

    def __init__(self, path: str | Path, *, map_size: int = DEFAULT_MAP_SIZE) -> None:
        """MAP_SIZE: the ceiling the map may grow to (mosafs.manager.mapsize)."""
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._env = lmdb.open(str(self.path), subdir=True, map_size=initial_size(map_size),
                              max_dbs=MAX_DBS, sync=True, metasync=True,
                              max_readers=MAX_READERS)
        # Reader slots of processes that died (a manager killed with SIGKILL) are freed here.
        self._env.reader_check()
        env = self._env
        self._db = _Dbs(*(env.open_db(name) for name in DB_NAMES))
        self._map = MapSizer(env, [getattr(self._db, f.name) for f in fields(_Dbs)],
                             self.path, map_size)
        self._writes = 0
        self._count_lock = threading.Lock()
        # Told the ids of chunks a committed write transaction left with refcount 0
        # (mosafs.manager.garbage queues them for collection); None: nobody.
        self.on_unreferenced: Callable[[list[bytes]], None] | None = None
        # The operations clients wait on share commits (docs/metadata.md, "Group commit").
        # Held by every write transaction, and by the committer from a group's
        # transaction to its replay (GroupCommitter, `writer`).
        self._writer = threading.RLock()
        self._committer = GroupCommitter(env, gate=self._map.gate.shared, writer=self._writer)
        # The replication log of an active manager with standbys (mosafs.manager.replog,
        # attach_log); None: nothing is recorded.
        self.log: ReplicationLog | None = None
        # The namespace's recent changes, for the mounts' caches (track_changes); None:
        # not kept.
        self.changes: ChangeList | None = None
        # The sub-databases in schema order: a log entry's changes name them by index.
        self._dbs = [getattr(self._db, f.name) for f in fields(_Dbs)]
        self._db_index = {db: i for i, db in enumerate(self._dbs)}
        self._committer.recorder = self._recording
        self._initialise()

    def close(self) -> None:
        self._committer.close()
        self._env.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def map_size(self) -> int:
        """Bytes the LMDB map has now (it grows up to the map_size given at open)."""
        return self._map.map_size

    @contextmanager
    def _read(self) -> Iterator[Tx]:
        with self._map.gate.shared(), self._env.begin() as txn:
            yield Tx(txn, self._db)

    @property
    def write_transactions(self) -> int:
        """Write transactions committed since this store was opened."""
        with self._count_lock:
            return self._writes

    @contextmanager
    def _write(self, *, grows: bool = False, logged: bool = True) -> Iterator[Tx]:
        """One write transaction. GROWS: it adds data (a new name, version, attribute), so
        it is refused near the ceiling, keeping the reserve for the writes that free
        space. A full map raises MapGrown once the map grew (the caller runs again:
        @_rerun_if_grown), else NoSpace. LOGGED: with a replication log attached, its
        changes are an entry of their own (not for replaying an entry)."""
        self._map.prepare(grows=grows)
        seen = self._map.map_size
        journal = self.log if logged else None
        seq = 0
        try:
            with self._writer, self._map.gate.shared(), self._env.begin(write=True) as txn:
                recorded = journal is not None or (logged and self.changes is not None)
                rec = Recorder(txn, self._db_index) if recorded else None
                tx = Tx(cast("lmdb.Transaction[bytes]", rec or txn), self._db)
                yield tx
                if journal is not None and rec is not None and rec.ops:
                    seq = journal.seal(txn, self._db.meta)
        except BaseException as exc:
            if seq:  # sealed, then the commit failed: the number still goes out, empty
                cast(ReplicationLog, journal).append(seq, [])
            if isinstance(exc, lmdb.MapFullError):
                raise self._map.full(seen, grows=grows) from None
            raise
        self._committed(tx)
        if logged and self.changes is not None and rec is not None and rec.ops:
            self.changes.record(capability.ORIGIN.get(), rec.ops)
        if seq:
            cast(ReplicationLog, journal).append(seq, cast(Recorder, rec).ops)
            cast(ReplicationLog, journal).wait_confirmed(seq)

    def _committed(self, tx: Tx) -> None:
        """After TX committed (a transaction, or a group's body): counted, and chunks it
        left unreferenced go to on_unreferenced."""
        with self._count_lock:
            self._writes += 1
        if tx.unreferenced and self.on_unreferenced is not None:
            self.on_unreferenced(list(tx.unreferenced))

    def _grouped(self, body: Callable[[Tx], _T], *, grows: bool = False) -> _T:
        """BODY(tx) as one operation of a group commit: its result once the commit that
        holds it is durable; what it raised, with its changes rolled back. GROWS and a
        full map as for _write; LMDB's lock keeps the groups and _write's transactions
        apart."""
        return self.run_plan(Planned(body, grows))

    def run_plan(self, plan: Planned[_T]) -> _T:
        """PLAN alone, as run_planned runs a batch: its result, or what refused it raised."""
        (answer,) = self.run_planned([plan])
        if isinstance(answer, MosafsError):
            raise answer
        return cast(_T, answer)

    def run_planned(self, plans: Sequence[Planned[Any]]) -> list[Any]:
        """PLANS (a Batch RPC's writes, or one write) run in one group commit, in order,
        from this thread: each one's result, or the MosafsError that refused it (rolled
        back alone), once the group is durable (and confirmed by the standbys). Those that
        found the map full run again, in a group of their own, once it grew (NoSpace where
        it cannot). A bug in a body is raised, after the group."""
        answers: list[Any] = [None] * len(plans)
        todo = list(range(len(plans)))
        while todo:
            try:  # admitted as a whole (near the ceiling: refused as a whole)
                self._map.prepare(grows=any(plans[i].grows for i in todo))
            except MosafsError as exc:
                for i in todo:
                    answers[i] = exc
                break
            seen = self._map.map_size
            full = self._run_group([(i, plans[i]) for i in todo], answers)
            todo = [i for i in full if self._grown(seen, plans[i], answers, i)]
        return answers

    def _run_group(self, plans: list[tuple[int, Planned[Any]]],
                   answers: list[Any]) -> list[int]:
        """Run PLANS (index, plan) in one group, each one's answer into ANSWERS; the
        indexes of those that found the map full."""
        made: list[list[Tx]] = [[] for _ in plans]
        outcomes, seq = self._committer.run_together(
            [self._running(p.body, m) for (_, p), m in zip(plans, made, strict=True)],
            capability.ORIGIN.get())
        full: list[int] = []
        stored: list[int] = []
        bug: BaseException | None = None
        for (i, _), txs, (ok, value) in zip(plans, made, outcomes, strict=True):
            if ok:
                self._committed(txs[-1])
                answers[i] = value
                stored.append(i)
            elif isinstance(value, lmdb.MapFullError):
                full.append(i)
            elif isinstance(value, MosafsError):
                answers[i] = value.with_traceback(None)
            else:
                # A bug: the call fails, after the bodies committed with it are done
                # with (their unreferenced chunks told, their confirmations awaited).
                bug = bug or value
        if seq and stored and self.log is not None:
            try:
                self.log.wait_confirmed(seq)
            except MosafsError as exc:  # stored here, not confirmed: each is told so
                for i in stored:
                    answers[i] = exc
        if bug is not None:
            raise bug
        return full

    def _grown(self, seen: int, plan: Planned[Any], answers: list[Any], i: int) -> bool:
        """PLAN (index I) found the map full at size SEEN: whether the map grew (run it
        again), else its NoSpace goes into ANSWERS."""
        refusal = self._map.full(seen, grows=plan.grows)
        if isinstance(refusal, MapGrown):
            return True
        answers[i] = refusal
        return False

    def _running(self, body: Callable[[Tx], _T], made: list[Tx]) -> Callable[..., _T]:
        """BODY as the committer runs it, with the Tx of each run kept in MADE."""
        def run(txn: lmdb.Transaction[bytes]) -> _T:
            made.append(Tx(txn, self._db))
            return body(made[-1])
        return run

    def attach_log(self, journal: ReplicationLog) -> None:
        """From now on every write transaction is recorded in JOURNAL, and none returns
        before its entry is confirmed (mosafs.manager.replog)."""
        self.log = journal
        self._committer.journal = _Journal(journal, self._db.meta, self._replay)

    def _recording(self, txn: lmdb.Transaction[bytes]) -> tuple[Recorder, list[Op]]:
        """TXN as a group's body sees it while its changes are recorded (for the
        replication log and the change list), and the list they go to."""
        rec = Recorder(txn, self._db_index)
        return rec, rec.ops

    def track_changes(self) -> ChangeList:
        """From now on every committed change to inodes and names is listed in the
        ChangeList returned (mosafs.manager.changes), with the mount it came from."""
        changes = ChangeList(self._db_index[self._db.inodes], self._db_index[self._db.dirents])
        self.changes = changes
        self._committer.observer = changes.record
        return changes

    @_rerun_if_grown
    def _replay(self, seq: int, epoch: int, ops: list[Op]) -> None:
        """Store entry (SEQ, EPOCH) of this manager's own log, whose commit failed after
        it was shipped: its OPS and its position, in a transaction of their own."""
        with self._write(logged=False) as tx:
            apply_ops(tx.txn, self._dbs, ops)
            stamp(tx.txn, self._db.meta, seq, epoch)

    def log_position(self) -> tuple[int, int]:
        """(seq, epoch) of the last replication log entry this database holds."""
        with self._read() as tx:
            return position(tx.txn.get, self._db.meta)

    @contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[Tx]:
        """One transaction over the whole store, for tools that check or repair it as a
        whole (mosafs.manager.fsck); everything else uses the operations of the
        concern modules."""
        with self._write() if write else self._read() as tx:
            yield tx

    @_rerun_if_grown
    def _initialise(self) -> None:
        """Schema marker, inode counter, root directory and default pool on first open."""
        now = time.time_ns()
        with self._write() as tx:
            schema = tx.txn.get(b"schema", db=self._db.meta)
            if schema is not None and schema not in (SCHEMA_VERSION, SCHEMA_WITHOUT_HOLDINGS):
                raise ConfigError(f"{self.path} holds metadata schema {schema.decode()!r}; "
                                  f"this manager reads schema {SCHEMA_VERSION.decode()}")
            if schema is None:
                tx.txn.put(b"schema", SCHEMA_VERSION, db=self._db.meta)
                tx.txn.put(b"next_inode", _U64.pack(ROOT_INODE + 1), db=self._db.meta)
                tx.put_inode(ROOT_INODE, metadata_pb2.InodeRecord(
                    kind=DIRECTORY, mode=0o755, nlink=2, atime_ns=now, mtime_ns=now,
                    ctime_ns=now, parent=ROOT_INODE))
            if tx.pool(pools.DEFAULT_POOL) is None:
                tx.put_pool(pools.default_settings())
        if schema == SCHEMA_WITHOUT_HOLDINGS:
            self._build_holdings()

    def _build_holdings(self) -> None:
        """Schema 1 -> 2: index what every benefactor holds, a page of chunk records per
        transaction; the schema says 2 only once the index is whole, so an upgrade cut
        short starts again from an empty index at the next open."""
        started = time.monotonic()
        log.info("upgrading %s to metadata schema 2: indexing each benefactor's chunks",
                 self.path)
        self._clear_holdings()
        after: bytes | None = b""
        records = 0
        while after is not None:
            after, done = self._holdings_page(after)
            records += done
        self._set_schema()
        log.info("metadata schema 2: %d chunk records indexed in %.1f s", records,
                 time.monotonic() - started)

    @_rerun_if_grown
    def _clear_holdings(self) -> None:
        with self._write() as tx:
            tx.txn.drop(self._db.holdings, delete=False)

    @_rerun_if_grown
    def _holdings_page(self, after: bytes) -> tuple[bytes | None, int]:
        """Index the chunk records after key AFTER (b"": from the first), at most
        HOLDINGS_PAGE: (the last key done, or None at the end; records done)."""
        done = 0
        last = after
        with self._write(grows=True) as tx:
            cursor = tx.txn.cursor(db=self._db.chunks)
            found = cursor.set_range(after) if after else cursor.first()
            while found and done < HOLDINGS_PAGE:
                cid = bytes(cursor.key())
                if cid != after:
                    rec = metadata_pb2.ChunkRecord.FromString(cursor.value())
                    sync_holdings(tx.txn, self._db, cid, set(), holders_of(rec))
                    done += 1
                    last = cid
                found = cursor.next()
        return (last if found else None), done

    @_rerun_if_grown
    def _set_schema(self) -> None:
        with self._write() as tx:
            tx.txn.put(b"schema", SCHEMA_VERSION, db=self._db.meta)


class _Journal:
    """The group committer's view of a replication log (groupcommit.Journal)."""

    def __init__(self, journal: ReplicationLog, meta: Any,
                 replay: Callable[[int, int, list[Op]], None]) -> None:
        self._log, self._meta, self._replay = journal, meta, replay

    def seal(self, txn: lmdb.Transaction[bytes]) -> int:
        return self._log.seal(txn, self._meta)

    def append(self, seq: int, ops: list[Any]) -> None:
        self._log.append(seq, ops)

    def replay(self, seq: int, ops: list[Any]) -> None:
        try:
            self._replay(seq, self._log.epoch, ops)
        except BaseException as exc:
            self._log.fail(seq, str(exc) or type(exc).__name__)
            raise
