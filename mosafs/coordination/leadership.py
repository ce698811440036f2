"""Which manager is active: leader election through etcd, the fencing rule, the in-sync
set and the member records, all under /mosafs/<cluster>/ (docs/coordination.md).

etcd decides; mosafs runs no consensus of its own. The leader holds the key `leader`
under a lease of its own; the key's create revision is its epoch, which only grows from
one leader to the next and is the fencing token carried on every log entry. A leader
acts only while Leadership.valid(): its lease is certainly alive in etcd until the send
time of its last successful refresh plus the TTL, and valid() stops a margin before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from types import TracebackType

from mosafs.coordination.gateway import (
    CoordinationUnavailable,
    FailureStreak,
    Gateway,
    LeaseNotFound,
    cmp_equal,
    op_put,
    op_range,
)
from mosafs.coordination.layout import (
    Keys,
    LeaderInfo,
    MemberInfo,
    check_name,
    decode_in_sync,
    decode_leader,
    decode_member,
    encode_in_sync,
    encode_leader,
    encode_member,
)
from mosafs.coordination.members import MemberSession
from mosafs.errors import ConfigError

log = logging.getLogger("mosafs.coordination")

Clock = Callable[[], float]

WATCH_S = 2.0  # the longest a loop waits on a watch before it reads again


def boottime() -> float:
    """Seconds of CLOCK_BOOTTIME: monotonic, and unlike CLOCK_MONOTONIC it goes on while
    the machine is suspended. A leader whose host slept past its lease must not wake up
    believing it still holds it."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class Leadership:
    """This member's term as leader, from the campaign it won until resign() or until
    its lease is lost. A thread refreshes the lease every ttl/3."""

    def __init__(self, *, gateway: Callable[[], Gateway], member: str,
                 address: str, epoch: int, lease: int, granted_at: float, ttl_s: float,
                 margin_s: float, clock: Clock) -> None:
        self.member = member
        self.address = address
        self.epoch = epoch
        self.lease = lease
        self.lost = threading.Event()  # set once the term is over, for whatever reason
        self._ttl_s = ttl_s
        self._margin_s = margin_s
        self._clock = clock
        self._valid_until = granted_at + ttl_s - margin_s
        self._gateway = gateway
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keepalive, daemon=True,
                                        name=f"mosafs-leadership-{epoch}")
        self._thread.start()

    def __repr__(self) -> str:
        return f"Leadership(member={self.member!r}, epoch={self.epoch}, valid={self.valid()})"

    def valid(self) -> bool:
        """Whether this member may still act as leader (acknowledge a commit, write the
        in-sync set): True only before (send time of the last successful refresh or of
        the grant) + TTL - margin by the local clock. etcd started the lease's TTL no
        earlier than that send time, so nobody else can hold the leader key yet. A
        process paused past that point finds False on waking, before any refresh."""
        return not self.lost.is_set() and self._clock() < self._valid_until

    def remaining(self) -> float:
        """Seconds valid() stays True without another refresh (0 once it is False)."""
        if self.lost.is_set():
            return 0.0
        return max(0.0, self._valid_until - self._clock())

    def resign(self) -> bool:
        """End the term: stop refreshing and revoke the lease, which deletes the leader
        key, so a standby takes over at once instead of after the TTL. False when etcd
        could not be told (the key then goes when the lease lapses)."""
        self._stop.set()
        self.lost.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        gw = self._gateway()
        try:
            gw.revoke(self.lease)
        except CoordinationUnavailable as exc:
            log.warning("epoch %d: resigned, but etcd could not be told (the leader key "
                        "goes when its lease lapses): %s", self.epoch, exc)
            return False
        finally:
            gw.close()
        log.info("member %s resigned as leader (epoch %d)", self.member, self.epoch)
        return True

    # -- the keepalive thread -------------------------------------------------------------

    def _keepalive(self) -> None:
        gw = self._gateway()
        streak = FailureStreak(f"epoch {self.epoch}: cannot refresh the leader lease")
        try:
            while not self._stop.wait(self._next_wait(streak.failing)):
                if self._lapsed():
                    return
                sent = self._clock()
                try:
                    gw.refresh(self.lease)
                except LeaseNotFound:
                    self._lose("etcd says the lease has expired")
                    return
                except CoordinationUnavailable as exc:
                    streak.fail(exc)  # tried again until valid() turns False
                    continue
                streak.ok()
                self._valid_until = max(self._valid_until,
                                        sent + self._ttl_s - self._margin_s)
                if self._lapsed():  # this process was paused while the refresh was out
                    return
        finally:
            gw.close()

    def _next_wait(self, failing: bool) -> float:
        """A third of the TTL between refreshes, a quarter second between tries after a
        failure, and never past the moment valid() turns False (to notice it then)."""
        wait = 0.25 if failing else self._ttl_s / 3
        return max(0.0, min(wait, self._valid_until - self._clock()))

    def _lapsed(self) -> bool:
        if self._clock() < self._valid_until:
            return False
        self._lose("the lease lapsed before a refresh got through")
        return True

    def _lose(self, why: str) -> None:
        """The term is over: say so, and revoke the lease (which etcd may still hold for
        the margin) so that a standby need not wait for it."""
        if self._stop.is_set():
            return  # resigning
        log.warning("member %s is no longer leader (epoch %d): %s", self.member, self.epoch,
                    why)
        self.lost.set()
        gw = self._gateway()
        try:
            gw.revoke_quietly(self.lease)
        finally:
            gw.close()


