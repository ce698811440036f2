"""Benefactor registry: registrations are persisted in the metadata store; liveness and the
figures of the latest heartbeat (free space, chunk count) are soft state in memory
(DESIGN §8). A benefactor is alive while its last heartbeat (or registration) is at most one
benefactor lease old. After a manager restart every persisted benefactor is dead until it
sends a heartbeat or registers again.

Placement: W targets chosen round-robin over live benefactors of the pool that have free
space and are not draining, starting one further along on every call so successive writes
start on different benefactors.

Pool membership and draining are persisted (BenefactorRecord) and mirrored here: a
benefactor registering without naming a pool stays in the pool it is in (an administrator
may have moved it); one that names a pool joins it.

Right after a manager start no benefactor has sent a heartbeat yet. Every registered one
is *presumed* alive for one lease: its copies count towards R (so nothing is copied only
because the manager has not heard from it yet), but it is neither a source nor a target
until it is heard from. One that stays silent for that lease is dead like any other, and
replication starts at once on what it held: there is no blind period after a start.

A benefactor is *full* when it reports less than FULL_BELOW_BYTES free, or when a copy to
it failed for lack of space (until its next heartbeat says otherwise): it is then no
target for writes or copies. A benefactor a copy could not reach is *avoided* as a source
and target for one lease (its heartbeats may still arrive over the manager's channel).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mosafs import metrics
from mosafs._proto import benefactor_pb2, common_pb2, manager_pb2, metadata_pb2
from mosafs.addresses import port_of
from mosafs.errors import FailedPrecondition, InvalidArgument, NoSpace, NotFound, Unavailable
from mosafs.manager.metadata import MetadataStore, check_benefactor_id, check_certificate

Clock = Callable[[], float]
MiB = 1 << 20
# Below this much free space a benefactor takes no new chunks: the largest default chunk
# (4 MiB) with room for the puts in flight when it was last heard from.
FULL_BELOW_BYTES = 16 * MiB
MAX_BYTES = (1 << 64) - 1  # a uint64 of the protocol


def check_address(address: str) -> str:
    """HOST:PORT (HOST may be a bracketed IPv6 address), port 1..65535."""
    host, sep, port = address.rpartition(":")
    bad = not sep or not host or not port_of(port)  # 0 included
    if bad or any(c.isspace() or c == "/" for c in host) or len(address) > 300:
        raise InvalidArgument(f"bad benefactor address {address[:80]!r}: use HOST:PORT, "
                              f"port 1..65535")
    return address


@dataclass
class _Soft:
    info: benefactor_pb2.BenefactorInfo
    last_seen: float  # clock() of the last heartbeat or registration
    draining: bool = False
    heard: bool = True  # False: presumed alive since the manager's start, never heard from
    avoid_until: float = 0.0  # clock() until which copies neither read from nor go to it
    # SHA-256 of the certificate it last spoke with (b"" on plaintext): the holder of the
    # read tokens it needs to read fragments from its peers (a repair, a conversion)
    fingerprint: bytes = b""

    def takes(self, need: int = 0) -> bool:
        """Whether new chunks (NEED more bytes) may go here, space-wise."""
        return self.info.free_bytes >= FULL_BELOW_BYTES + need


class Registry:
    def __init__(self, store: MetadataStore, *, lease_s: float = 5.0,
                 clock: Clock = time.monotonic) -> None:
        self._store = store
        self.lease_s = lease_s
        self._clock = clock
        self._lock = threading.Lock()
        self._soft: dict[str, _Soft] = {}
        self._cursor = 0
        now = clock()
        for bid, rec in store.benefactors().items():
            self._soft[bid] = _Soft(_info(bid, rec), now, rec.draining, heard=False)

    def register(self, info: benefactor_pb2.BenefactorInfo, certificate: str = "",
                 fingerprint: bytes = b"") -> None:
        """CERTIFICATE: the caller's certificate name, which the id stays bound to;
        FINGERPRINT: its SHA-256 (tokens for the benefactor's own reads are issued to it)."""
        bid = check_benefactor_id(info.id)
        check_address(info.address)
        rec = self._store.register_benefactor(
            bid, info.address, info.pool, info.capacity_bytes, info.free_bytes, info.chunks,
            certificate)
        self._remember(info, rec, fingerprint)

    def vouch(self, bid: str, certificate: str) -> None:
        """AccessDenied unless CERTIFICATE may speak for benefactor BID (the one that
        registered it; "" on plaintext clusters)."""
        check_certificate(check_benefactor_id(bid), self._store.benefactor(bid), certificate)

    def heartbeat(self, info: benefactor_pb2.BenefactorInfo, certificate: str = "",
                  fingerprint: bytes = b"") -> None:
        """NotFound tells the benefactor to register (again)."""
        bid = check_benefactor_id(info.id)
        rec = self._store.benefactor(bid)
        if rec is None:
            raise NotFound(f"benefactor {bid} is not registered: register first")
        check_certificate(bid, rec, certificate)
        if info.address and info.address != rec.address:
            raise NotFound(f"benefactor {bid} is registered at {rec.address}, not at "
                           f"{info.address}: register again")
        info = _copy(info)
        info.address = rec.address
        self._remember(info, rec, fingerprint)

    def _remember(self, info: benefactor_pb2.BenefactorInfo,
                  rec: metadata_pb2.BenefactorRecord, fingerprint: bytes) -> None:
        info = _copy(info)
        info.pool = rec.pool
        with self._lock:
            before = self._soft.get(info.id)
            self._soft[info.id] = _Soft(info, self._clock(), rec.draining,
                                        avoid_until=before.avoid_until if before else 0.0,
                                        fingerprint=fingerprint)

    def fingerprint(self, bid: str) -> bytes:
        """The certificate fingerprint BID last spoke with (b"": plaintext, or not heard
        from since this start)."""
        with self._lock:
            soft = self._soft.get(bid)
            return soft.fingerprint if soft is not None else b""

    # --- administration -------------------------------------------------------------------

    def update(self, bid: str, *, pool: str | None = None,
               draining: bool | None = None) -> metadata_pb2.BenefactorRecord:
        """Move BID to POOL and/or start or stop draining it (persisted, then mirrored)."""
        rec = self._store.update_benefactor(bid, pool=pool, draining=draining)
        with self._lock:
            soft = self._soft.get(bid)
            if soft is not None:
                soft.info.pool = rec.pool
                soft.draining = rec.draining
        return rec

    def remove(self, bid: str) -> int:
        """Forget a stopped benefactor (registration and locations); a live one is refused:
        it would register again at its next heartbeat. Returns how many chunk records
        named it."""
        if self.is_alive(bid):
            raise FailedPrecondition(f"benefactor {bid} is alive: stop its process first "
                                     f"(`mosafs benefactor drain` moves its chunks off before)")
        named = self._store.remove_benefactor(bid)
        with self._lock:
            self._soft.pop(bid, None)
        return named

    def draining(self) -> set[str]:
        """Ids of the draining benefactors (registered records; alive or not)."""
        return {bid for bid, rec in self._store.benefactors().items() if rec.draining}

    def is_alive(self, bid: str) -> bool:
        with self._lock:
            soft = self._soft.get(bid)
            return soft is not None and self._alive(soft)

    def _fresh(self, soft: _Soft) -> bool:
        return self._clock() - soft.last_seen <= self.lease_s

    def _alive(self, soft: _Soft) -> bool:
        return soft.heard and self._fresh(soft)

    def live(self, pool: str | None = None, *,
             accepting: bool = False) -> list[benefactor_pb2.BenefactorInfo]:
        """Live benefactors (of POOL, if given; only those not draining if ACCEPTING), by
        id."""
        with self._lock:
            return [s.info for bid, s in sorted(self._soft.items())
                    if self._alive(s) and (pool is None or s.info.pool == pool)
                    and not (accepting and s.draining)]

    def until_lapse(self) -> float | None:
        """Seconds until the first lease of a benefactor now alive or presumed alive
        lapses, so that a death is acted on when it happens, not at the next tick (0: one
        has just lapsed); None: no lease runs."""
        with self._lock:
            first = min((s.last_seen for s in self._soft.values() if self._fresh(s)),
                        default=None)
        return None if first is None else max(0.0, first + self.lease_s - self._clock())

    def presumed(self) -> set[str]:
        """Benefactors presumed alive: registered, not heard from since this start, and
        the first lease is not over."""
        with self._lock:
            return {bid for bid, s in self._soft.items() if not s.heard and self._fresh(s)}

    def usable(self) -> dict[str, benefactor_pb2.BenefactorInfo]:
        """Live benefactors that copies may read from and go to (not avoided), by id."""
        now = self._clock()
        with self._lock:
            return {bid: s.info for bid, s in self._soft.items()
                    if self._alive(s) and s.avoid_until <= now}

    def takes(self, bid: str, need: int = 0) -> bool:
        """Whether BID has room for NEED more bytes of new chunks."""
        with self._lock:
            soft = self._soft.get(bid)
            return soft is not None and soft.takes(need)

    def mark_full(self, bid: str) -> None:
        """A put or copy to BID failed for lack of space: no target until it reports room
        again in a heartbeat."""
        with self._lock:
            soft = self._soft.get(bid)
            if soft is not None:
                soft.info.free_bytes = 0

    def target_problem(self, bid: str, problem: str) -> None:
        """A copy's or a rebuild's put to BID stopped on PROBLEM, as the benefactor that
        put reported it ("" none): "full" makes it no target until it reports room, and
        "unreachable" or "failed" (any other refusal: a failing disk) until a lease has
        passed, so that the next try goes elsewhere."""
        if not problem:
            return
        metrics.MANAGER_REPLICATION_FAILURES.labels(f"target-{problem}").inc()
        if problem == "full":
            self.mark_full(bid)
        else:
            self.avoid(bid)

    def avoid(self, bid: str) -> None:
        """A copy could not reach BID: neither source nor target for one lease."""
        with self._lock:
            soft = self._soft.get(bid)
            if soft is not None:
                soft.avoid_until = self._clock() + self.lease_s

    def pick_targets(self, pool: str, width: int) -> list[common_pb2.BenefactorAddress]:
        """WIDTH (capped at what is available) live benefactors of POOL with free space
        that are not draining.

        NoSpace where waiting changes nothing, so that a write fails at once with ENOSPC
        and the reason: POOL has no benefactor while others are registered, every one of
        it is draining, or every live one is full. Unavailable (clients retry) where its
        benefactors are registered but none is live: a restart, a paused manager, or a
        cluster whose first benefactors have not registered yet."""
        with self._lock:
            members = [s for _, s in sorted(self._soft.items()) if s.info.pool == pool]
            live = [s for s in members if self._alive(s) and not s.draining]
            usable = [s.info for s in live if s.takes()]
            if not members and self._soft:
                raise NoSpace(f"pool {pool!r} has no benefactors: move one into it (`mosafs "
                              f"benefactor move ID {pool}`) or assign the folder to another "
                              f"pool (`mosafs pool assign FOLDER POOL`)")
            if members and all(s.draining for s in members):
                raise NoSpace(f"every benefactor of pool {pool!r} is draining: cancel a drain "
                              f"(`mosafs benefactor drain ID --cancel`) or move one into it "
                              f"(`mosafs benefactor move ID {pool}`)")
            if not live:
                raise Unavailable(f"no live benefactor in pool {pool!r} takes new chunks")
            if not usable:
                raise NoSpace(f"pool {pool!r} is full: none of its {len(live)} live "
                              f"benefactors has {FULL_BELOW_BYTES // MiB} MiB free")
            start = self._cursor % len(usable)
            self._cursor += 1
        count = min(width, len(usable))
        chosen = (usable[(start + k) % len(usable)] for k in range(count))
        return [common_pb2.BenefactorAddress(id=b.id, address=b.address) for b in chosen]

    def capacity(self) -> tuple[int, int]:
        """(capacity, free) bytes summed over live benefactors, each at most 2**64-1 (what
        StatFs carries: every benefactor states its own figures, up to 2**64-1 each)."""
        live = self.live()
        return (min(sum(b.capacity_bytes for b in live), MAX_BYTES),
                min(sum(b.free_bytes for b in live), MAX_BYTES))

    def alive_among(self, bids: Iterable[str]) -> set[str]:
        """The ids of BIDS that are alive (one lock for the whole set)."""
        with self._lock:
            return {bid for bid in bids
                    if (soft := self._soft.get(bid)) is not None and self._alive(soft)}

    def statuses(self) -> list[manager_pb2.BenefactorStatus]:
        """Every registered benefactor; last_heartbeat_age_ms -1: none since this start."""
        records = self._store.benefactors()
        now = self._clock()
        out = []
        with self._lock:
            for bid, rec in sorted(records.items()):
                soft = self._soft.get(bid)
                if soft is None or not soft.heard:
                    out.append(manager_pb2.BenefactorStatus(
                        info=_info(bid, rec), alive=False, last_heartbeat_age_ms=-1,
                        draining=rec.draining))
                else:
                    out.append(manager_pb2.BenefactorStatus(
                        info=soft.info, alive=self._alive(soft),
                        last_heartbeat_age_ms=int((now - soft.last_seen) * 1000),
                        draining=rec.draining, full=not soft.takes()))
        return out


def _info(bid: str, rec: metadata_pb2.BenefactorRecord) -> benefactor_pb2.BenefactorInfo:
    """What the persisted record says of BID (its last figures before this start)."""
    return benefactor_pb2.BenefactorInfo(
        id=bid, address=rec.address, capacity_bytes=rec.capacity_bytes,
        free_bytes=rec.free_bytes, chunks=rec.chunks, pool=rec.pool)


def _copy(info: benefactor_pb2.BenefactorInfo) -> benefactor_pb2.BenefactorInfo:
    out = benefactor_pb2.BenefactorInfo()
    out.CopyFrom(info)
    return out
