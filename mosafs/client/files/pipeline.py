"""The write pipeline of a stream of appended bytes (DESIGN §4, step 2): chunk them,
drop the chunks the base version or the manager's index already has, and put the new ones
to the stripe's benefactors round-robin, several at a time.

Appended bytes gather in `Batches` (by reference) or, where the chunk stream takes bytes
in place (the GPU backend's pinned host buffers), in the stream's own memory (`Pinned`);
every `batch_bytes` they go through a bounded memory channel (the sliding window: a full
window blocks `write`, which is the back-pressure) to the pipeline task.

In an erasure-coded pool (`ec`, docs/erasure_pools.md) a new chunk of at least the pool's
threshold is cut into K data + M parity fragments (the coder runs in a worker thread: it
releases the GIL; on the GPU backend the chunk stream computes the parity itself, from
the bytes already on the device for hashing, and the CPU coder does not run: docs/gpu.md),
each fragment is named by its BLAKE3 and put to a distinct benefactor of
the stripe, all K+M in parallel; a put that fails moves that fragment to a stripe member
no other fragment of the chunk uses. Pessimistic writes need all K+M stored, optimistic
ones at least K (the rest are recorded as holes). Smaller chunks are stored as `copies`
whole copies (M+1 in such a pool). Every put goes through the context's PutGroups
(mosafs.client.files.putgroups): the puts queued for one benefactor leave as one call.

The pipeline runs in the mount's process, or in a data-path worker process
(mosafs.client.worker, mosafs.client.files.remote) that runs this same code; SESSION is
anything with `ctx` (a ClientContext), `stored` (Stored), `targets`, `copies`, `ec`
(EcPolicy or None), `inode` and `write_token` (read at every put: a lease renewal replaces
it).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from mosafs import errors, metrics
from mosafs.client.files.blockmap import ChunkEntry
from mosafs.client.files.uploads import EcPolicy, Fragmented, New, encode, store_group

__all__ = ["EcPolicy", "Fragmented", "Pieces", "Pipeline", "Stored", "encode"]

log = logging.getLogger("mosafs.client.files.writer")


@dataclass
class Stored:
    """What this session knows to be stored: ids and, where known, their replicas."""

    ids: set[bytes] = field(default_factory=set)
    addresses: dict[bytes, list[str]] = field(default_factory=dict)
    placements: dict[bytes, list[str]] = field(default_factory=dict)  # new: benefactor ids
    fragments: dict[bytes, Fragmented] = field(default_factory=dict)  # new, erasure-coded
    new_bytes: int = 0

    def forget(self, cid: bytes) -> None:
        """CID no longer counts as stored (garbage collection may take it)."""
        self.ids.discard(cid)
        self.addresses.pop(cid, None)
        self.fragments.pop(cid, None)

    def forget_unplaced(self, ids: Iterable[bytes]) -> None:
        """Of IDS, those this session did not store itself (no placement to commit) stop
        counting as stored."""
        for cid in ids:
            if cid not in self.placements and cid not in self.fragments:
                self.forget(cid)

    def drop_placed(self, keep: Collection[bytes] = ()) -> None:
        """The chunks stored and not committed yet are no longer this session's to
        commit, but those in KEEP (which a commit just named): they stop counting as
        stored, and the next commit starts from no placement and no new byte."""
        for cid in (self.placements.keys() | self.fragments.keys()) - set(keep):
            self.forget(cid)
        self.placements.clear()
        self.fragments.clear()
        self.new_bytes = 0


class _ViewRequest:
    """Asks the pipeline for the stream's in-place buffer once everything sent before has
    been fed (the buffer's free part depends on that)."""

    def __init__(self) -> None:
        self.view: Any = None
        self.ready = trio.Event()


class Pieces(list[bytes]):
    """Appended bytes to feed: the writes' own buffers, in order, never concatenated (a
    copy of every byte, and of the growing batch on each append, that the chunker's own
    window made needless)."""


_JOIN_ABOVE = 16  # pieces per batch above which they are joined before feeding
# New chunks stored together (one slot of uploads_per_file): their puts to one benefactor
# leave as one call (mosafs.client.files.uploads).
GROUP_BYTES = 8 << 20

# bytes to feed | count written in place | request
_Item = Pieces | int | _ViewRequest


class Pipeline:
    """Chunks one appended byte stream and uploads its new chunks."""

    def __init__(self, session: Any, chunker: Any) -> None:
        self.session = session
        # pipelined: an asynchronous backend keeps buffers in flight; chunks come later.
        self.stream = _open_stream(chunker, session.ec)
        parity = getattr(self.stream, "parity", None)
        self.parity_code = None if parity is None else (parity[0], parity[1])
        """(K, M) of the parity the stream gives its chunks, or None."""
        self.chunker_backend = str(getattr(chunker, "backend", "unknown"))
        capacity = max(1, session.ctx.config.window_bytes // session.ctx.config.batch_bytes)
        self.send, self._recv = trio.open_memory_channel[_Item](capacity)
        self._request: _ViewRequest | None = None
        # Appended bytes not yet sent: in the stream's own memory when it offers it.
        self.input: _Batches | _Pinned = _Pinned() if self.stream.in_place else _Batches()
        self.entries: list[ChunkEntry] = []
        self.error: errors.MosafsError | None = None
        self.done = trio.Event()
        self._slots = trio.Semaphore(session.ctx.config.uploads_per_file)
        self._unstored = _ByteBudget(session.ctx.config.window_bytes)
        self._cursor = 0
        # Where this stream's coded chunks start in the placement rotation (uploads.
        # declustered): random, so that many small files do not all start alike.
        self._spread = random.randrange(1 << 30)
        self.hashed_bytes = 0  # what the chunking engine took, and its time (metrics)
        self.hash_seconds = 0.0
        # Ids this stream claimed in the session's `stored` before storing them
        # (_dispatch), given back if it fails (_unclaim).
        self._claimed: set[bytes] = set()

    async def run(self) -> None:
        try:
            async with self._recv, trio.open_nursery() as uploads:
                async for item in self._recv:
                    if isinstance(item, _ViewRequest):
                        self._request = item
                        item.view = await self.session.ctx.cpu(self.stream.pinned_buffer)
                        self._request = None
                        item.ready.set()
                        continue
                    if isinstance(item, int):
                        feed, size = self.stream.feed_pinned, item
                    else:
                        feed, size = self._feed_pieces, sum(len(p) for p in item)
                    await self._dispatch(await self._chunk(feed, item, size=size), uploads)
                await self._dispatch(await self._chunk(self.stream.finish), uploads)
        except Exception as exc:
            error = errors.domain_error(exc)
            if error is None:  # a bug: keep the mount alive, fail this file's commit
                log.exception("write pipeline of inode %d failed", self.session.inode)
                error = errors.InternalError(f"write pipeline failed: {exc!r}")
            self.error = error
            self._unclaim()
        finally:
            if self._request is not None:
                self._request.ready.set()  # with view None: the writer finds the error
            self.done.set()

    @property
    def stored_any(self) -> bool:
        """Whether this stream has claimed chunks to store (stored, being stored, or
        found in the index): a lease lost now leaves them unprotected."""
        return bool(self._claimed)

    def _unclaim(self) -> None:
        """The stream failed: the ids it claimed and did not store stop counting as
        stored, so that the session's next attempt (a retried fsync, the same bytes
        written again after a truncate) stores them instead of naming chunks that no
        benefactor holds in its commit."""
        self.session.stored.forget_unplaced(self._claimed)
        self._claimed.clear()

    def _feed_pieces(self, pieces: Pieces) -> list[Any]:
        # Many small writes (4 KiB each) are joined first: one copy of cache-warm bytes
        # costs less than a feed call per piece. Large ones are fed as they are.
        if len(pieces) > _JOIN_ABOVE:
            return list(self.stream.feed(b"".join(pieces)))
        chunks: list[Any] = []
        for piece in pieces:
            chunks.extend(self.stream.feed(piece))
        return chunks

    async def _chunk(self, call: Any, *args: Any, size: int = 0) -> list[Any]:
        """CALL on the chunking engine in a worker thread, its time and input counted."""
        started = time.perf_counter()
        chunks = await self.session.ctx.cpu(call, *args)
        backend = self.chunker_backend
        elapsed = time.perf_counter() - started
        self.hash_seconds += elapsed
        self.hashed_bytes += size
        metrics.CLIENT_HASH_SECONDS.labels(backend).inc(elapsed)
        metrics.CLIENT_HASHED.labels(backend).inc(size)
        return list(chunks)

    def start(self) -> None:
        self.session.ctx.spawn(self.run)

    async def append(self, data: bytes) -> None:
        await self.input.append(self, data, self.session.ctx.config.batch_bytes)

    async def feed(self, pieces: Pieces) -> None:
        """Whole batches (a spill file re-chunked), sent as they are."""
        await self.put(pieces)

    async def send_rest(self) -> None:
        """Send what append() gathered and has not sent yet (drain before finish())."""
        rest = self.input.take_rest()
        if rest:
            with contextlib.suppress(trio.BrokenResourceError):  # finish() reports why
                await self.send.send(rest)

    async def view(self) -> Any:
        """The stream's in-place buffer, after every item sent so far has been fed."""
        request = _ViewRequest()
        await self.put(request)
        await request.ready.wait()
        if request.view is None:
            raise await self.failure()
        return request.view

    async def put(self, item: _Item) -> None:
        """Send ITEM; blocks while the window is full (the back-pressure on write)."""
        try:
            await self.send.send(item)
        except trio.BrokenResourceError:
            raise await self.failure() from None

    async def failure(self) -> errors.MosafsError:
        await self.done.wait()
        return self.error or errors.InternalError("write pipeline stopped")

    async def _dispatch(self, chunks: list[Any], uploads: trio.Nursery) -> None:
        """Record CHUNKS in the block-map and store the new ones in the background, so that
        chunking the next batch overlaps the index look-up and the puts of this one."""
        stored = self.session.stored
        self.entries.extend(ChunkEntry(c.id, c.length) for c in chunks)
        fresh: dict[bytes, Any] = {}
        for c in chunks:
            if c.id not in stored.ids and c.id not in fresh:
                fresh[c.id] = c
        stored.ids.update(fresh)  # claimed now: a repeat later in the stream is not re-sent
        self._claimed.update(fresh)
        if fresh:
            # The new chunks' bytes wait here until the ones before them are stored: the
            # chunking engine never runs further ahead of the puts than one window.
            await self._unstored.take(sum(len(c.data) for c in fresh.values()))
            # A slot per batch too: the look-ups in flight stay bounded like the puts.
            await self._slots.acquire()
            uploads.start_soon(self._store_batch, list(fresh.values()), uploads)

    async def _store_batch(self, chunks: list[Any], uploads: trio.Nursery) -> None:
        try:
            if self.session.ctx.config.dedupe_with_index:
                present = await self.session.ctx.manager.find_chunks([c.id for c in chunks])
                found = [c for c, has in zip(chunks, present, strict=True) if has]
                chunks = [c for c, has in zip(chunks, present, strict=True) if not has]
                self._unstored.give(sum(len(c.data) for c in found))  # stored already
        finally:
            self._slots.release()
        for group in _groups(chunks, GROUP_BYTES):
            news = [New(c.id, c.data, self._cursor + i, getattr(c, "parity", None))
                    for i, c in enumerate(group)]
            self._cursor += len(group)
            await self._slots.acquire()
            uploads.start_soon(self._upload, news)

    async def _upload(self, group: list[New]) -> None:
        """Store a group of new chunks (mosafs.client.files.uploads): their puts to one
        benefactor leave as one call."""
        try:
            await store_group(self.session, self.session.ctx.puts, group, self.parity_code,
                              self._spread)
        finally:
            self._slots.release()
            self._unstored.give(sum(len(c.data) for c in group))

    async def finish(self) -> list[ChunkEntry]:
        await self.send.aclose()
        await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.entries


def _open_stream(chunker: Any, ec: EcPolicy | None) -> Any:
    """The pipeline's chunk stream. In an erasure-coded pool, a chunker that can (the
    GPU's) computes every chunk's parity while it hashes it, from the bytes already on
    the device, and copies back only the parity; other chunkers leave it to the CPU coder
    at upload."""
    if ec is not None and getattr(chunker, "computes_parity", False):
        return chunker.stream(pipelined=True, parity=(ec.k, ec.m, max(ec.min_chunk, 1)))
    return chunker.stream(pipelined=True)


def _groups(chunks: list[Any], limit: int) -> list[list[Any]]:
    """CHUNKS in consecutive groups of at most LIMIT bytes (at least one chunk each)."""
    out: list[list[Any]] = []
    size = 0
    for c in chunks:
        if not out or size + len(c.data) > limit:
            out.append([])
            size = 0
        out[-1].append(c)
        size += len(c.data)
    return out


class _ByteBudget:
    """Bytes held by a stream's chunks between the chunking engine and their puts, at most
    LIMIT (one more batch when none is held, so that a chunk larger than the limit still
    goes). Without it a stream whose puts are slower than its chunking (several writers,
    busy benefactors) held every chunk made so far: a worker's memory grew with the file.
    give() is synchronous, so a put's clean-up can return bytes while it is cancelled."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._waiters = trio.lowlevel.ParkingLot()

    async def take(self, count: int) -> None:
        while self.held and self.held + count > self.limit:
            await self._waiters.park()
        self.held += count

    def give(self, count: int) -> None:
        self.held -= count
        self._waiters.unpark_all()


class _Batches:
    """Appended bytes gathered (by reference: a write's buffer is immutable) and sent every
    batch_bytes."""

    def __init__(self) -> None:
        self.pending = Pieces()
        self.size = 0

    async def append(self, pipeline: Pipeline, data: bytes, batch_bytes: int) -> None:
        self.pending.append(data)
        self.size += len(data)
        if self.size >= batch_bytes:
            await pipeline.put(self.take_rest())

    def take_rest(self) -> Pieces:
        rest, self.pending, self.size = self.pending, Pieces(), 0
        return rest


class _Pinned:
    """Appended bytes written in place into the stream's buffer (pinned host memory).

    `view` is the buffer's free part; bytes [0, sent) of it have been handed to the
    pipeline, [sent, used) are written but not yet handed over. A count is sent every
    batch_bytes, so chunking keeps pace with writing; a new view is asked for only when
    this one is full (the pipeline answers once it has fed everything before).
    """

    def __init__(self) -> None:
        self.view: Any = None
        self.used = 0
        self.sent = 0

    @property
    def unsent(self) -> int:
        return self.used - self.sent

    def take_rest(self) -> int:
        count, self.sent = self.unsent, self.used
        return count

    async def append(self, pipeline: Pipeline, data: bytes, batch_bytes: int) -> None:
        source = memoryview(data)
        while source:
            if self.view is None or self.used == len(self.view):
                self.view, self.used, self.sent = await pipeline.view(), 0, 0
            take = min(len(source), len(self.view) - self.used)
            self.view[self.used:self.used + take] = source[:take]
            self.used += take
            source = source[take:]
            if self.unsent >= batch_bytes or self.used == len(self.view):
                await pipeline.put(self.take_rest())
