"""Group commit of LMDB write transactions (docs/metadata.md, "Group commit").

LMDB lets one write transaction run at a time, and with `sync` and `metasync` each
commit waits for two flushes of the disk. One transaction per mutating RPC therefore caps
the manager at one flush pair per operation, however many clients wait. Here the
operations' bodies run in one thread, the committer, many to a transaction: it takes the
first waiting body, then every other one queued behind it (up to MAX_GROUP), runs each in
a nested transaction of its own (a body that raises is rolled back alone, the others
keep their changes), commits the group once, and only then hands every body's result or
error back to its caller. Nothing is acknowledged before the commit that made it
durable; a body sees the changes of the bodies before it in its group, as it would had
they committed one by one.

Under load the groups grow by themselves (operations that arrive while a group commits
make up the next one); a lone operation costs what it did, plus the hand-off to the
committer's thread. LMDB binds a write transaction to the thread that began it, which is
why the bodies move to the committer's thread instead of the committer borrowing the
callers' transactions.

Bodies queued together (`run_together`: the writes of one Batch RPC) always share a group:
they enter the queue as one item, from the thread that answers the RPC, so no thread of
their own is needed to wait for each, and no group is cut between them (a group then
holds more than MAX_GROUP bodies if one batch brings more: a batch holds at most 256).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import lmdb

from mosafs import metrics
from mosafs.errors import MosafsError

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_GROUP = 256  # bodies in one transaction: bounds a group's dirty pages and its latency
_STOP = object()  # queued by close()


@dataclass
class _Request(Generic[T]):
    body: Callable[[lmdb.Transaction[bytes]], T]
    future: Future[T] = field(default_factory=Future)
    seq: int = 0  # the replication log entry its group became (0: none)
    tag: str = ""  # whom the body runs for (the observer is told)
    ops: list[Any] | None = None  # its changes, where they are recorded


class Journal(Protocol):
    """The replication log as the committer sees it (mosafs.manager.replog); a group's
    changes are recorded by the committer's `recorder`."""

    def seal(self, txn: lmdb.Transaction[bytes]) -> int:
        """The group's sequence number, stored in TXN just before its commit."""

    def append(self, seq: int, ops: list[Any]) -> None:
        """The group's entry, shipped to the standbys just before its local commit."""

    def replay(self, seq: int, ops: list[Any]) -> None:
        """The local commit of entry SEQ failed after it was shipped: make this database
        hold it all the same (grow the map if it was full, apply OPS and the position in a
        transaction of their own), or raise (the log is then broken: nothing more is
        acknowledged)."""


