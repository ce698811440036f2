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
whole copies (M+1 in such a pool).

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from mosafs import errors, metrics
from mosafs._proto import common_pb2 as cpb
from mosafs.client.files.blockmap import ChunkEntry
from mosafs.client.rpc import Benefactors
from mosafs.erasure.base import with_parity
from mosafs.ids import chunk_id as ids_of

log = logging.getLogger("mosafs.client.files.writer")


@dataclass(frozen=True)
class EcPolicy:
    """How a session stores new chunks of an erasure-coded pool: K+M fragments for chunks of
    at least MIN_CHUNK bytes; ALL: every fragment must be stored (pessimistic), else at
    least K (optimistic)."""

    k: int
    m: int
    min_chunk: int
    all: bool = True


@dataclass(frozen=True)
class Fragmented:
    """Where a session stored an erasure-coded chunk's fragments: fragment i is the blob
    ids[i] on benefactor holders[i] at addresses[i] ("" both: not stored)."""

    k: int
    m: int
    length: int
    ids: tuple[bytes, ...]
    holders: tuple[str, ...]
    addresses: tuple[str, ...]


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
        self.hashed_bytes = 0  # what the chunking engine took, and its time (metrics)
        self.hash_seconds = 0.0

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
        finally:
            if self._request is not None:
                self._request.ready.set()  # with view None: the writer finds the error
            self.done.set()

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
        for c in chunks:
            await self._slots.acquire()
            uploads.start_soon(self._upload, c.id, c.data, self._cursor,
                               getattr(c, "parity", None))
            self._cursor += 1

    async def _upload(self, chunk_id: bytes, data: bytes, cursor: int,
                      parity: Sequence[Any] | None = None) -> None:
        """Store one chunk: COPIES copies on distinct targets, starting at the stripe's
        CURSOR-th; a target that fails is replaced by the next one (a benefactor that died
        mid-write costs a retry, not the file). A chunk of an erasure-coded pool at least
        the threshold long goes as fragments (PARITY: its parity fragments, when the
        chunk stream computed them)."""
        ec = self.session.ec
        if ec is not None and len(data) >= max(ec.min_chunk, 1):
            try:
                await self._upload_coded(chunk_id, data, cursor, ec, parity)
            finally:
                self._slots.release()
                self._unstored.give(len(data))
            return
        try:
            targets = self.session.targets
            copies = min(self.session.copies, len(targets))
            failures: list[str] = []
            done: list[cpb.BenefactorAddress] = []
            full = 0  # of the failures, targets without space
            message = self.session.ctx.benefactors.frame(chunk_id, data)  # once, every target
            for attempt in range(len(targets)):
                if len(done) == copies:
                    break
                target = targets[(cursor + attempt) % len(targets)]
                try:
                    await self.session.ctx.benefactors.put(target, message,
                                                           self.session.write_token)
                except (errors.Unavailable, errors.DeadlineExceeded, errors.NoSpace) as exc:
                    failures.append(f"{target.address}: {exc.message}")
                    full += isinstance(exc, errors.NoSpace)
                    continue
                done.append(target)
            if len(done) < max(copies, 1):
                # Every target full: the pool has no room (ENOSPC), not a passing outage.
                error = errors.NoSpace if full == len(failures) else errors.Unavailable
                raise error(f"chunk {chunk_id.hex()}: {len(done)} of {copies} copies stored "
                            f"({'; '.join(failures)})")
            stored = self.session.stored
            stored.placements[chunk_id] = [t.id for t in done]
            stored.addresses[chunk_id] = [t.address for t in done]
            stored.new_bytes += len(data)
        finally:
            self._slots.release()
            self._unstored.give(len(data))

    async def _upload_coded(self, chunk_id: bytes, data: bytes, cursor: int,
                            ec: EcPolicy, parity: Sequence[Any] | None = None) -> None:
        """Store one chunk as K+M fragments on distinct benefactors of the stripe (in the
        order `declustered` draws for it; CURSOR is unused here), all puts at once; a
        fragment whose put fails goes to a stripe member that holds no other fragment of
        the chunk. The stream's PARITY is used when
        it was computed for this pool's K+M (a pool whose redundancy changed since the
        stream began is coded on the CPU)."""
        ctx = self.session.ctx
        if self.parity_code != (ec.k, ec.m):
            parity = None
        coder = ctx.coder() if parity is None else None
        ids, messages = await ctx.cpu(_encode, coder, data, ec.k, ec.m, parity)
        width = ec.k + ec.m
        targets = self.session.targets
        free = declustered(targets, chunk_id)
        holders: list[cpb.BenefactorAddress | None] = [None] * width
        failures: list[str] = []
        fatal: list[errors.MosafsError] = []
        full = 0

        async def put(i: int) -> None:
            nonlocal full
            while free and not fatal:
                target = free.pop(0)
                try:
                    await ctx.benefactors.put(target, messages[i], self.session.write_token)
                except (errors.Unavailable, errors.DeadlineExceeded, errors.NoSpace) as exc:
                    failures.append(f"{target.address}: {exc.message}")
                    full += isinstance(exc, errors.NoSpace)
                    continue
                except errors.MosafsError as exc:
                    fatal.append(exc)
                    return
                holders[i] = target
                return

        async with trio.open_nursery() as nursery:
            for i in range(width):
                nursery.start_soon(put, i)
        if fatal:
            raise fatal[0]
        stored = sum(h is not None for h in holders)
        if stored < (width if ec.all else ec.k):
            # Never less redundancy than the pool promises (pessimistic), never fewer than
            # K fragments (unreadable): the write fails, ENOSPC when the pool is full.
            error = errors.NoSpace if failures and full == len(failures) else errors.Unavailable
            why = "; ".join(failures) or "no more benefactors in the stripe"
            raise error(
                f"chunk {chunk_id.hex()}: ec:{ec.k}+{ec.m} needs "
                f"{width if ec.all else ec.k} of its {width} fragments on distinct "
                f"benefactors, {stored} stored with {len(targets)} benefactors to write to "
                f"({why})")
        self.session.stored.fragments[chunk_id] = Fragmented(
            ec.k, ec.m, len(data), tuple(ids),
            tuple(h.id if h is not None else "" for h in holders),
            tuple(h.address if h is not None else "" for h in holders))
        self.session.stored.new_bytes += len(data)

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


