"""The active manager's replication log (docs/standby.md).

Every write transaction of the active manager records its changes (`Recorder`, a
stand-in for the LMDB transaction that passes reads through and notes each put and
delete). Just before it commits, `ReplicationLog.seal` gives it the next sequence number,
stored in the same transaction (meta `log_seq`, `log_epoch`), so that a copy of the
database always knows where in the log it stands. After the commit the changes become a
log entry (`append`); standbys follow the log (`attach`: one `Follower` each), and a
writer waits in `wait_confirmed` until as many in-sync standbys as the manager was told
(`--standbys N`) hold its entry durably (journaled), and every other standby of the in-sync
set too. Only then is anything acknowledged to a client: a commit that `close()`
acknowledged is on the active manager's disk and on the disk of every in-sync standby (at
least N).

Concurrency: LMDB runs one write transaction at a time, so seals happen in commit order
and sequence numbers have no gaps; entries may be appended out of order by the threads
that committed them and are released to followers in sequence order. One lock guards
everything here; writers (waiting for confirmations) and the feeds (waiting for entries)
wait on conditions of their own, so that neither is woken for the other's news.

The in-sync set: a standby joins it when it has confirmed every entry appended so far, and
leaves it when it holds an entry unconfirmed for `lag_timeout_s` (or its entries were
trimmed from memory, or it disconnected). A writer waits for every in-sync standby; with
fewer in sync than N it waits, up to `wait_timeout_s`, then fails with Unavailable: its
change is stored on the active manager but was not confirmed, and the client is told so.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lmdb

from mosafs._proto import replication_pb2
from mosafs.errors import Unavailable

log = logging.getLogger("mosafs.manager.replog")

META_SEQ = b"log_seq"
META_EPOCH = b"log_epoch"
META_TERM = b"log_term"  # the last term begun on this database (ReplicaOps.start_term);
                         # not logged: each manager's own (a snapshot carries it: harmless,
                         # a term is only ever compared upwards)
_U64 = struct.Struct(">Q")
MAX_LOG_BYTES = 64 << 20     # entries kept in memory for standbys that are behind
LAG_TIMEOUT_S = 5.0          # an in-sync standby silent this long on an entry leaves the set
WAIT_TIMEOUT_S = 30.0        # a writer waits this long for N in-sync standbys to confirm
BATCH_BYTES = 4 << 20        # entries sent to a follower in one message

Op = tuple[int, bytes, bytes | None]  # (sub-database index, key, value; None: deleted)


def position(get: Callable[..., Any], meta: Any) -> tuple[int, int]:
    """(seq, epoch) of the last log entry a database holds, (0, 0) if none: GET is a
    transaction's get, META the meta sub-database."""
    seq, epoch = get(META_SEQ, db=meta), get(META_EPOCH, db=meta)
    return (_U64.unpack(seq)[0] if seq else 0, _U64.unpack(epoch)[0] if epoch else 0)


def stamp(txn: lmdb.Transaction[bytes], meta: Any, seq: int, epoch: int) -> None:
    """Store the log position (SEQ, EPOCH) in TXN."""
    txn.put(META_SEQ, _U64.pack(seq), db=meta)
    txn.put(META_EPOCH, _U64.pack(epoch), db=meta)


class Recorder:
    """An LMDB write transaction that records every change made through it.

    Reads pass straight to the transaction (bound once: no cost per call); the writes
    mosafs makes (put, delete, replace, pop) are noted as (db index, key, value or None).
    A cursor's own put or delete would not be noted: the store makes none (the standby
    test compares every sub-database of the two copies)."""

    def __init__(self, txn: lmdb.Transaction[bytes], index: Mapping[Any, int]) -> None:
        self.txn = txn
        self.ops: list[Op] = []
        self._index = index
        self.get = txn.get
        self.cursor = txn.cursor
        self.stat = txn.stat
        self.id = txn.id

    def put(self, key: bytes, value: bytes, *, db: Any, dupdata: bool = True,
            overwrite: bool = True, append: bool = False) -> bool:
        done = self.txn.put(key, value, db=db, dupdata=dupdata, overwrite=overwrite,
                            append=append)
        if done:
            self.ops.append((self._index[db], bytes(key), bytes(value)))
        return done

    def delete(self, key: bytes, value: bytes = b"", *, db: Any) -> bool:
        done = self.txn.delete(key, value, db=db)
        if done:
            self.ops.append((self._index[db], bytes(key), None))
        return done

    def replace(self, key: bytes, value: bytes, *, db: Any) -> bytes | None:
        old = self.txn.replace(key, value, db=db)
        self.ops.append((self._index[db], bytes(key), bytes(value)))
        return old

    def pop(self, key: bytes, *, db: Any) -> bytes | None:
        old = self.txn.pop(key, db=db)
        if old is not None:
            self.ops.append((self._index[db], bytes(key), None))
        return old

    def drop(self, db: Any, delete: bool = True) -> None:
        raise RuntimeError("emptying a sub-database is not logged: only upgrades at open, "
                           "before the log is attached, do it")