class GroupCommitter:
    """Runs write transactions' bodies (`run`) in one thread, many to a commit.

    GATE, if given, is entered around each group's transaction (the map-resize gate of
    mosafs.manager.mapsize: a resize waits until no transaction is open)."""

    def __init__(self, env: lmdb.Environment, *, max_group: int = MAX_GROUP,
                 gate: Callable[[], AbstractContextManager[Any]] | None = None,
                 writer: AbstractContextManager[Any] | None = None,
                 name: str = "lmdb-commit") -> None:
        """WRITER: held around each group, from its transaction to its replay if its
        commit fails, by this thread; the store's other write transactions take it too,
        so that none slips in between a failed commit and its replay (which would
        overwrite that later, acknowledged change with the replayed one)."""
        self._env = env
        self._max_group = max_group
        self._gate = gate or nullcontext
        self._writer = writer or nullcontext()
        # Lists of requests (a lone one, or a batch's), and _STOP.
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self.journal: Journal | None = None  # set while a replication log is attached
        # Told each committed body's tag and changes before its caller is answered.
        self.observer: Callable[[str, list[Any]], None] | None = None
        # What records a body's changes (the transaction it sees instead, and the list its
        # changes go to), for the journal and the observer; unused while neither is set.
        self.recorder: Callable[[lmdb.Transaction[bytes]], tuple[Any, list[Any]]] | None = None
        self.groups = 0  # transactions committed
        self.bodies = 0  # bodies run (committed or rolled back)
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def run(self, body: Callable[[lmdb.Transaction[bytes]], T]) -> T:
        """BODY(txn) in a write transaction; its result once the transaction holding it is
        durable, or the exception it raised (its changes rolled back). LMDB's MapFullError
        comes back as it was raised, from the body or from the group's commit."""
        return self.run_sealed(body)[0]

    def run_sealed(self, body: Callable[[lmdb.Transaction[bytes]], T],
                   tag: str = "") -> tuple[T, int]:
        """As run, with the replication log entry its group became (0: none). TAG: whom
        BODY runs for, as the observer is told."""
        (request,) = self._queue_all([body], tag)
        return request.future.result(), request.seq

    def run_together(self, bodies: Sequence[Callable[[lmdb.Transaction[bytes]], Any]],
                     tag: str = "") -> tuple[list[tuple[bool, Any]], int]:
        """BODIES in one group, in order, each as `run` would run it: (True, result) or
        (False, the exception it raised) for each, once the group is durable, and the
        replication log entry the group became (0: none). If the group's commit fails,
        every body's outcome is that error."""
        requests = self._queue_all(bodies, tag)
        outcomes: list[tuple[bool, Any]] = []
        for request in requests:
            try:
                outcomes.append((True, request.future.result()))
            except BaseException as exc:
                outcomes.append((False, exc))
        return outcomes, max(r.seq for r in requests)

    def _queue_all(self, bodies: Sequence[Callable[[lmdb.Transaction[bytes]], Any]],
                   tag: str) -> list[_Request[Any]]:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a write transaction's body started another write: the "
                               "committer would wait for itself")
        if not bodies:
            raise ValueError("nothing to run")
        requests = [_Request(body, tag=tag) for body in bodies]
        with self._lock:
            if self._closed:
                raise RuntimeError("the metadata store is closed")
            self._queue.put(requests)
        return requests

    def close(self) -> None:
        """Run what is queued, then stop the committer's thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        self._thread.join()

    # -- the committer's thread ------------------------------------------------------------

    def _serve(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                return
            group = list(first)
            while len(group) < self._max_group:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stopping = True
                    break
                group += more
            self._commit(group)

    def _commit(self, group: list[_Request[Any]]) -> None:
        with self._writer:
            self._commit_held(group)

    def _commit_held(self, group: list[_Request[Any]]) -> None:
        outcomes: list[tuple[bool, Any]] = []
        journal = self.journal
        ops: list[Any] = []
        seq = 0
        try:
            with self._gate():
                txn = self._env.begin(write=True)
                try:
                    outcomes = [self._one(txn, r, ops) for r in group]
                    if journal is not None and ops:
                        seq = journal.seal(txn)
                        # Shipped before the local commit, so that the standbys apply it
                        # while this disk flushes (docs/standby.md, "Shipped before the
                        # local commit"): a change waits for the slower of the two flushes,
                        # not for both in turn.
                        journal.append(seq, ops)
                    flushed = time.perf_counter()
                    txn.commit()
                    metrics.MANAGER_COMMIT_FLUSH_SECONDS.observe(time.perf_counter() - flushed)
                    metrics.MANAGER_COMMIT_GROUP.observe(len(group))
                except BaseException:
                    txn.abort()
                    raise
        except BaseException as exc:  # the group's commit failed: nothing of it is stored
            if not (journal is not None and seq and self._replayed(journal, seq, ops, exc)):
                for r in group:
                    r.future.set_exception(exc)
                # LMDB's and the system's errors are the disk's (full, too large, failing);
                # a MosafsError is the log refusing a seal (broken, or deposed).
                if not isinstance(exc, lmdb.Error | OSError | MosafsError):
                    log.exception("bug in a group commit")
                return
        self.groups += 1
        self.bodies += len(group)
        observer = self.observer
        if observer is not None:
            try:
                for r, (ok, _) in zip(group, outcomes, strict=True):
                    if ok and r.ops:
                        observer(r.tag, r.ops)
            except Exception:  # the commit stands: its callers are answered all the same
                log.exception("bug in a group commit's observer")
        for r, (ok, value) in zip(group, outcomes, strict=True):
            r.seq = seq
            if ok:
                r.future.set_result(value)
            else:
                r.future.set_exception(value)

    @staticmethod
    def _replayed(journal: Journal, seq: int, ops: list[Any], exc: BaseException) -> bool:
        """Entry SEQ (OPS) was shipped and its local commit failed with EXC: whether
        replaying it stored it here after all (its bodies' outcomes then stand)."""
        try:
            journal.replay(seq, ops)
        except BaseException as again:
            log.error("metadata change %d reached the standbys but not this manager's "
                      "database (%s, then %s): this manager acknowledges nothing more; "
                      "stop it and let a standby take over", seq, exc, again)
            return False
        log.info("metadata change %d stored by replaying its log entry after its commit "
                 "failed (%s)", seq, exc)
        return True

    def _one(self, txn: lmdb.Transaction[bytes], request: _Request[Any],
             ops: list[Any]) -> tuple[bool, Any]:
        """REQUEST's body in a nested transaction: (True, result) with its changes kept in
        TXN (and, with a journal, added to OPS), or (False, exception) with them rolled
        back."""
        child = self._env.begin(write=True, parent=txn)
        recorder = self.recorder
        seen: Any = child
        changes: list[Any] | None = None
        if recorder is not None and (self.journal is not None or self.observer is not None):
            seen, changes = recorder(child)
        try:
            value = request.body(seen)
        except BaseException as exc:
            child.abort()
            return False, exc
        child.commit()
        if changes:
            ops.extend(changes)
            request.ops = changes
        return True, value
