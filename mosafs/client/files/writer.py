"""Write sessions (DESIGN §4): one inode's uncommitted changes on this mount.

Two modes:

* STREAM, the checkpoint case: the new content is the committed prefix followed by bytes
  appended at the end. Appended bytes gather in the pipeline; every `batch_bytes` they go through
  a bounded memory channel (the sliding window: a full window blocks `write`, which is the
  back-pressure) to a pipeline task that chunks them in a worker thread, drops chunks the
  base version or the manager's index already has, and puts new chunks to the stripe's
  benefactors round-robin, several at a time.
* SPILL, for anything else (overwrites, truncation, reads of uncommitted data): the whole
  content is materialised once into a local temp file and edited there with pread/pwrite;
  the commit re-chunks it, and unchanged regions dedupe against the base.

Where the chunk stream takes bytes in place (the GPU backend's pinned host buffers), the
FUSE write copies straight into that memory and the pipeline is told only how many bytes
were added (mosafs.client.files.pipeline; a data-path worker process may run the pipeline,
mosafs.client.files.remote): the one copy a write
costs lands where the GPU copies from.

A commit (flush/fsync/close) drains the pipeline and stores the block-map with one
CommitVersion. Concurrency: every public method runs under the session's trio lock.

A commit by fsync, or by a close while the file stays open for writing, is provisional:
the session's next commit replaces it (CommitVersion names it in `replaces_version`, with
the session's random id; the manager drops it in the same transaction if it is still the
newest version and was committed by this session). So a file rewritten and fsync'ed many
times in one open session (a database) keeps one version, the last one
(docs/lifecycle.md, Versions).

Files are at most MAX_FILE_SIZE bytes: a write or truncate past it is EFBIG, and so is a
size the local spill file's file system refuses (docs/client.md, "File size").

A commit whose reply never came (a deadline, a dropped connection) may have been stored:
its outcome is unknown. The session then keeps its lease and sends the same CommitVersion
again (once at once, else at the next flush or the last release), and the manager answers
a repeat with the version the first one stored (commits are idempotent per lease,
mosafs.manager.leases): one close() makes at most one version. Only if the manager forgot
the lease (it restarted) does the session look at the file's newest version to learn
whether its content was stored, before it takes a new lease.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import trio

from mosafs import errors, metrics
from mosafs._proto import common_pb2 as cpb
from mosafs._proto import manager_pb2 as mpb
from mosafs.client.files.blockmap import BlockMapView, ChunkEntry, Coded, coded_of
from mosafs.client.files.context import ClientContext
from mosafs.client.files.pipeline import EcPolicy, Pieces, Pipeline, Stored
from mosafs.client.files.remote import RemotePipeline
from mosafs.client.files.writelease import LeaseHolder
from mosafs.manager.pools import ec_min_chunk

log = logging.getLogger(__name__)

# A CommitVersion that failed so may have been stored at the manager.
_OUTCOME_UNKNOWN = (errors.DeadlineExceeded, errors.Unavailable)
# The largest file mosafs stores: 4 TiB. It is below what every spill file system in use
# accepts (ext4 with 4 KiB blocks: 16 TiB - 4 KiB), so the limit is the same on every
# client, and a file of the default chunker's largest chunks (4 MiB) still commits: 1 Mi
# block-map entries, 41 MiB of the 64 MiB a CommitVersion may carry (docs/client.md).
MAX_FILE_SIZE = 4 << 40


def check_size(size: int) -> None:
    """EFBIG (ResourceExhausted) for a file size over MAX_FILE_SIZE."""
    if size > MAX_FILE_SIZE:
        raise errors.ResourceExhausted(f"a file size of {size} bytes is over the largest "
                                       f"mosafs stores ({MAX_FILE_SIZE} bytes, 4 TiB)")


@contextlib.contextmanager
def _local_file_errors(inode: int) -> Iterator[None]:
    """The spill file's refusals as the application's errors, not bugs: a size its file
    system cannot hold is EFBIG, a full local disk ENOSPC."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            raise errors.ResourceExhausted(
                f"inode {inode}: the local spill file cannot hold that size "
                f"({exc.strerror}); its file system (--spill-dir) limits it") from None
        if exc.errno == errno.ENOSPC:
            raise errors.NoSpace(f"inode {inode}: no space left for the local spill file "
                                 f"(--spill-dir)") from None
        raise


