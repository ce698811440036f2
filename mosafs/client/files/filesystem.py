"""The file system as the FUSE layer sees it: open handles, write sessions, reads and
writes here; names and attributes in mosafs.client.files.namespace, extended attributes
in mosafs.client.files.xattrs. Knows nothing of pyfuse3; raises mosafs.errors classes."""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass

from mosafs import errors, metrics
from mosafs._proto import manager_pb2 as mpb
from mosafs.client.files.attrcache import AttrCache
from mosafs.client.files.blockmap import BlockMapView, coded_of
from mosafs.client.files.coherence import Coherence
from mosafs.client.files.context import ClientContext
from mosafs.client.files.namespace import Attr, Namespace
from mosafs.client.files.readahead import MINIMUM, ReadAhead
from mosafs.client.files.statahead import StatAhead
from mosafs.client.files.versions import VersionView, is_virtual
from mosafs.client.files.writer import WriteSession, check_size
from mosafs.client.files.xattrs import ExtendedAttributes
from mosafs.client.quick import InodeLocks

log = logging.getLogger(__name__)


@dataclass
class Handle:
    inode: int
    readable: bool
    writable: bool
    # Per handle: each reader has its own pattern (one streams, another seeks).
    ahead: ReadAhead
    view: BlockMapView | None = None  # the version this handle reads (close-to-open)