def apply_ops(txn: lmdb.Transaction[bytes], dbs: Sequence[Any], ops: Iterable[Op]) -> None:
    """Apply OPS (a log entry's changes: sub-database index into DBS, key, value; None:
    deleted) in TXN: a standby applying the active manager's entries, and the active
    manager replaying its own."""
    for db, key, value in ops:
        if value is None:
            txn.delete(key, db=dbs[db])
        else:
            txn.put(key, value, db=dbs[db])


def encode(seq: int, epoch: int, ops: list[Op]) -> bytes:
    entry = replication_pb2.LogEntry(seq=seq, epoch=epoch)
    add = entry.ops.add
    for db, key, value in ops:
        if value is None:
            add(db=db, key=key, delete=True)
        else:
            add(db=db, key=key, value=value)
    return entry.SerializeToString()


@dataclass(eq=False)
class Follower:
    """One standby following the log (made by ReplicationLog.attach)."""

    member: str
    sent: int                    # the last seq sent to it (or contained in its snapshot)
    acked: int                   # the last seq it holds durably (confirmed)
    needs_snapshot: bool
    in_sync: bool = False
    owing_since: float | None = None  # when it first held an entry it has not confirmed
    attached: bool = True
    pin: int | None = None       # while its snapshot is taken: keep the entries after this


