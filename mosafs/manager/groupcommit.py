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

Bodies announced together (`announce`: the writes of one Batch RPC, which its threads
queue a few hundred microseconds apart) share a group too: the committer waits for every
announced body not yet queued, up to GATHER_S, before it commits what it holds. Left to
chance they made two or three groups per batch, and every group is a durable commit and,
with standbys, a log entry to ship (docs/benchmarks.md, "A batch's writes in one group").
A ticket whose body never comes (refused before writing) is retired when its operation
ends, so the committer waits for it no longer.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
import time
from collections.abc import Callable
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
GATHER_S = 0.002  # the longest a group waits for announced bodies not yet queued
_WAKE = object()  # queued when a ticket is retired: the committer looks again
_STOP = object()  # queued by close()


@dataclass
class _Request(Generic[T]):
    body: Callable[[lmdb.Transaction[bytes]], T]
    future: Future[T] = field(default_factory=Future)
    seq: int = 0  # the replication log entry its group became (0: none)
    tag: str = ""  # whom the body runs for (the observer is told)
    ops: list[Any] | None = None  # its changes, where they are recorded
    announced: bool = False  # it came with a ticket (the committer was waiting for it)


class Ticket:
    """One announced body (GroupCommitter.announce): run the operation that will queue it
    inside `with ticket:`, in the thread that runs it. Its first body queued there takes
    the ticket; if none does, leaving the block retires it."""

    def __init__(self, committer: GroupCommitter) -> None:
        self._committer = committer
        self._token: contextvars.Token[Ticket | None] | None = None
        self.taken = False  # by a body, or retired: the committer no longer waits for it

    def __enter__(self) -> Ticket:
        self._token = _TICKET.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _TICKET.reset(self._token)
        self._committer._retire(self)

    def take(self, committer: GroupCommitter) -> bool:
        """Whether a body of COMMITTER queued now comes with this ticket (its first one)."""
        if self.taken or committer is not self._committer:
            return False
        self.taken = True
        return True


_TICKET: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("ticket", default=None)


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
                 name: str = "lmdb-commit") -> None:
        self._env = env
        self._max_group = max_group
        self._gate = gate or nullcontext
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()  # requests, _WAKE, _STOP
        self._closed = False
        self._lock = threading.Lock()
        self.journal: Journal | None = None  # set while a replication log is attached
        # Told each committed body's tag and changes before its caller is answered.
        self.observer: Callable[[str, list[Any]], None] | None = None
        # What records a body's changes (the transaction it sees instead, and the list its
        # changes go to), for the journal and the observer; unused while neither is set.
        self.recorder: Callable[[lmdb.Transaction[bytes]], tuple[Any, list[Any]]] | None = None
        self._awaited = 0  # announced bodies not yet taken into a group (under _lock)
        self.gather_s = GATHER_S
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
        if threading.current_thread() is self._thread:
            raise RuntimeError("a write transaction's body started another write: the "
                               "committer would wait for itself")
        request: _Request[T] = _Request(body, tag=tag)
        ticket = _TICKET.get()
        with self._lock:
            if self._closed:
                raise RuntimeError("the metadata store is closed")
            request.announced = ticket is not None and ticket.take(self)
            self._queue.put(request)
        return request.future.result(), request.seq

    def announce(self) -> Ticket:
        """A body another thread is about to queue: the group it would join waits for it
        (up to GATHER_S). See Ticket."""
        with self._lock:
            self._awaited += 1
        return Ticket(self)

    def _retire(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket.taken:
                return
            ticket.taken = True
            self._awaited -= 1
            self._queue.put(_WAKE)

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
            if first is _WAKE:
                continue
            group = [self._took(first)]
            deadline = time.monotonic() + self.gather_s
            while len(group) < self._max_group:
                more = self._next(deadline)
                if more is None:
                    break
                if more is _STOP:
                    stopping = True
                    break
                if more is not _WAKE:
                    group.append(self._took(more))
            self._commit(group)

    def _next(self, deadline: float) -> Any:
        """The next queued item; when none is queued, the next to come while an announced
        body is awaited (up to DEADLINE). None: the group is complete."""
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            awaited = self._awaited > 0
        left = deadline - time.monotonic()
        if not awaited or left <= 0:
            return None
        try:
            return self._queue.get(timeout=left)
        except queue.Empty:
            return None

    def _took(self, request: _Request[Any]) -> _Request[Any]:
        if request.announced:
            with self._lock:
                self._awaited -= 1
        return request

    def _commit(self, group: list[_Request[Any]]) -> None:
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
