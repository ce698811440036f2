"""Benefactor registry: registrations are persisted in the metadata store; liveness and the
figures of the latest heartbeat (free space, chunk count) are soft state in memory
(DESIGN §8). A benefactor is alive while its last heartbeat (or registration) is at most one
benefactor lease old. After a manager restart every persisted benefactor is dead until it
sends a heartbeat or registers again.

Placement: W targets chosen round-robin over live benefactors of the pool that have free
space, starting one further along on every call so successive writes start on different
benefactors.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mosafs._proto import benefactor_pb2, common_pb2, manager_pb2, metadata_pb2
from mosafs.errors import InvalidArgument, NoSpace, NotFound
from mosafs.manager.metadata import MetadataStore, check_benefactor_id
from mosafs.manager.pools import DEFAULT_POOL

Clock = Callable[[], float]


def check_address(address: str) -> str:
    """HOST:PORT (HOST may be a bracketed IPv6 address), port 1..65535."""
    host, sep, port = address.rpartition(":")
    bad = not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535
    if bad or any(c.isspace() or c == "/" for c in host) or len(address) > 300:
        raise InvalidArgument(f"bad benefactor address {address[:80]!r}: use HOST:PORT, "
                              f"port 1..65535")
    return address


@dataclass
class _Soft:
    info: benefactor_pb2.BenefactorInfo
    last_seen: float  # clock() of the last heartbeat or registration


class Registry:
    def __init__(self, store: MetadataStore, *, lease_s: float = 5.0,
                 clock: Clock = time.monotonic) -> None:
        self._store = store
        self.lease_s = lease_s
        self._clock = clock
        self._lock = threading.Lock()
        self._soft: dict[str, _Soft] = {}
        self._cursor = 0

    def register(self, info: benefactor_pb2.BenefactorInfo) -> None:
        bid = check_benefactor_id(info.id)
        check_address(info.address)
        pool = info.pool or DEFAULT_POOL
        try:
            self._store.pool(pool)
        except NotFound:
            raise InvalidArgument(f"benefactor {bid}: no pool {pool!r}") from None
        self._store.put_benefactor(bid, metadata_pb2.BenefactorRecord(
            address=info.address, pool=pool, capacity_bytes=info.capacity_bytes,
            free_bytes=info.free_bytes, chunks=info.chunks, registered_ns=time.time_ns()))
        self._remember(info, pool)

    def heartbeat(self, info: benefactor_pb2.BenefactorInfo) -> None:
        """NotFound tells the benefactor to register (again)."""
        bid = check_benefactor_id(info.id)
        rec = self._store.benefactor(bid)
        if rec is None:
            raise NotFound(f"benefactor {bid} is not registered: register first")
        if info.address and info.address != rec.address:
            raise NotFound(f"benefactor {bid} is registered at {rec.address}, not at "
                           f"{info.address}: register again")
        info = _copy(info)
        info.address = rec.address
        self._remember(info, rec.pool)

    def _remember(self, info: benefactor_pb2.BenefactorInfo, pool: str) -> None:
        info = _copy(info)
        info.pool = pool
        with self._lock:
            self._soft[info.id] = _Soft(info, self._clock())

    def is_alive(self, bid: str) -> bool:
        with self._lock:
            soft = self._soft.get(bid)
            return soft is not None and self._fresh(soft)

    def _fresh(self, soft: _Soft) -> bool:
        return self._clock() - soft.last_seen <= self.lease_s

    def live(self, pool: str | None = None) -> list[benefactor_pb2.BenefactorInfo]:
        """Live benefactors (of POOL, if given), by id."""
        with self._lock:
            return [s.info for bid, s in sorted(self._soft.items())
                    if self._fresh(s) and (pool is None or s.info.pool == pool)]

    def pick_targets(self, pool: str, width: int) -> list[common_pb2.BenefactorAddress]:
        """WIDTH (capped at what is available) live benefactors of POOL with free space."""
        with self._lock:
            usable = [s.info for _, s in sorted(self._soft.items())
                      if self._fresh(s) and s.info.pool == pool and s.info.free_bytes > 0]
            if not usable:
                raise NoSpace("no live benefactor with free space")
            start = self._cursor % len(usable)
            self._cursor += 1
        count = min(width, len(usable))
        chosen = (usable[(start + k) % len(usable)] for k in range(count))
        return [common_pb2.BenefactorAddress(id=b.id, address=b.address) for b in chosen]

    def capacity(self) -> tuple[int, int]:
        """(capacity, free) bytes summed over live benefactors."""
        live = self.live()
        return sum(b.capacity_bytes for b in live), sum(b.free_bytes for b in live)

    def alive_among(self, bids: Iterable[str]) -> set[str]:
        """The ids of BIDS that are alive (one lock for the whole set)."""
        with self._lock:
            return {bid for bid in bids
                    if (soft := self._soft.get(bid)) is not None and self._fresh(soft)}

    def statuses(self) -> list[manager_pb2.BenefactorStatus]:
        """Every registered benefactor; last_heartbeat_age_ms -1: none since this start."""
        records = self._store.benefactors()
        now = self._clock()
        out = []
        with self._lock:
            for bid, rec in sorted(records.items()):
                soft = self._soft.get(bid)
                if soft is None:
                    info = benefactor_pb2.BenefactorInfo(
                        id=bid, address=rec.address, capacity_bytes=rec.capacity_bytes,
                        free_bytes=rec.free_bytes, chunks=rec.chunks, pool=rec.pool)
                    out.append(manager_pb2.BenefactorStatus(
                        info=info, alive=False, last_heartbeat_age_ms=-1))
                else:
                    out.append(manager_pb2.BenefactorStatus(
                        info=soft.info, alive=self._fresh(soft),
                        last_heartbeat_age_ms=int((now - soft.last_seen) * 1000)))
        return out


def _copy(info: benefactor_pb2.BenefactorInfo) -> benefactor_pb2.BenefactorInfo:
    out = benefactor_pb2.BenefactorInfo()
    out.CopyFrom(info)
    return out
