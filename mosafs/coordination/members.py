"""Member records: each manager's address and how far it has applied the log, under a
lease of its process, so that the record of a manager that died vanishes by itself
within the lease's TTL. `mosafs status` reads them to show each standby and its lag.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from mosafs.coordination.gateway import (
    CoordinationUnavailable,
    FailureStreak,
    Gateway,
    LeaseNotFound,
    op_put,
)

log = logging.getLogger("mosafs.coordination")


class MemberSession:
    """The lease this process's member records live under, and the thread that keeps it
    alive (every ttl/3). When etcd has let the lease expire (the process was paused, or
    etcd was away longer than the TTL), a new one is granted and every record put again:
    a record is gone only while its process cannot reach etcd."""

    def __init__(self, gateway: Callable[[], Gateway], ttl_s: float) -> None:
        self._new_gateway = gateway
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._records: dict[bytes, bytes] = {}
        self._lease = 0
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def put(self, gw: Gateway, key: bytes, value: bytes) -> None:
        """Put KEY under the session's lease (granted on the first put), through GW (the
        caller's thread's)."""
        with self._lock:
            self._records[key] = value
            if not self._lease:
                self._grant(gw)
                return
            lease = self._lease
        try:
            gw.txn("a member record", [], [op_put(key, value, lease)])
        except LeaseNotFound:
            self._renew(gw, stale=lease)

    def close(self, gw: Gateway) -> None:
        """Stop refreshing and revoke the lease: the records go at once."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            lease, self._lease = self._lease, 0
        if lease:
            try:
                gw.revoke(lease)
            except CoordinationUnavailable as exc:
                log.info("member records stay until their lease lapses: %s", exc)

    # -- the lease ------------------------------------------------------------------------

    def _grant(self, gw: Gateway) -> None:
        """A new lease with every record on it (holding the lock)."""
        lease = gw.grant(self._ttl_s)
        try:
            gw.txn("the member records", [],
                   [op_put(key, value, lease) for key, value in self._records.items()])
        except BaseException:
            gw.revoke_quietly(lease)
            raise
        self._lease = lease
        if self._thread is None:
            self._thread = threading.Thread(target=self._keepalive, daemon=True,
                                            name="mosafs-member-lease")
            self._thread.start()

    def _renew(self, gw: Gateway, stale: int) -> None:
        with self._lock:
            if self._lease != stale or self._closed.is_set():
                return  # renewed meanwhile by the other thread, or closing
            log.info("member lease %x expired in etcd; publishing the records again", stale)
            self._lease = 0
            self._grant(gw)

    def _keepalive(self) -> None:
        gw = self._new_gateway()
        streak = FailureStreak("cannot refresh the member lease")
        try:
            while not self._closed.wait(0.25 if streak.failing else self._ttl_s / 3):
                with self._lock:
                    lease = self._lease
                try:
                    self._refresh(gw, lease)
                except CoordinationUnavailable as exc:
                    streak.fail(exc)
                    continue
                streak.ok()
        finally:
            gw.close()

    def _refresh(self, gw: Gateway, lease: int) -> None:
        if not lease:
            return
        try:
            gw.refresh(lease)
        except LeaseNotFound:
            self._renew(gw, stale=lease)
