"""Write leases: the manager's record of open write sessions (DESIGN §4), in memory only.

A lease names the file being written and the version the write dedupes against. The client
renews it before its TTL runs out; CommitVersion consumes it. A manager restart forgets every
lease: the client's commit then fails with LeaseExpired and nothing half-written is visible.

A commit is idempotent per lease: the table remembers what each lease's commit stored (for
one TTL), so a CommitVersion sent again with the same lease and block-map (the client never
got the reply: a deadline, a dropped connection) gets the version the first one stored
instead of a second, identical version. A repeat that arrives while the first is still
being stored waits for it.
Lease ids start at the manager's start time in microseconds so that ids handed out before a
restart are not handed out again after it.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mosafs._proto import manager_pb2
from mosafs.errors import LeaseExpired, Unavailable

Clock = Callable[[], float]
# How long a repeated commit waits for the first one of its lease to be stored (less than a
# client's default deadline, so that the client gets an answer, not a deadline).
COMMIT_WAIT_S = 10.0


def content_key(chunks: Iterable[tuple[bytes, int]]) -> bytes:
    """A digest of a block-map: tells a repeat of a commit from a different one."""
    digest = hashlib.blake2b(digest_size=16)
    for cid, length in chunks:
        digest.update(cid)
        digest.update(length.to_bytes(8, "little"))
    return digest.digest()


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
    content: bytes = b""  # content_key of the block-map being committed


@dataclass(frozen=True)
class Committed:
    """What the commit of a lease stored: the answer to a repeat of that commit."""

    inode: int
    content: bytes  # content_key of the block-map stored
    version: int
    attr: manager_pb2.Attr
    expires: float  # clock() time: forgotten after this


class LeaseTable:
    def __init__(self, ttl_s: float = 60.0, *, clock: Clock = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._leases: dict[int, WriteLease] = {}
        self._committed: dict[int, Committed] = {}
        self._settled = threading.Condition(self._lock)  # a commit finished or failed
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

    def claim(self, lease_id: int, inode: int, content: bytes = b"", *,
              wait_s: float = COMMIT_WAIT_S) -> WriteLease | Committed:
        """Mark lease LEASE_ID of INODE as committing block-map CONTENT (a content_key);
        `finish` records what the commit stored, `restore` makes the lease usable again if
        it fails, so a client can correct its request and retry. Garbage collection still
        sees the lease until it is finished (its chunks are not referenced before the
        commit's transaction).

        A repeat of a commit that was stored returns its Committed record: the caller
        answers with that version and stores nothing. A repeat that arrives while the
        first is being stored waits up to WAIT_S for it (then Unavailable: the outcome is
        not known yet). A commit of other content on a lease that committed already is
        refused (LeaseExpired): one lease, one version."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            while True:
                done = self._committed.get(lease_id)
                if done is not None:
                    return self._repeat(lease_id, done, inode, content)
                lease = self._live(lease_id)
                if lease.inode != inode:
                    raise LeaseExpired(f"write lease {lease_id} is for inode {lease.inode}, "
                                       f"not {inode}")
                if not lease.committing:
                    lease.committing = True
                    lease.content = content
                    return lease
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Unavailable(
                        f"write lease {lease_id} is being committed by an earlier request "
                        f"that has not finished after {wait_s:g} s: send the commit again "
                        f"to learn its outcome")
                self._settled.wait(left)

    @staticmethod
    def _repeat(lease_id: int, done: Committed, inode: int, content: bytes) -> Committed:
        if done.inode != inode:
            raise LeaseExpired(f"write lease {lease_id} is for inode {done.inode}, not {inode}")
        if done.content != content:
            raise LeaseExpired(f"write lease {lease_id} was committed already (version "
                               f"{done.version}) with other content: a lease commits one "
                               f"version; open the file for writing again")
        return done

    def restore(self, lease: WriteLease) -> None:
        with self._lock:
            lease.committing = False
            self._leases[lease.id] = lease
            self._settled.notify_all()

    def finish(self, lease: WriteLease, version: int = 0,
               attr: manager_pb2.Attr | None = None) -> None:
        """LEASE's commit stored VERSION: the lease is used up; a repeat of the commit is
        answered with VERSION and ATTR for one TTL."""
        with self._lock:
            self._leases.pop(lease.id, None)
            if version:
                self._committed[lease.id] = Committed(
                    lease.inode, lease.content, version, attr or manager_pb2.Attr(),
                    self._clock() + self.ttl_s)
            self._settled.notify_all()

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
        """The client is done with LEASE_ID. A lease being committed stays until its
        commit finishes (garbage collection must keep seeing it until then)."""
        with self._lock:
            self._committed.pop(lease_id, None)
            lease = self._leases.get(lease_id)
            if lease is not None and not lease.committing:
                del self._leases[lease_id]

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)

    def _live(self, lease_id: int) -> WriteLease:
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseExpired(f"write lease {lease_id} is unknown (committed, aborted, "
                               f"expired, or the manager restarted): write the file again")
        if self._clock() > lease.expires and not lease.committing:
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
        for lease_id in [i for i, lease in self._leases.items()
                         if now > lease.expires and not lease.committing]:
            del self._leases[lease_id]
        for lease_id in [i for i, done in self._committed.items() if now > done.expires]:
            del self._committed[lease_id]
