"""A write session's lease (DESIGN §4, docs/client.md): taking it, renewing it while the
session lives, and what losing it means for the chunks stored under it.

`WriteSession` (mosafs.client.files.writer) holds the state; this mixin holds the lease's
part of the behaviour, so that the session's module keeps to its content and commits.
Every method runs under the session's lock, as the session's own do.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from mosafs import errors
from mosafs._proto import manager_pb2 as mpb

if TYPE_CHECKING:
    from mosafs.client.files.context import ClientContext
    from mosafs.client.files.pipeline import Pipeline, Stored
    from mosafs.client.files.remote import RemotePipeline

log = logging.getLogger(__name__)


class LeaseHolder:
    """The lease half of a write session (attributes set by WriteSession.__init__)."""

    ctx: ClientContext
    inode: int
    lease: mpb.OpenWriteResponse | None
    write_token: bytes
    stored: Stored
    existed: bool
    orphaned: bool
    in_doubt: bool
    lost: errors.MosafsError | None
    _leased: trio.Event
    _renewing: bool
    _renewals: trio.CancelScope
    _remotes: list[RemotePipeline]
    _base_ids: set[bytes]
    _pipeline: Pipeline | RemotePipeline | None
    _spill: object

    async def _acquire_lease(self) -> None:
        if self.orphaned:
            return
        try:
            lease = await self._open_write()
        except errors.NoSpace as exc:
            # The application sees only ENOSPC: the manager's reason (which pool, what to
            # do) goes to the mount's log.
            log.warning("cannot write inode %d: %s", self.inode, exc)
            raise
        except errors.NotFound:
            if not self.existed:
                raise  # never existed as far as this session knows
            # Unlinked while open: edits stay local (SPILL) and die with the last close.
            log.debug("inode %d was unlinked while open for writing", self.inode)
            self.orphaned = True
            return
        if not lease.targets:
            await self.ctx.manager.abort_write(lease.lease_id)
            raise errors.NoSpace("no live benefactor with free space")
        self.lease = lease
        self.existed = True
        self._leased.set()
        if not self._renewing:
            # Started with the first lease, not with the session: a file created and
            # closed unwritten never needs one (a task fewer per create, docs/benchmarks.md).
            self._renewing = True
            self.ctx.spawn(self._renew_leases)
        self.write_token = lease.write_token
        if self.ctx.config.dedupe_with_base:
            self._base_ids = {c.id for c in lease.base_chunks} - self.stored.ids
            self.stored.ids.update(self._base_ids)

    async def _open_write(self) -> mpb.OpenWriteResponse:
        """OpenWrite, retried with backoff for up to the manager timeout while no benefactor
        is live (the manager or the benefactors are coming back)."""
        deadline = trio.current_time() + self.ctx.config.manager_timeout
        delay = 0.1
        while True:
            try:
                return await self.ctx.manager.open_write(self.inode, self.ctx.client_id)
            except errors.Unavailable:
                if trio.current_time() + delay > deadline:
                    raise
                await trio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _renew_leases(self) -> None:
        with self._renewals:
            while True:
                if self.lease is None:
                    # Until the next edit takes one (a new file's first write, the edit
                    # after a commit used the last one up): renewals start with it.
                    self._leased = trio.Event()
                    await self._leased.wait()
                ttl = (self.lease.lease_ttl_ms if self.lease else 60_000) / 1000
                await trio.sleep(max(ttl / 3, 0.05))
                lease = self.lease
                if lease is None:
                    continue
                try:
                    token = await self.ctx.manager.renew_lease(lease.lease_id)
                    if token and self.lease is lease:
                        await self._new_token(token)
                except errors.LeaseExpired:
                    self._renewal_refused(lease)
                except errors.MosafsError as exc:
                    log.warning("cannot renew the write lease of inode %d: %s", self.inode, exc)

    async def _new_token(self, token: bytes) -> None:
        """A renewal's write token: local pipelines read it at every put; the workers that
        run this session's streams are sent it."""
        self.write_token = token
        self._remotes = [r for r in self._remotes if not r.finished]
        for remote in self._remotes:
            await remote.send_token(token)

    def _renewal_refused(self, lease: mpb.OpenWriteResponse) -> None:
        """The manager no longer knows LEASE. A commit may have used it up while the renewal
        was on its way (then a newer lease may be in place already), or a commit in doubt
        may have stored it: both are no news. Otherwise it expired."""
        if self.lease is not lease:
            return
        if self.in_doubt:
            log.debug("write lease of inode %d is gone after a commit in doubt; the next "
                      "commit learns whether it was stored", self.inode)
            return
        log.warning("write lease of inode %d expired; a new one is taken at commit", self.inode)
        self._lease_lost()

    def _lease_lost(self) -> None:
        """The manager no longer knows this session's lease (it restarted, or the lease
        lived out its TTL), and it was not used up by a commit. The chunks stored under
        it and not committed yet are orphans to garbage collection from now on: no lease
        of this session protects them (docs/durability.md, "Manager restarts"). A new
        lease must never commit them on the old one's say. A session whose whole content
        is in its local spill file stores them again at its commit; a stream that sent
        chunks cannot send them again, so the session is lost (EIO at its commit, as a
        failed pipeline's); one that has sent nothing yet goes on under the next lease."""
        self.lease = None
        pending = bool(self.stored.placements or self.stored.fragments)
        if self._spill is not None and self._pipeline is None:
            self.stored.drop_placed()
        elif pending or (self._pipeline is not None and self._pipeline.stored_any):
            self.lost = errors.LeaseExpired(
                f"inode {self.inode}: the write lease was lost (the manager restarted, or "
                f"the lease expired) while chunks stored under it waited for a commit")