def _count_commit(entries: list[ChunkEntry], sent_chunks: int, sent_bytes: int) -> None:
    size = sum(e.length for e in entries)
    metrics.CLIENT_COMMITS.inc()
    metrics.CLIENT_WRITTEN.inc(size)
    metrics.CLIENT_SENT.inc(sent_bytes)
    metrics.CLIENT_DEDUPED.inc(max(0, size - sent_bytes))
    metrics.CLIENT_CHUNKS.labels("sent").inc(sent_chunks)
    metrics.CLIENT_CHUNKS.labels("deduplicated").inc(max(0, len(entries) - sent_chunks))


class WriteSession(LeaseHolder):
    """Create with `await WriteSession.create(ctx, inode)`; `close()` when the last writable
    handle is released."""

    def __init__(self, ctx: ClientContext, inode: int) -> None:
        self.ctx = ctx
        self.inode = inode
        self.lock = trio.Lock()
        self.stored = Stored()
        self.lease: mpb.OpenWriteResponse | None = None
        # Lets the pipelines put chunks (mosafs.manager.tokens): the lease's, replaced by
        # every renewal's, and handed to the data-path workers that run this session's
        # streams (_remotes).
        self.write_token = b""
        self._remotes: list[RemotePipeline] = []
        self.prefix: list[ChunkEntry] = []
        self.committed_version = 0
        self.size = 0
        self.dirty = False
        # Truncated to empty and not written since: what open(O_TRUNC) leaves before the
        # first write. Shells dup2() the new fd and close the original, and every close
        # flushes; committing this state there would make an empty version of every
        # `echo x > f`. So it is committed by fsync or by the last release only.
        self.only_emptied = False
        self.mtime_ns = time.time_ns()
        self._pipeline: Pipeline | RemotePipeline | None = None
        self._spill: Any = None  # a temp file while in SPILL mode
        self._renewals = trio.CancelScope()
        self._leased = trio.Event()  # set when a lease is taken (the renewals wait for it)
        self._renewing = False  # whether _renew_leases was started, or may start no more (closed)
        # The file existed while this session had it open (a lease was granted, or the
        # mount created it): a NotFound later means unlinked while open, not "no such file".
        self.existed = False
        self.orphaned = False  # unlinked while open: nothing more is committed
        # The last CommitVersion with self.lease got no answer: it may have been stored, so
        # the lease is kept (a repeat is answered with the stored version) and never
        # swapped for a new one before the outcome is known.
        self.in_doubt = False
        # Names this session's provisional versions at the manager: only this session's
        # next commit may replace them (random, so no other writer can).
        self.session_id = os.urandom(16)
        self.provisional_version = 0  # the last commit's version if it was provisional
        self._provisional_ids: set[bytes] = set()  # the chunk ids that version names
        # The chunk ids of the version the lease was opened on (counted as stored while
        # that version may be the base: _forget_base).
        self._base_ids: set[bytes] = set()
        self.lost: errors.MosafsError | None = None  # why appended bytes were lost, if so

    @classmethod
    async def create(cls, ctx: ClientContext, inode: int, *, new: bool = False) -> WriteSession:
        """A session for INODE. NEW: the file was just created, empty and without a
        version: the lease (a manager call at open, another at close) waits for the first
        edit, so creating a file and closing it unwritten costs neither; a session that
        takes its lease later starts from the same empty content."""
        session = cls(ctx, inode)
        session.existed = new
        if not new:
            await session._acquire_lease()
            lease = session.lease
            assert lease is not None
            if lease.base_inode == inode:  # this file's newest version is our starting point
                session.prefix = [ChunkEntry(c.id, c.length) for c in lease.base_chunks]
                session.size = lease.base_size
                session.committed_version = lease.base_version
        return session

    @property
    def copies(self) -> int:
        """Copies a put must store before the commit: R when pessimistic, else one (the
        manager makes the others in the background)."""
        assert self.lease is not None
        semantics = self.ctx.config.write_semantics or self.lease.pool.write_semantics
        return max(self.lease.pool.replication, 1) if semantics == "pessimistic" else 1

    @property
    def ec(self) -> EcPolicy | None:
        """How new chunks are erasure-coded (None: the pool keeps whole copies). A
        pessimistic write needs every fragment stored, an optimistic one K of them
        (docs/erasure_pools.md)."""
        assert self.lease is not None
        pool = self.lease.pool
        if not pool.ec_k:
            return None
        semantics = self.ctx.config.write_semantics or pool.write_semantics
        return EcPolicy(pool.ec_k, pool.ec_m, ec_min_chunk(pool), semantics == "pessimistic")

    @property
    def targets(self) -> list[cpb.BenefactorAddress]:
        assert self.lease is not None
        return list(self.lease.targets)

    def _chunker(self) -> Any:
        assert self.lease is not None
        return self.ctx.chunker(self.lease.pool.chunker, self.lease.pool.hash_backend)

    # -- edits -----------------------------------------------------------------------------

    async def write(self, offset: int, data: bytes) -> int:
        """Write DATA at OFFSET; a write that reaches past MAX_FILE_SIZE writes what fits
        (a short count), and one that starts there is EFBIG, as write(2)."""
        if offset + len(data) > MAX_FILE_SIZE:
            if offset >= MAX_FILE_SIZE:
                check_size(offset + len(data))  # EFBIG: not one byte fits
            data = data[:MAX_FILE_SIZE - offset]
        if self.lease is None:
            await self._acquire_lease()
        self._check_content()
        if self._spill is None and offset == self.size and not self.orphaned:
            self._edited()  # before: bytes an append that fails took are in the stream
            await self._append(data)
        else:
            await self._to_spill()  # a failure here changes nothing
            with _local_file_errors(self.inode):
                os.pwrite(self._spill.fileno(), data, offset)
            self.size = max(self.size, offset + len(data))
            self._edited()
        return len(data)

    def _edited(self) -> None:
        self.dirty = True
        self.only_emptied = False
        self.mtime_ns = time.time_ns()

    async def _append(self, data: bytes) -> None:
        if self._pipeline is None:
            self._pipeline = await self._new_pipeline()
        await self._pipeline.append(data)
        self.size += len(data)

    def replace_content(self, entries: list[ChunkEntry]) -> None:
        """The content is ENTRIES from now on: chunks the caller stored through this
        session (recorded in `stored`, as the pipeline records them) or that the base or
        the index has. mosafs.checkpoint chunks tensors on the GPU, outside the pipeline,
        and commits with this. Only on a session with no appended or spilled bytes."""
        self._check_content()
        if self._pipeline is not None or self._spill is not None:
            raise errors.InternalError("replace_content on a session with pending writes")
        if self.lease is None:
            raise errors.InternalError("replace_content without a write lease")
        self.prefix = list(entries)
        self.size = sum(e.length for e in entries)
        self.dirty = True
        self.only_emptied = False
        self.mtime_ns = time.time_ns()

    async def truncate(self, size: int) -> None:
        check_size(size)
        if size == self.size:
            return
        if self.lease is None:
            await self._acquire_lease()
        if size == 0:
            self._edited()
            self.only_emptied = True
            await self._drop_content()
            return
        await self._to_spill()  # a failure here changes nothing
        with _local_file_errors(self.inode):
            os.ftruncate(self._spill.fileno(), size)
        self.size = size
        self._edited()

    async def read(self, offset: int, size: int) -> bytes:
        """Uncommitted content; callers read committed content through the reader."""
        await self._to_spill()
        return os.pread(self._spill.fileno(), size, offset)

    async def _drop_content(self) -> None:
        self.lost = None  # emptied: the content is known again
        if self._pipeline is not None:
            pipeline, self._pipeline = self._pipeline, None
            with contextlib.suppress(errors.MosafsError):  # the content is thrown away anyway
                await pipeline.finish()
        self.prefix = []
        self.size = 0
        if self._spill is not None:
            self._spill.close()
            self._spill = None

    async def _drain_stream(self) -> list[ChunkEntry]:
        """Chunk and store everything appended so far; the content as a block-map."""
        self._check_content()
        if self._pipeline is None:
            return list(self.prefix)
        pipeline, self._pipeline = self._pipeline, None
        try:
            await pipeline.send_rest()
            return [*self.prefix, *await pipeline.finish()]
        except errors.MosafsError as exc:
            # The bytes that pipeline carried are gone: the session's content is no longer
            # known, and committing what is left would store a version without them.
            self.lost = exc
            log.info("inode %d: written bytes could not be stored, the file keeps its "
                     "previous version (%s: %s)", self.inode, type(exc).__name__, exc.message)
            raise

    def _check_content(self) -> None:
        """The error that lost part of this session's content, again: nothing more of it is
        written or committed (until a truncate to zero defines the content anew)."""
        if self.lost is not None:
            raise type(self.lost)(f"inode {self.inode}: earlier writes were lost "
                                  f"({self.lost.message}); close and write the file again")

    async def _to_spill(self) -> None:
        """Switch to SPILL mode: materialise the whole content in a local temp file."""
        if self._spill is not None:
            return
        log.debug("inode %d: spilling %d bytes to a local file", self.inode, self.size)
        # The spill file becomes the session's only once it holds the whole content: a
        # fetch that fails leaves the session's content as it was, a block-map (the edit
        # fails, the next one tries again), never a half-filled file that a commit would
        # store as the content.
        entries = await self._drain_stream()
        spill = tempfile.TemporaryFile(dir=self.ctx.config.spill_dir)  # noqa: SIM115
        try:
            view = await self.view(entries)
            fd = spill.fileno()
            for entry, start in zip(view.entries, view.starts, strict=False):
                data = await self.ctx.fetcher.get(entry.id, *view.where(entry.id))
                with _local_file_errors(self.inode):
                    os.pwrite(fd, data, start)
            with _local_file_errors(self.inode):
                os.ftruncate(fd, self.size)
        except BaseException:
            spill.close()
            self.prefix = entries  # the stream drained above is part of the content
            raise
        self._spill = spill  # kept open for the session's life; closed by _drop_content

    async def view(self, entries: list[ChunkEntry] | None = None) -> BlockMapView:
        """ENTRIES (default: the committed content) as a readable view, every chunk located
        and with a fresh read token (also those this session stored: the manager signs
        tokens for ids its index does not have yet)."""
        entries = self.prefix if entries is None else entries
        addresses = dict(self.stored.addresses)
        tokens: dict[bytes, bytes] = {}
        coded: dict[bytes, Coded] = {}
        ids = sorted({e.id for e in entries})
        # Erasure-coded chunks this session stored and has not committed: their fragments
        # are read by id, with tokens asked for by fragment id.
        mine = {cid: self.stored.fragments[cid] for cid in ids if cid in self.stored.fragments}
        if ids:
            located = await self.ctx.manager.locate(
                [*ids, *sorted({f for frag in mine.values() for f in frag.ids})])
            tokens = located.tokens
            for cid, where in located.addresses.items():
                addresses.setdefault(cid, where)  # where this session put it first
            lengths = {e.id: e.length for e in entries}
            coded = coded_of(located.coded, located.benefactors, lengths)
        for cid, frag in mine.items():
            coded[cid] = Coded(frag.k, frag.m, frag.length, frag.ids, frag.addresses,
                               tuple(tokens.get(f, b"") for f in frag.ids),
                               tuple(bool(a) for a in frag.addresses))
        return BlockMapView.build(self.committed_version, entries, addresses, tokens, coded)

    # -- commit ----------------------------------------------------------------------------

    async def commit(self, *, provisional: bool = False) -> mpb.CommitVersionResponse | None:
        """Store the current content as a new version (no-op when nothing changed). It
        replaces this session's provisional version, if the last commit made one; a
        PROVISIONAL commit (fsync, a close with other writers open) may be replaced by
        the next one in turn."""
        if not self.dirty:
            return None
        if self.lease is None:
            await self._acquire_lease()
        if self.orphaned:
            return None  # the file is gone; its last handles keep the bytes until closed
        if self._spill is None:
            # The drained stream is the content now, whether or not the commit succeeds.
            entries = self.prefix = await self._drain_stream()
        else:
            entries = await self._rechunk()
        replacing = self.provisional_version
        reply = await self._commit_entries(entries, provisional)
        if replacing:
            self._forget_replaced(entries)
        self._forget_base(entries)
        self.prefix = entries
        self.committed_version = reply.version
        self.provisional_version = reply.version if provisional else 0
        self._provisional_ids = {e.id for e in entries} if provisional else set()
        self.dirty = self.only_emptied = False
        return reply

    def _forget_replaced(self, entries: list[ChunkEntry]) -> None:
        """The provisional version this commit replaced went with its chunk references, so
        garbage collection may delete its chunks that ENTRIES do not name while this
        session goes on: they stop counting as stored here, and a later write of those
        bytes finds them in the index or stores them again."""
        kept = {e.id for e in entries}
        for cid in self._provisional_ids - kept:
            self.stored.forget(cid)

    def _forget_base(self, entries: list[ChunkEntry]) -> None:
        """The lease this commit used up protected its base version's chunks from garbage
        collection (docs/durability.md); the next lease is opened on the version just
        committed. The base may be pruned now (a policy keeping one version), so its
        chunks that ENTRIES do not name stop counting as stored: written again later,
        they are looked up or stored, never named in a commit on a lost copy's say."""
        self.stored.forget_unplaced(self._base_ids - {e.id for e in entries})
        self._base_ids = set()

    async def _new_pipeline(self) -> Pipeline | RemotePipeline:
        """A pipeline in a data-path worker process when the mount has them, else here."""
        link = self.ctx.workers.pick() if self.ctx.workers is not None else None
        if link is None:
            pipeline = Pipeline(self, self._chunker())
            pipeline.start()
            return pipeline
        assert self.lease is not None
        remote = RemotePipeline(self, link)
        await remote.open(self.lease.pool.chunker, self.lease.pool.hash_backend)
        self._remotes.append(remote)
        return remote

    async def _rechunk(self) -> list[ChunkEntry]:
        """Chunk the spill file from the start; unchanged regions dedupe against the base."""
        pipeline = await self._new_pipeline()
        fd = self._spill.fileno()
        batch = self.ctx.config.batch_bytes
        try:
            for offset in range(0, self.size, batch):
                await pipeline.feed(Pieces([os.pread(fd, min(batch, self.size - offset),
                                                     offset)]))
        except errors.MosafsError:
            pass  # finish() reports the pipeline's error
        return await pipeline.finish()

    async def _commit_entries(self, entries: list[ChunkEntry],
                              provisional: bool) -> mpb.CommitVersionResponse:
        stored = self.stored
        wanted = {e.id for e in entries}
        placements = [mpb.ChunkPlacement(id=i, benefactor_ids=b)
                      for i, b in stored.placements.items() if i in wanted]
        placements += [mpb.ChunkPlacement(id=i, ec_k=f.k, ec_m=f.m, fragment_ids=f.ids,
                                          fragment_holders=f.holders)
                       for i, f in stored.fragments.items() if i in wanted]
        try:
            reply = await self._send_commit(entries, placements, provisional)
        except errors.LeaseExpired:
            if not self.in_doubt:
                self._lease_lost()  # a later flush takes a new lease (or finds it lost)
                raise
            reply = await self._settle_doubt(entries, placements, provisional)
        self.lease = None  # consumed: the next edit takes a new one
        _count_commit(entries, len(placements), stored.new_bytes)
        # Chunks stored for content that was not committed (overwritten, truncated away)
        # never reach the index, and garbage collection deletes them: they stop counting
        # as stored, so the same bytes written later are stored again.
        stored.drop_placed(keep=wanted)
        return reply

    def _request(self, entries: list[ChunkEntry], placements: list[mpb.ChunkPlacement],
                 provisional: bool) -> mpb.CommitVersionRequest:
        assert self.lease is not None
        return mpb.CommitVersionRequest(
            lease_id=self.lease.lease_id, inode=self.inode,
            chunks=[cpb.ChunkRef(id=e.id, length=e.length) for e in entries],
            placements=placements, mtime_ns=self.mtime_ns, new_bytes=self.stored.new_bytes,
            provisional=provisional, replaces_version=self.provisional_version,
            session=self.session_id)

    async def _send_commit(self, entries: list[ChunkEntry],
                           placements: list[mpb.ChunkPlacement],
                           provisional: bool) -> mpb.CommitVersionResponse:
        """CommitVersion with the session's lease. When no answer comes, the same request
        goes once more at once: the manager answers a repeat with the version the first one
        stored, so this never makes a second version. Still no answer: the error stands,
        and the session stays in doubt and keeps its lease for the next commit."""
        request = self._request(entries, placements, provisional)
        try:
            reply: mpb.CommitVersionResponse = await self.ctx.manager.commit_version(request)
        except _OUTCOME_UNKNOWN as exc:
            self.in_doubt = True
            log.info("commit of inode %d got no answer (%s): asking again with the same lease",
                     self.inode, exc.message)
            reply = await self.ctx.manager.commit_version(request)
        self.in_doubt = False
        return reply

    async def _settle_doubt(self, entries: list[ChunkEntry],
                            placements: list[mpb.ChunkPlacement],
                            provisional: bool) -> mpb.CommitVersionResponse:
        """A commit in doubt, and the manager no longer knows its lease (it restarted, or
        the lease lived out its TTL): if the file's newest version is exactly this content
        and newer than the one this session started from, that commit was stored: it is
        the answer. Otherwise the file does not show this content: commit it with a new
        lease."""
        self.in_doubt = False
        self.lease = None
        newest = await self.ctx.manager.block_map(self.inode)
        if newest.version > self.committed_version and \
                [(c.id, c.length) for c in newest.chunks] == \
                [(e.id, e.length) for e in entries]:
            log.info("commit of inode %d in doubt was stored as version %d", self.inode,
                     newest.version)
            attr = await self.ctx.manager.getattr(self.inode)
            return mpb.CommitVersionResponse(version=newest.version, attr=attr)
        # Not stored: the chunks the lost lease stored for it are orphans now (_lease_lost).
        self._lease_lost()
        self._check_content()
        if placements:  # forgotten, to be stored again by the next commit (a spill file)
            raise errors.LeaseExpired(f"inode {self.inode}: the write lease was lost "
                                      f"before the commit was stored; committing again")
        await self._acquire_lease()
        if self.lease is None:
            raise errors.NotFound(f"inode {self.inode} was removed before its changes "
                                  f"were committed")
        return await self._send_commit(entries, placements, provisional)

    async def close(self) -> None:
        """Drop uncommitted state and the lease (the last writable handle is gone)."""
        # A session that never took a lease started no renewals: nothing to cancel (trio's
        # cancel formats the task's repr, on every empty file created). None start later.
        if self._renewing:
            self._renewals.cancel()
        self._renewing = True
        await self._drop_content()
        self.dirty = False  # nothing of it is readable or committed any more
        if self.lease is not None:
            lease, self.lease = self.lease, None
            try:
                await self.ctx.manager.abort_write(lease.lease_id)
            except errors.MosafsError as exc:
                log.info("abort of write lease %d failed (it expires anyway): %s",
                         lease.lease_id, exc)
