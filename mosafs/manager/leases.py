"""Write leases: the manager's record of open write sessions (DESIGN §4), in memory only.

A lease names the file being written and the version the write dedupes against. The client
renews it before its TTL runs out; CommitVersion consumes it. A manager restart forgets every
lease: the client's commit then fails with LeaseExpired and nothing half-written is visible.
Lease ids start at the manager's start time in microseconds so that ids handed out before a
restart are not handed out again after it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mosafs.errors import LeaseExpired

Clock = Callable[[], float]


@dataclass
class WriteLease:
    id: int
    inode: int
    client_id: str
    base_inode: int
    base_version: int
    expires: float  # clock() time
    opened_ns: int = 0  # wall clock of the open (garbage collection compares it)
    committing: bool = False  # claimed by a commit in progress
    pool: str = ""  # the pool new chunks go to (their records keep it)
    folder: int = 0  # the file's folder (pruned after the commit); 0: none known


class LeaseTable:
    def __init__(self, ttl_s: float = 60.0, *, clock: Clock = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._leases: dict[int, WriteLease] = {}
        self._ids = itertools.count(time.time_ns() // 1000)
        self._next_sweep = 0.0

    @property
    def ttl_ms(self) -> int:
        return int(self.ttl_s * 1000)

    def open(self, inode: int, client_id: str, *, base_inode: int, base_version: int,
             pool: str = "", folder: int = 0) -> WriteLease:
        with self._lock:
            self._sweep()
            lease = WriteLease(next(self._ids), inode, client_id, base_inode, base_version,
                               self._clock() + self.ttl_s, time.time_ns(), pool=pool,
                               folder=folder)
            self._leases[lease.id] = lease
            return lease

    def renew(self, lease_id: int) -> None:
        with self._lock:
            lease = self._live(lease_id)
            lease.expires = self._clock() + self.ttl_s

    def claim(self, lease_id: int, inode: int) -> WriteLease:
        """Mark lease LEASE_ID of INODE as committing; `finish` removes it once the commit
        is stored, `restore` makes it usable again if the commit fails, so a client can
        correct its request and retry. A second commit on a committing lease fails instead
        of adding a second version; garbage collection still sees the lease until it is
        finished (its chunks are not referenced before the commit's transaction)."""
        with self._lock:
            lease = self._live(lease_id)
            if lease.inode != inode:
                raise LeaseExpired(f"write lease {lease_id} is for inode {lease.inode}, "
                                   f"not {inode}")
            if lease.committing:
                raise LeaseExpired(f"write lease {lease_id} is being committed already")
            lease.committing = True
            return lease

    def restore(self, lease: WriteLease) -> None:
        with self._lock:
            lease.committing = False
            self._leases[lease.id] = lease

    def finish(self, lease: WriteLease) -> None:
        with self._lock:
            self._leases.pop(lease.id, None)

    def oldest_opened_ns(self) -> int | None:
        """Wall clock of the oldest open of a lease still open (or committing)."""
        with self._lock:
            return min((lease.opened_ns for lease in self._leases.values()), default=None)

    def inodes(self) -> frozenset[int]:
        """Files with a write open (or committing): pruning leaves them alone."""
        with self._lock:
            now = self._clock()
            return frozenset(lease.inode for lease in self._leases.values()
                             if lease.committing or now <= lease.expires)

    def abort(self, lease_id: int) -> None:
        with self._lock:
            self._leases.pop(lease_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)

    def _live(self, lease_id: int) -> WriteLease:
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseExpired(f"write lease {lease_id} is unknown (committed, aborted, "
                               f"expired, or the manager restarted): write the file again")
        if self._clock() > lease.expires:
            del self._leases[lease_id]
            raise LeaseExpired(f"write lease {lease_id} expired: it was not renewed within "
                               f"{self.ttl_s:g} s; write the file again")
        return lease

    def _sweep(self) -> None:
        """Forget expired leases of clients that went away (called under the lock; at most
        once a second, so that a burst of opens does not scan the table every time)."""
        now = self._clock()
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        for lease_id in [i for i, lease in self._leases.items() if now > lease.expires]:
            del self._leases[lease_id]
