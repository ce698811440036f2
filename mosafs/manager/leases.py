"""Write leases: the manager's record of open write sessions (DESIGN §4), in memory only.

A lease names the file being written and the version the write dedupes against. The client
renews it before its TTL runs out; CommitVersion consumes it. A manager restart forgets every
lease: the client's commit then fails with LeaseExpired and nothing half-written is visible.

A commit is idempotent per lease: the table remembers what each lease's commit stored (for
one TTL), so a CommitVersion sent again with the same lease and block-map (the client never
got the reply: a deadline, a dropped connection) gets the version the first one stored
instead of a second, identical version. A repeat that arrives while the first is still
being stored waits for it.
A lease belongs to the certificate that opened it (its SHA-256 fingerprint, `holder`; b""
on plaintext, which has no identities): renewing, committing or aborting it with another
certificate is refused (AccessDenied), so that a client that may not write a file cannot
commit a version of it, take its write token or end its session through another client's
lease. The uid a request acts as is not part of the binding: a certificate may act as any
uid its capability allows, so it is the boundary, and a mount renews its leases as the
certificate's own identity and commits as the process that closes the file last.
Lease ids are random 64-bit numbers, so that no one can guess another client's, nor is one
handed out before a restart likely to be handed out again after it; nothing relies on their
order (garbage collection goes by `opened_ns`).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mosafs import metrics
from mosafs._proto import manager_pb2
from mosafs.errors import AccessDenied, LeaseExpired, Unavailable

audit = logging.getLogger("mosafs.audit")

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
    holder: bytes = b""  # fingerprint of the certificate that opened it (b"": plaintext)


@dataclass(frozen=True)
class Committed:
    """What the commit of a lease stored: the answer to a repeat of that commit."""

    inode: int
    content: bytes  # content_key of the block-map stored
    version: int
    attr: manager_pb2.Attr
    expires: float  # clock() time: forgotten after this
    holder: bytes = b""  # the lease's holder: only it is answered


class LeaseTable:
    def __init__(self, ttl_s: float = 60.0, *, clock: Clock = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._leases: dict[int, WriteLease] = {}
        self._committed: dict[int, Committed] = {}
        self._settled = threading.Condition(self._lock)  # a commit finished or failed
        self._next_sweep = 0.0

    @property
    def ttl_ms(self) -> int:
        return int(self.ttl_s * 1000)

    def open(self, inode: int, client_id: str, *, base_inode: int, base_version: int,
             pool: str = "", folder: int = 0, holder: bytes = b"") -> WriteLease:
        """A new lease of INODE for the certificate whose fingerprint is HOLDER."""
        with self._lock:
            self._sweep()
            lease = WriteLease(self._new_id(), inode, client_id, base_inode, base_version,
                               self._clock() + self.ttl_s, time.time_ns(), pool=pool,
                               folder=folder, holder=holder)
            self._leases[lease.id] = lease
            return lease

    def _new_id(self) -> int:
        """A random lease id, not 0 (proto3's "none") and not in use (called under the
        lock)."""
        while True:
            lease_id = secrets.randbits(64)
            if lease_id and lease_id not in self._leases and lease_id not in self._committed:
                return lease_id

    def renew(self, lease_id: int, holder: bytes = b"") -> None:
        with self._lock:
            lease = self._live(lease_id, holder, "RenewLease")
            lease.expires = self._clock() + self.ttl_s

    def claim(self, lease_id: int, inode: int, content: bytes = b"", *, holder: bytes = b"",
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
        refused (LeaseExpired): one lease, one version. A lease opened by a certificate
        other than HOLDER's is refused (AccessDenied), its repeats too."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            while True:
                done = self._committed.get(lease_id)
                if done is not None:
                    _check_holder(lease_id, done.holder, holder, "CommitVersion")
                    return self._repeat(lease_id, done, inode, content)
                lease = self._live(lease_id, holder, "CommitVersion")
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
                    self._clock() + self.ttl_s, lease.holder)
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

    def abort(self, lease_id: int, holder: bytes = b"") -> None:
        """The client is done with LEASE_ID (HOLDER's: AccessDenied for another
        certificate's, which it may not end). A lease being committed stays until its
        commit finishes (garbage collection must keep seeing it until then)."""
        with self._lock:
            done = self._committed.get(lease_id)
            lease = self._leases.get(lease_id)
            for known in (done, lease):
                if known is not None:
                    _check_holder(lease_id, known.holder, holder, "AbortWrite")
            self._committed.pop(lease_id, None)
            if lease is not None and not lease.committing:
                del self._leases[lease_id]

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)

    def _live(self, lease_id: int, holder: bytes, what: str) -> WriteLease:
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseExpired(f"write lease {lease_id} is unknown (committed, aborted, "
                               f"expired, or the manager restarted): write the file again")
        _check_holder(lease_id, lease.holder, holder, what)
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


def _check_holder(lease_id: int, owner: bytes, holder: bytes, what: str) -> None:
    """AccessDenied (logged and counted as the manager's other refusals are) unless HOLDER,
    the caller's certificate, is OWNER, the one that opened lease LEASE_ID."""
    if holder == owner:
        return
    metrics.REFUSALS.labels("capability").inc()
    audit.info("refused %s to certificate %s: write lease %d is another certificate's",
               what, holder.hex()[:16] or "(plaintext)", lease_id)
    raise AccessDenied(f"{what}: write lease {lease_id} was opened by another certificate; "
                       f"a lease is used only by the certificate that opened it")