class FileSystem(Namespace, ExtendedAttributes):
    """Create with `await FileSystem.create(ctx)`; `await close()` before unmounting."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self._handles: dict[int, Handle] = {}
        self._fh = itertools.count(1)
        self._sessions: dict[int, WriteSession] = {}
        self._writers: dict[int, int] = {}  # inode -> open writable handles
        self._lock = InodeLocks()  # the sessions' (open, write, flush, release, truncate)
        self._cache = AttrCache(ctx.config.attr_timeout, ctx.config.coherent_timeout)
        self._ahead = StatAhead(self._cache, ctx.manager.readdir_pages, ctx.spawn)
        # Started by `keep_coherent` (the mount does; a library client keeps the attribute
        # timeout).
        self.coherence: Coherence | None = None
        # Inodes committed since the FUSE layer last took them (`take_committed`): the
        # kernel's attributes of them are out of date.
        self._committed: set[int] = set()
        # Newest version this mount committed or opened, per inode with open handles: every
        # descriptor of a file on this machine reads the same bytes (POSIX), so a handle
        # whose view is older catches up before it reads.
        self._latest: dict[int, int] = {}
        self.versions = VersionView(ctx.manager)  # the read-only `.versions` views

    @classmethod
    async def create(cls, ctx: ClientContext) -> FileSystem:
        fs = cls(ctx)
        try:
            await ctx.manager.getattr(1)  # the manager answers, and the root exists
        except (errors.DeadlineExceeded, errors.Unavailable) as exc:
            raise errors.Unavailable(
                f"the manager at {ctx.manager.address} did not answer within "
                f"{ctx.config.manager_timeout:g} s: it is not running or not reachable, or "
                f"TLS does not match (a plaintext manager needs --insecure; a TLS one, "
                f"certificates of its own CA in --tls-dir) ({exc.message})") from None
        return fs

    def keep_coherent(self) -> Coherence | None:
        """Start keeping the caches coherent with the manager's change lists, for the
        mount's life (None where the configuration says not to)."""
        if self.ctx.config.coherent_timeout <= self.ctx.config.attr_timeout:
            return None
        self.coherence = Coherence(self.manager, self._cache)
        self.ctx.spawn(self.coherence.run)
        return self.coherence

    def _used(self) -> None:
        if self.coherence is not None:
            self.coherence.used()

    def has_session(self, inode: int) -> bool:
        """Whether INODE has a write session here (open for writing, or its last
        writable handle's release not done yet)."""
        return inode in self._sessions

    def take_committed(self) -> set[int]:
        """The inodes this mount committed since the last call."""
        committed, self._committed = self._committed, set()
        return committed

    def kernel_timeout(self, inode: int) -> float:
        """How long the kernel may keep INODE's attributes (and the name it was just given
        by): what the cache here has left of them, at least the attribute timeout. Views
        and files with uncommitted writes get the attribute timeout."""
        session = self._sessions.get(inode)
        if is_virtual(inode) or (session is not None and session.dirty):
            return self._cache.ttl
        return max(self._cache.ttl, self._cache.left(inode))

    # -- open files ----------------------------------------------------------------------------

    async def create_file(self, parent: int, name: str, mode: int, flags: int, uid: int,
                     gid: int) -> tuple[int, Attr]:
        self._writable(parent)
        attr = await self._make(parent, name, self.manager.create(
            parent, name, mode, uid, gid, exclusive=bool(flags & os.O_EXCL)))
        # Empty and without a version: made now, or an empty file that was there (create
        # without O_EXCL returns it); either way a write starts from nothing.
        fh, _ = await self.open(attr.inode, flags, new=not attr.version and not attr.size)
        return fh, await self.getattr(attr.inode)

    async def open(self, inode: int, flags: int, *, new: bool = False) -> tuple[int, int]:
        """A new handle, and the file's newest committed version as of this open: the FUSE
        layer compares it with what the kernel was told and drops stale kernel attributes
        (a file another mount changed since). NEW: the file is empty and has no version
        (WriteSession.create)."""
        access = flags & os.O_ACCMODE
        handle = Handle(inode, readable=access != os.O_WRONLY, writable=access != os.O_RDONLY,
                        ahead=self._new_readahead())
        if is_virtual(inode):
            if handle.writable or flags & os.O_TRUNC:
                self._writable(inode)
            handle.view = BlockMapView.from_proto(await self.versions.block_map(inode))
            version = handle.view.version
        elif handle.writable:
            async with self._lock(inode):
                session = self._sessions.get(inode)
                if session is None:
                    session = await WriteSession.create(self.ctx, inode, new=new)
                    self._sessions[inode] = session
                self._writers[inode] = self._writers.get(inode, 0) + 1
                version = session.committed_version
                if flags & os.O_TRUNC:
                    try:
                        await session.truncate(0)
                    except BaseException:
                        await self._drop_writer(inode)
                        raise
        elif handle.readable:
            # Close-to-open: a reader sees the version that was newest when it opened.
            handle.view = BlockMapView.from_proto(await self.manager.block_map(inode))
            version = handle.view.version
        else:
            version = (await self.getattr(inode)).version
        self._revalidate(inode, version)
        self._latest[inode] = max(version, self._latest.get(inode, 0))
        self._cache.pin(inode, await self.getattr(inode))
        fh = next(self._fh)
        self._handles[fh] = handle
        return fh, version

    def _revalidate(self, inode: int, version: int) -> None:
        cached = self._cache.attr(inode)
        if cached is not None and cached.version != version:
            self._cache.drop(inode)

    def _handle(self, fh: int) -> Handle:
        handle = self._handles.get(fh)
        if handle is None:
            raise errors.InvalidArgument(f"unknown file handle {fh}")
        return handle

    async def write(self, fh: int, offset: int, data: bytes) -> int:
        handle = self._handle(fh)
        if not handle.writable:
            raise errors.InvalidArgument("file handle is not open for writing")
        async with self._lock(handle.inode):
            return await self._sessions[handle.inode].write(offset, data)

    async def read(self, fh: int, offset: int, size: int) -> bytes:
        handle = self._handle(fh)
        session = self._sessions.get(handle.inode)
        if session is not None and session.dirty:
            async with self._lock(handle.inode):
                # Looked up again under the lock: a release may have ended the session
                # meanwhile (its commit failed), and then the committed version is read.
                session = self._sessions.get(handle.inode)
                if session is not None and session.dirty:
                    return await session.read(offset, size)
        view = await self._view(handle, session)
        try:
            data = await self._read_view(view, offset, size, handle.ahead)
        except errors.TokenRefused as exc:
            # Read tokens expire (--token-ttl): a file kept open that long reads on with
            # the tokens of a block-map asked for again, once.
            log.info("inode %d: a benefactor refused a read token (%s); asking for the "
                     "block-map again", handle.inode, exc.message)
            view = await self._renew_tokens(handle, view)
            data = await self._read_view(view, offset, size, handle.ahead)
        metrics.CLIENT_READ.inc(len(data))
        return data

    async def _renew_tokens(self, handle: Handle, view: BlockMapView) -> BlockMapView:
        """VIEW's version again, with fresh read tokens (the handle keeps it)."""
        try:
            if is_virtual(handle.inode):
                fresh = BlockMapView.from_proto(await self.versions.block_map(handle.inode))
            else:
                fresh = BlockMapView.from_proto(
                    await self.manager.block_map(handle.inode, view.version))
        except errors.NotFound:
            # Unlinked while open (its chunks outlive the name while this mount reads
            # them): tokens by chunk id instead.
            located = await self.manager.locate(sorted({e.id for e in view.entries}))
            lengths = {e.id: e.length for e in view.entries}
            fresh = BlockMapView.build(view.version, view.entries, view.addresses,
                                       located.tokens,
                                       coded_of(located.coded, located.benefactors, lengths))
        if handle.view is view:  # not replaced by a newer version meanwhile
            handle.view = fresh
        return fresh

    async def _view(self, handle: Handle, session: WriteSession | None) -> BlockMapView:
        latest = self._latest.get(handle.inode, 0)
        if handle.view is None or handle.view.version < latest:
            try:
                handle.view = BlockMapView.from_proto(
                    await self.manager.block_map(handle.inode))
            except errors.NotFound:
                if handle.view is None:
                    if session is None:
                        raise
                    # Opened for writing, not read before the name went: the session
                    # knows the content it started from.
                    handle.view = await session.view()
                # Unlinked while open: the chunks outlive the name (no garbage collection
                # while this mount holds the view), so this handle keeps its version.
        elif time.time() >= handle.view.renew_by:
            try:
                await self._renew_tokens(handle, handle.view)
            except errors.MosafsError as exc:  # the tokens may do yet; a refusal retries
                log.info("inode %d: cannot renew its read tokens yet: %s", handle.inode, exc)
        return handle.view

    def _new_readahead(self) -> ReadAhead:
        # The cache keeps the chunks fetched ahead: a window over half of it would evict
        # them before the reader gets there.
        config = self.ctx.config
        return ReadAhead(MINIMUM, min(config.readahead_bytes, config.cache_bytes // 2))

    async def _read_view(self, view: BlockMapView, offset: int, size: int,
                         ahead: ReadAhead) -> bytes:
        sequential = ahead.read(offset, size)  # before any await: reads arrive in order
        parts = []
        last = -1
        for index, lo, hi in view.pieces(offset, size):
            entry = view.entries[index]
            if sequential and self.ctx.fetcher.cached(entry.id) is None:
                ahead.stalled(view.starts[index])  # read-ahead did not cover the latency
            data = await self.ctx.fetcher.get(entry.id, *view.where(entry.id))
            parts.append(data[lo:hi])
            last = index
        if last >= 0:
            self._readahead(view, last + 1, ahead.window)
        return b"".join(parts)

    def _readahead(self, view: BlockMapView, start: int, budget: int) -> None:
        """Prefetch the chunks from index START that cover BUDGET bytes (the handle's
        window)."""
        stop = start
        while stop < len(view.entries) and budget > 0:
            budget -= view.entries[stop].length
            stop += 1
        for entry in view.entries[start:stop]:
            self.ctx.fetcher.prefetch(entry.id, *view.where(entry.id))

    async def truncate(self, inode: int, size: int) -> None:
        """truncate(2)/ftruncate(2): through the open session, or a short-lived one."""
        self._writable(inode)
        check_size(size)  # before a short-lived session takes a lease for nothing
        async with self._lock(inode):
            session = self._sessions.get(inode)
            if session is not None:
                await session.truncate(size)
                return
            session = await WriteSession.create(self.ctx, inode)
            try:
                await session.truncate(size)
                await self._commit(session)
            finally:
                await session.close()
        if inode not in self._sessions and not self._other_handles(inode):
            self._lock.drop(inode)

    async def _commit(self, session: WriteSession, *, provisional: bool = False) -> None:
        try:
            reply = await session.commit(provisional=provisional)
        except errors.NotFound:
            # Unlinked or renamed over while open: the edits stay with the open handles.
            log.debug("inode %d was removed before its changes were committed", session.inode)
            session.orphaned = True
            return
        if reply is not None:
            self._cache.put(reply.attr)
            self._committed.add(session.inode)
            self._latest[session.inode] = reply.version
            await self._refresh_views(session.inode, reply.version)

    async def _refresh_views(self, inode: int, version: int) -> None:
        """Give this inode's open handles the version just committed, now: every descriptor
        on this machine reads the same bytes, also after the file is unlinked later."""
        handles = [h for h in self._handles.values() if h.inode == inode and h.view is not None]
        if handles:
            try:
                view = BlockMapView.from_proto(await self.manager.block_map(inode, version))
            except errors.NotFound:
                # Pruned at once (an older step than the policy keeps, or the file went):
                # the commit stands, and the handles keep the version they read.
                return
            for handle in handles:
                handle.view = view

    async def flush(self, fh: int, *, fsync: bool = False) -> None:
        """close(2) and fsync(2): commit this inode's changes (close-to-open semantics).

        The commit is provisional when the file stays open for writing: an fsync, or the
        close of one of several writable handles. The session's next commit replaces it,
        so a file fsync'ed at every step of one open session (a database, a log) keeps
        one version, not one per fsync; the close of its last writable handle (flush
        comes before release, so this handle still counts) makes the version that
        stays (docs/lifecycle.md, Versions)."""
        handle = self._handle(fh)
        if not handle.writable:
            return
        async with self._lock(handle.inode):
            session = self._sessions.get(handle.inode)
            if session is not None and (fsync or not session.only_emptied):
                still_open = fsync or self._writers.get(handle.inode, 0) > 1
                await self._commit(session, provisional=still_open)

    async def release(self, fh: int) -> None:
        handle = self._handles.pop(fh, None)
        if handle is None:
            return
        # Under the inode's lock: a reader's release must not close the session a writer's
        # release is still committing.
        try:
            async with self._lock(handle.inode):
                try:
                    if handle.writable:
                        await self._drop_writer(handle.inode)  # a failed commit raises
                finally:
                    await self._forget_if_unused(handle.inode)
        finally:
            if handle.inode not in self._sessions:  # its last handle is gone
                self._lock.drop(handle.inode)

    async def _forget_if_unused(self, inode: int) -> None:
        """Under the inode's lock: no handle is left, so nothing of it stays pinned, and an
        orphaned session kept for readers ends."""
        if self._other_handles(inode) or inode in self._writers:
            return
        self._cache.unpin(inode)
        self._latest.pop(inode, None)
        await self._end_session(inode)

    async def _end_session(self, inode: int) -> None:
        session = self._sessions.pop(inode, None)
        if session is not None:
            await session.close()

    async def _drop_writer(self, inode: int) -> None:
        remaining = self._writers.get(inode, 0) - 1
        if remaining > 0:
            self._writers[inode] = remaining
            return
        self._writers.pop(inode, None)
        session = self._sessions.get(inode)
        if session is None:
            return
        # Only an emptying open(O_TRUNC) waits for the last release. A session that lost
        # bytes (its flush said EIO) has nothing to commit: it ends here.
        try:
            if session.dirty and session.lost is None:
                await self._commit(session)
        except errors.MosafsError:
            # The last writer is gone and its content could not be stored (its close
            # said so): the session ends all the same, so that this mount shows the
            # file's committed version, as every other mount does, not bytes no version
            # holds.
            await self._end_session(inode)
            raise
        if not (session.orphaned and self._other_handles(inode)):
            # (else readers of the vanished file still read its last bytes from here)
            await self._end_session(inode)

    def _other_handles(self, inode: int) -> bool:
        return any(h.inode == inode for h in self._handles.values())

    async def version_stats(self, inode: int) -> mpb.VersionStats:
        return await self.manager.version_stats(inode)

    async def close(self) -> int:
        """Drop every write session; how many files had uncommitted changes, discarded (a
        stop that did not wait for their applications to close them). A commit is all or
        nothing, so each such file keeps its previous version."""
        discarded = 0
        for inode in list(self._sessions):
            session = self._sessions.pop(inode)
            if session.dirty:
                discarded += 1
                log.warning("unmounting with uncommitted changes to inode %d (%d bytes): "
                            "discarded, the file keeps its previous version", inode,
                            session.size)
            await session.close()
        self.ctx.close()
        return discarded