class ReplicationLog:
    """See the module docstring. EPOCH: this manager's term; (LAST_SEQ, LAST_EPOCH): the
    log position its database holds at start."""

    def __init__(self, *, epoch: int, last_seq: int, last_epoch: int, standbys: int,
                 max_bytes: int = MAX_LOG_BYTES, lag_timeout_s: float = LAG_TIMEOUT_S,
                 wait_timeout_s: float = WAIT_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic,
                 fence: Callable[[], bool] | None = None,
                 on_in_sync: Callable[[frozenset[str]], bool] | None = None) -> None:
        """FENCE (failover, docs/coordination.md): whether this manager may still
        acknowledge anything; checked last, just before a change is acknowledged.
        ON_IN_SYNC: publishes the in-sync set (the standbys that may take over) and says
        whether it landed; a change is acknowledged only once every member of the
        published set has it, so a standby dropped for lagging is unpublished first."""
        self.epoch = epoch
        self.standbys = standbys
        self._fence = fence
        self._publish = on_in_sync
        self._serving = False  # before serve(): start-up writes, acknowledged to nobody
        self._published: frozenset[str] | None = None  # what ON_IN_SYNC last landed
        self._max_bytes = max_bytes
        self._lag_timeout_s = lag_timeout_s
        self._wait_timeout_s = wait_timeout_s
        self._clock = clock
        # One lock, two conditions: writers wait for confirmations (_cond), the feeds for
        # new entries (_appended_cond), so that neither is woken for the other's news;
        # each wake-up is a thread switch, several per log entry (docs/standby.md).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._appended_cond = threading.Condition(self._lock)
        self._next = last_seq + 1
        self._base = (last_seq, last_epoch)  # the position just before the first entry kept
        self._entries: OrderedDict[int, bytes] = OrderedDict()
        self._early: dict[int, bytes] = {}   # appended before an earlier seq was
        self._appended = last_seq            # every entry up to here is in _entries
        self._bytes = 0
        self._followers: list[Follower] = []
        self._closing = False
        self._broken: str | None = None  # why nothing may be acknowledged any more

    # -- the writers' side -----------------------------------------------------------------

    def seal(self, txn: lmdb.Transaction[bytes], meta: Any) -> int:
        """The next sequence number, stored in TXN (inside the write transaction, just
        before its commit: LMDB's writer lock puts seals in commit order)."""
        with self._cond:
            if self._broken is not None:
                raise Unavailable(self._broken)
            seq = self._next
            self._next += 1
        stamp(txn, meta, seq, self.epoch)
        return seq

    def fail(self, seq: int, why: str) -> None:
        """Entry SEQ was shipped but this manager could not store it (its commit and the
        replay both failed): its database and its standbys' differ from here on, so it
        acknowledges nothing more and seals nothing more (`broken`: the manager stops, and
        a standby, which has every acknowledged change, takes over)."""
        with self._cond:
            self._broken = (f"metadata change {seq} reached the standbys but not this "
                            f"manager's database ({why}): this manager acknowledges nothing "
                            f"more")
            self._notify_all()

    @property
    def broken(self) -> str | None:
        """Why this log acknowledges nothing more (None: it does)."""
        with self._cond:
            return self._broken

    def append(self, seq: int, ops: list[Op]) -> None:
        """The entry of SEQ: a group commit's, just before its local commit; a single
        transaction's, once committed (or, with no OPS, sealed and then failed to commit:
        its number still has to reach the standbys)."""
        data = encode(seq, self.epoch, ops)
        with self._cond:
            self._early[seq] = data
            while self._appended + 1 in self._early:
                self._appended += 1
                entry = self._early.pop(self._appended)
                self._entries[self._appended] = entry
                self._bytes += len(entry)
            self._trim()
            now = self._clock()
            for f in self._followers:
                if f.owing_since is None and f.acked < self._appended:
                    f.owing_since = now
            self._appended_cond.notify_all()  # the feeds; no writer waits for this

    def wait_confirmed(self, seq: int) -> None:
        """Return once `standbys` in-sync followers hold SEQ durably; Unavailable
        after wait_timeout_s (the change stays stored here)."""
        if self.standbys <= 0 or not self._serving:
            self._check_fence(seq)
            return
        with self._cond:
            deadline = self._clock() + self._wait_timeout_s
            while True:
                # Deposed, or stopping: nothing will be acknowledged, so fail now rather
                # than wait out the deadline (and hold the stopping process meanwhile).
                self._check_fence(seq)
                if self._closing:
                    raise Unavailable(f"metadata change {seq} is stored on the manager but "
                                      f"not acknowledged: the manager is stopping")
                self._drop_laggards()
                in_sync = [f for f in self._followers if f.in_sync]
                members = frozenset(f.member for f in in_sync)
                # A smaller set is published only when it can acknowledge (N in sync):
                # with fewer, nothing is acknowledged anyway, and taking members out of
                # etcd's set would only leave fewer that may lead, though they hold every
                # acknowledged change (a new leader before its standbys reconnect).
                if len(in_sync) >= self.standbys or (
                        self._published is not None and members > self._published):
                    self._publish_in_sync(members)
                # Every member of the set, not any N of them: any member may become the
                # active manager (docs/standby.md, "Failover"), so each must have it; and
                # every member etcd still names, until a smaller set has landed there.
                told = self._publish is None or (
                    self._published is not None
                    and self._published <= {f.member for f in in_sync})
                if told and len(in_sync) >= self.standbys and \
                        all(f.acked >= seq for f in in_sync):
                    self._check_fence(seq)
                    return
                left = deadline - self._clock()
                if left <= 0:
                    raise Unavailable(
                        f"metadata change {seq} is stored on the active manager, but fewer "
                        f"than {self.standbys} standby manager(s) confirmed it within "
                        f"{self._wait_timeout_s:g} s")
                self._cond.wait(min(left, self._lag_timeout_s / 4))

    def serve(self) -> None:
        """The manager serves from now on: its writes are acknowledged to clients, so they
        wait for their confirmations. Before, its own start-up writes (the default pool's
        flags) do not: no standby can connect before the manager listens, and the entries
        reach each standby when it does."""
        with self._cond:
            self._serving = True

    def _check_fence(self, seq: int) -> None:
        if self._broken is not None:
            raise Unavailable(self._broken)
        if self._fence is not None and not self._fence():
            raise Unavailable(f"metadata change {seq} is not acknowledged: this manager is "
                              f"no longer the active one (its coordination lease lapsed)")

    def _publish_in_sync(self, members: frozenset[str]) -> None:
        """Under the lock: land MEMBERS in the coordination service where they differ
        from what it holds (rare: a standby joining or leaving). While it does not land,
        writers wait (and fail at their deadline): nothing is acknowledged past a set
        that etcd has not been told."""
        if self._publish is None or members == self._published:
            return
        if self._publish(members):
            self._published = members
            log.info("in-sync set published: %s", ", ".join(sorted(members)) or "(none)")
        else:
            # Not known to have landed, nor known not to have: a write whose answer was
            # lost may have landed a larger set than the last one known. What etcd holds
            # is unknown until a publish lands, and until then nothing is acknowledged
            # (`told` needs a known set): else a member etcd still names could miss an
            # acknowledged entry, and win the next election.
            self._published = None

    # -- the followers' side ---------------------------------------------------------------

    def attach(self, member: str, last_seq: int, last_epoch: int) -> Follower:
        """A standby standing at (LAST_SEQ, LAST_EPOCH) starts following: it goes on from
        there if this log can prove that position is on its history (the base, or an
        entry of this term still in memory), else it needs a snapshot first."""
        with self._cond:
            base_seq = self._base[0]
            on_history = last_epoch != 0 and (
                (last_seq, last_epoch) == self._base or
                (last_epoch == self.epoch and base_seq < last_seq <= self._appended))
            f = Follower(member, sent=last_seq if on_history else 0,
                         acked=last_seq if on_history else 0, needs_snapshot=not on_history)
            for old in self._followers:
                if old.member == member:  # a reconnect: the old stream is finished
                    old.attached = False
            self._followers = [old for old in self._followers if old.attached] + [f]
            log.info("standby %s follows from %s", member,
                     f"entry {last_seq}" if on_history else "a snapshot")
            self._notify_all()
            return f

    def snapshot_started(self, f: Follower) -> None:
        """F's snapshot is about to be read: it will hold at least every entry appended
        by now, so the entries after those stay in memory until F has them."""
        with self._cond:
            f.pin = self._appended

    def snapshot_taken(self, f: Follower, seq: int) -> None:
        """F was sent a snapshot holding every entry up to SEQ (it confirms it once
        installed, as it confirms entries)."""
        with self._cond:
            f.sent = seq
            f.needs_snapshot = False
            f.pin = None
            if f.owing_since is None:
                f.owing_since = self._clock()

    def next_entries(self, f: Follower, timeout: float) -> list[bytes] | None:
        """The entries after what F was sent (up to BATCH_BYTES), waiting up to TIMEOUT for
        one; None when F must start again from a snapshot (its next entry left memory, or
        it was replaced by a newer stream of the same standby)."""
        with self._cond:
            deadline = self._clock() + timeout
            while f.attached and f.sent >= self._appended:
                left = deadline - self._clock()
                if left <= 0:
                    return []
                self._appended_cond.wait(left)
            if not f.attached:
                return None
            first = next(iter(self._entries), self._appended + 1)
            if f.sent + 1 < first:
                f.needs_snapshot = True
                self._leave(f, "its next entries were trimmed from memory")
                return None
            out: list[bytes] = []
            size = 0
            seq = f.sent + 1
            while seq <= self._appended and (not out or size < BATCH_BYTES):
                out.append(self._entries[seq])
                size += len(out[-1])
                seq += 1
            f.sent = seq - 1
            return out

    def confirmed(self, f: Follower, seq: int) -> None:
        """F holds every entry up to SEQ durably."""
        with self._cond:
            if seq <= f.acked or seq > f.sent:
                return  # old news, or a claim beyond what it was sent: ignored
            f.acked = seq
            f.owing_since = None if seq >= self._appended else self._clock()
            if not f.in_sync and seq >= self._appended and f.attached:
                f.in_sync = True
                log.info("standby %s is in sync (entry %d)", f.member, seq)
                # Published at once, not at the next write: an idle cluster's standby
                # must become eligible to take over too.
                self._publish_in_sync(frozenset(x.member for x in self._followers
                                                if x.in_sync))
            self._trim()
            self._cond.notify_all()

    def detach(self, f: Follower) -> None:
        with self._cond:
            if f.attached:
                f.attached = False
                self._leave(f, "it disconnected", news=False)
            self._followers = [x for x in self._followers if x.attached]
            self._notify_all()

    def close(self) -> None:
        """The manager is stopping: its standbys' streams end, which is no news."""
        with self._cond:
            self._closing = True
            self._notify_all()  # waiting writers fail at once

    # -- figures -------------------------------------------------------------------------

    def followers(self) -> list[tuple[str, int, bool]]:
        """(member, entries behind the last appended, in sync) of every attached standby."""
        with self._cond:
            return [(f.member, max(0, self._appended - f.acked), f.in_sync)
                    for f in self._followers]

    @property
    def last_seq(self) -> int:
        with self._cond:
            return self._appended

    # -- under the lock ------------------------------------------------------------------

    def _notify_all(self) -> None:
        """News for writers and feeds alike (a follower came or went, the log broke or
        closes)."""
        self._cond.notify_all()
        self._appended_cond.notify_all()

    def _leave(self, f: Follower, why: str, *, news: bool = True) -> None:
        """F is no longer in sync. A warning where that is news (it lags while connected);
        a standby that went away (stopped, or died: its own log says which) is not."""
        if f.in_sync:
            f.in_sync = False
            report = log.warning if news and not self._closing else log.info
            report("standby %s left the in-sync set: %s", f.member, why)

    def _drop_laggards(self) -> None:
        now = self._clock()
        for f in self._followers:
            if f.in_sync and f.owing_since is not None and \
                    now - f.owing_since > self._lag_timeout_s:
                self._leave(f, f"it confirmed nothing for {self._lag_timeout_s:g} s")

    def _trim(self) -> None:
        """Drop entries every follower confirmed, and the oldest beyond max_bytes (a
        follower that still needs them gets a snapshot)."""
        floor = self._appended
        for f in self._followers:
            if not f.needs_snapshot:
                floor = min(floor, f.acked)
            elif f.pin is not None:
                floor = min(floor, f.pin)
        while self._entries:
            seq, data = next(iter(self._entries.items()))
            if seq > floor and self._bytes <= self._max_bytes:
                break
            del self._entries[seq]
            self._bytes -= len(data)
            self._base = (seq, self.epoch)