def declustered(targets: Sequence[Any], chunk_id: bytes) -> list[Any]:
    """The stripe members in the order a coded chunk's fragments take them: a permutation
    drawn from the chunk id (the same in every process). Consecutive members for every
    chunk (as whole copies take them) would give each benefactor the same few partners in
    every chunk of a narrow code (ec:2+1 over 7: its neighbours), so that after its loss
    only those could serve the reads of the rebuild; drawn per chunk, the partners of a
    lost benefactor are spread over the whole stripe and all the survivors share the work
    (docs/erasure_pools.md, "Repair"). Balance over many chunks is statistical."""
    order = list(targets)
    random.Random(bytes(chunk_id)).shuffle(order)
    return order


def _encode(coder: Any, data: Any, k: int, m: int,
            parity: Sequence[Any] | None = None) -> tuple[list[bytes], list[bytes]]:
    """(the BLAKE3 of each of CHUNK's K+M fragments, each fragment's PutChunk message):
    the data fragments are the chunk's own bytes; the parity is PARITY (the M fragments
    the chunk stream computed) or CODER's. Runs in a worker thread: the coder and BLAKE3
    release the GIL."""
    if parity is None:
        fragments = coder.fragments(data, k, m)
    else:
        try:
            fragments = with_parity(data, k, m, parity)
        except errors.InvalidArgument as exc:  # the stream's parity: a bug, not bad input
            raise errors.InternalError(f"chunk stream parity: {exc.message}") from None
    ids = [ids_of(f) for f in fragments]
    return ids, [Benefactors.frame(fid, f) for fid, f in zip(ids, fragments, strict=True)]


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