class Coordinator:
    """One manager's view of the coordination state in etcd (ENDPOINTS, one etcd
    cluster) for CLUSTER; MEMBER is this manager's id.

    ttl_s: the leader lease's TTL (etcd grants whole seconds, at least 2 with its default
    election timeout); margin_s: how long before the TTL runs out valid() turns False
    (default ttl/5, for clock rate differences); poll_s: how long a loop waits before
    trying again after etcd failed it, or while its member may not campaign; watch_s: how
    long a loop waits on a watch before reading again when no event wakes it (a safety
    net for an event missed; STOP ends the wait at once). Every wait on a watch costs etcd
    and this process a new HTTP stream: at 0.5 s, two standbys' loops were a third of an
    idle cluster's CPU beside etcd (docs/benchmarks.md, "Watches that wait long").
    """

    def __init__(self, endpoints: list[str], cluster: str, member: str, *,
                 ttl_s: float = 5.0, clock: Clock = boottime, margin_s: float | None = None,
                 poll_s: float = 0.5, watch_s: float = WATCH_S,
                 request_timeout_s: float | None = None) -> None:
        check_name("member", member)
        self.margin_s = ttl_s / 5 if margin_s is None else margin_s
        if ttl_s <= 0 or not 0 <= self.margin_s < ttl_s:
            raise ConfigError(f"the lease TTL must be positive and the margin shorter, got "
                              f"ttl {ttl_s} s, margin {self.margin_s} s")
        self.endpoints = list(endpoints)
        self.keys = Keys(cluster)
        self.cluster = cluster
        self.member = member
        self.ttl_s = ttl_s
        self.poll_s = poll_s
        self.watch_s = watch_s
        self.clock = clock
        # Short enough that a refresh that hangs is given up on well before the lease.
        self.request_timeout_s = request_timeout_s or min(ttl_s / 3, 5.0)
        self._gateway().close()  # fails now on a malformed endpoint, not in a thread later
        self._local = threading.local()
        self._gateways: list[Gateway] = []
        self._lock = threading.Lock()
        self._session = MemberSession(self._gateway, ttl_s)

    def close(self) -> None:
        """Revoke the member records' lease and close every connection. A Leadership
        won through this Coordinator lives on until resigned or lost."""
        self._session.close(self._gw())
        with self._lock:
            gateways, self._gateways = self._gateways, []
            self._local = threading.local()  # a later call makes a new one
        for gw in gateways:
            gw.close()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _gateway(self) -> Gateway:
        """A Gateway of one's own (for a thread or a watching loop; close it after)."""
        return Gateway(self.endpoints, self.request_timeout_s,
                       watch_timeout=self.watch_s + self.request_timeout_s)

    def _gw(self) -> Gateway:
        """The calling thread's Gateway for one-off requests."""
        gw: Gateway | None = getattr(self._local, "gateway", None)
        if gw is None:
            gw = self._local.gateway = self._gateway()
            with self._lock:
                self._gateways.append(gw)
        return gw

    # -- leadership -----------------------------------------------------------------------

    def campaign(self, address: str, eligible: Callable[[], bool],
                 stop: threading.Event) -> Leadership | None:
        """Block until this member holds the leader key, publishing ADDRESS there, and
        return its Leadership; None once STOP is set. It tries only while ELIGIBLE() is
        true (a member of the in-sync set), asked again before every try; the in-sync
        set's revision read before asking is checked again in the same transaction that
        creates the leader key, so a member dropped from the set meanwhile does not win.
        etcd being unavailable is logged and waited out, never raised."""
        gw = self._gateway()
        streak = FailureStreak(f"member {self.member}: campaign")
        ineligible = False
        try:
            while not stop.is_set():
                try:
                    held, revision, in_sync_revision = self._held(gw)
                    streak.ok()
                    if held:  # wait for the key to go, woken early by a watch
                        gw.wait_change(self.keys.leader, revision, self.watch_s, stop)
                        continue
                    if not eligible():
                        if not ineligible:
                            log.info("member %s is not eligible to lead (not in the "
                                     "in-sync set): not campaigning", self.member)
                        ineligible = True
                        stop.wait(self.poll_s)
                        continue
                    ineligible = False
                    won = self._try_create(gw, address, in_sync_revision)
                except CoordinationUnavailable as exc:
                    streak.fail(exc)
                    stop.wait(self.poll_s)
                    continue
                if won is not None:
                    return won
        finally:
            gw.close()
        return None

    def _held(self, gw: Gateway) -> tuple[bool, int, int]:
        """Whether someone holds the leader key, the store's revision, and the in-sync
        set's mod revision (0 when it is absent), read together."""
        state = gw.read("the leader key", op_range(self.keys.leader),
                        op_range(self.keys.in_sync))
        leader_kvs, in_sync_kvs = state.ranges
        return (bool(leader_kvs), state.revision,
                in_sync_kvs[0].mod_revision if in_sync_kvs else 0)

    def _try_create(self, gw: Gateway, address: str, in_sync_revision: int) -> Leadership | None:
        """One try at the leader key under a new lease: the Leadership, or None (lease
        revoked) when another member got there first or the in-sync set changed."""
        sent = self.clock()
        lease = gw.grant(self.ttl_s)
        value = encode_leader(self.member, address)
        try:
            result = gw.txn("the leader election",
                            [cmp_equal(self.keys.leader, "CREATE", 0),
                             cmp_equal(self.keys.in_sync, "MOD", in_sync_revision)],
                            [op_put(self.keys.leader, value, lease)],
                            [op_range(self.keys.leader)])
        except BaseException:
            gw.revoke_quietly(lease)  # in doubt: revoking is always safe
            raise
        found = result.ranges[0][0] if result.ranges and result.ranges[0] else None
        if result.succeeded:
            epoch = result.revision  # the put's revision: the key's create revision
        elif found is not None and found.lease == lease:
            epoch = found.create_revision  # a retry of a put that had got through
        else:
            gw.revoke_quietly(lease)
            return None
        log.info("member %s is the leader, epoch %d (at %s)", self.member, epoch, address)
        return Leadership(gateway=self._gateway, member=self.member,
                          address=address, epoch=epoch, lease=lease, granted_at=sent,
                          ttl_s=self.ttl_s, margin_s=self.margin_s, clock=self.clock)

    def leader(self) -> LeaderInfo | None:
        """The current leader as etcd has it, or None while there is none."""
        state = self._gw().read("the leader key", op_range(self.keys.leader))
        return decode_leader(state.ranges[0])

    def watch_leader(self, callback: Callable[[LeaderInfo | None], None],
                     stop: threading.Event) -> None:
        """Call CALLBACK with the current leader (or None), then again on every change,
        until STOP is set; for standbys, clients and benefactors that follow the leader.
        While etcd is unavailable nothing is called (the last answer stands)."""
        gw = self._gateway()
        streak = FailureStreak(f"member {self.member}: following the leader")
        last: LeaderInfo | bool | None = False  # False: nothing reported yet
        try:
            while not stop.is_set():
                try:
                    state = gw.read("the leader key", op_range(self.keys.leader))
                    current = decode_leader(state.ranges[0])
                except CoordinationUnavailable as exc:
                    streak.fail(exc)
                    stop.wait(self.poll_s)
                    continue
                streak.ok()
                if current != last:
                    callback(current)
                    last = current
                gw.wait_change(self.keys.leader, state.revision, self.watch_s, stop)
        finally:
            gw.close()

    # -- the in-sync set ------------------------------------------------------------------

    def in_sync(self) -> tuple[set[str], int]:
        """The in-sync set (empty when never written) and its mod revision (0 then), which
        grows with every change."""
        state = self._gw().read("the in-sync set", op_range(self.keys.in_sync))
        if not state.ranges[0]:
            return set(), 0
        kv = state.ranges[0][0]
        return decode_in_sync(kv.value), kv.mod_revision

    def set_in_sync(self, leadership: Leadership, members: Iterable[str]) -> bool:
        """Write the in-sync set as LEADERSHIP's holder: True once etcd has it; False when
        that leadership is over (not valid(), or etcd's leader key has another epoch: a
        deposed leader's write never lands)."""
        if not leadership.valid():
            log.warning("epoch %d is no longer valid: the in-sync set is not written",
                        leadership.epoch)
            return False
        value = encode_in_sync(set(members), leadership.epoch)
        result = self._gw().txn(
            "the in-sync set", [cmp_equal(self.keys.leader, "CREATE", leadership.epoch)],
            [op_put(self.keys.in_sync, value)])
        if not result.succeeded:
            log.warning("epoch %d has been deposed: the in-sync set is not written",
                        leadership.epoch)
        return result.succeeded

    def bootstrap_in_sync(self, members: Iterable[str]) -> bool:
        """Set the in-sync set to MEMBERS if it was never written (a cluster's first
        start); whether it was."""
        value = encode_in_sync(set(members), 0)
        result = self._gw().txn("the in-sync set",
                                [cmp_equal(self.keys.in_sync, "CREATE", 0)],
                                [op_put(self.keys.in_sync, value)])
        return result.succeeded

    # -- member records -------------------------------------------------------------------

    def publish(self, member: str, address: str) -> None:
        """Publish MEMBER's ADDRESS under this process's member lease: the record vanishes
        within the TTL once this process dies. Every call is an etcd write."""
        self._session.put(self._gw(), self.keys.member(member), encode_member(address))

    def members(self) -> dict[str, MemberInfo]:
        """Every member record, by member id."""
        state = self._gw().read("the member records",
                                op_range(self.keys.members, prefix=True))
        found = {}
        for kv in state.ranges[0]:
            name = kv.key[len(self.keys.members):].decode(errors="replace")
            info = decode_member(name, kv)
            if info is not None:
                found[name] = info
        return found
