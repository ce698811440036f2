"""Grouped puts (docs/erasure_pools.md, "Grouped puts"): the puts a writer has queued for
one benefactor leave as one PutChunks call instead of one call each.

Why: a put's call costs the writer about as much CPU as sending its bytes (the gRPC call
set-up; py-spy of a data-path worker, docs/benchmarks.md), and an `ec:4+2` chunk is six
puts of a quarter of a chunk where a replicated one is R puts of the whole chunk, so the
calls, not the bytes, bound an erasure-coded write.

No put waits for a group to fill (no delay, Nagle-free): per benefactor and write token at
most DEPTH calls are in flight; a put finding a free slot sends at once, everything queued
behind it (up to MAX_BYTES) that found none, so groups form only where calls would have
queued anyway. The task that finds a free slot sends the group for all of its members and
wakes them when it ends; each member gets its own outcome (PutChunks answers each blob on
its own) and the callers' retry logic (another target, per chunk) is unchanged. A sender
cancelled mid-call puts its group back at the head of the queue (re-sending a blob is
harmless: a stored id is only touched), so no other caller's put is lost with it.

A group for a benefactor on this host goes as a memory file over its Unix socket
(mosafs.client.files.localputs), with the same outcomes; the rest as PutChunks.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import trio

from mosafs import errors
from mosafs.client.files.localputs import LocalPuts
from mosafs.client.rpc import Benefactors
from mosafs.rpc import chunkwire

Blob = tuple[bytes, chunkwire.Buffer]  # (id, bytes)

MiB = 1 << 20
MAX_BYTES = 8 * MiB
MAX_COUNT = 256
DEPTH = 2


class _Entry:
    __slots__ = ("blob", "done", "error", "present", "size")

    def __init__(self, blob: Blob) -> None:
        self.blob = blob
        self.size = memoryview(blob[1]).nbytes
        self.done = False
        self.present = False
        self.error: errors.MosafsError | None = None


class _Queue:
    __slots__ = ("entries", "inflight", "lot")

    def __init__(self) -> None:
        self.entries: deque[_Entry] = deque()
        self.inflight = 0
        self.lot = trio.lowlevel.ParkingLot()

    def take(self, max_bytes: int, max_count: int) -> list[_Entry]:
        group = [self.entries.popleft()]
        size = group[0].size
        while self.entries and len(group) < max_count \
                and size + self.entries[0].size <= max_bytes:
            entry = self.entries.popleft()
            size += entry.size
            group.append(entry)
        return group


class PutGroups:
    """Puts through BENEFACTORS, grouped per (benefactor, token). Trio tasks of one run."""

    def __init__(self, benefactors: Benefactors, *, depth: int = DEPTH,
                 max_bytes: int = MAX_BYTES, max_count: int = MAX_COUNT,
                 local: bool = True) -> None:
        self._benefactors = benefactors
        self._depth = depth
        self._max_bytes = max_bytes
        self._max_count = max_count
        self._queues: dict[tuple[str, bytes], _Queue] = {}
        # Groups for benefactors on this host go as memory files (localputs).
        self.local: LocalPuts | None = LocalPuts(benefactors) if local else None

    def close(self) -> None:
        """Release what the local puts keep (their memory files)."""
        if self.local is not None:
            self.local.close()

    async def put_all(self, target: Any, blobs: list[Blob],
                      token: bytes) -> list[bool | errors.MosafsError]:
        """Store every one of BLOBS on TARGET (queued together: they leave in as few calls
        as MAX_BYTES allows); for each, whether it was there already, or the error that
        refused it."""
        key = (target.address, token)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = _Queue()
        entries = [_Entry(blob) for blob in blobs]
        queue.entries.extend(entries)
        try:
            while not all(e.done for e in entries):
                if queue.inflight < self._depth and queue.entries:
                    await self._send(queue, target, token)
                else:
                    await queue.lot.park()
        finally:
            for entry in entries:
                if not entry.done and entry in queue.entries:
                    queue.entries.remove(entry)  # cancelled before it was sent
            if not queue.entries and not queue.inflight:
                self._queues.pop(key, None)
        return [e.error if e.error is not None else e.present for e in entries]

    async def _send(self, queue: _Queue, target: Any, token: bytes) -> None:
        """Send a group from the head of QUEUE; record each member's outcome."""
        group = queue.take(self._max_bytes, self._max_count)
        queue.inflight += 1
        try:
            outcomes = await self._call(target, group, token)
        except BaseException:
            queue.entries.extendleft(reversed(group))  # cancelled: sent again by a waiter
            raise
        else:
            for entry, outcome in zip(group, outcomes, strict=True):
                if isinstance(outcome, errors.MosafsError):
                    entry.error = outcome
                else:
                    entry.present = outcome
                entry.done = True
        finally:
            queue.inflight -= 1
            queue.lot.unpark_all()

    async def _call(self, target: Any, group: list[_Entry],
                    token: bytes) -> list[bool | errors.MosafsError]:
        """Each member's outcome; a failed call is every member's error. The message (one
        copy of every blob's bytes) is built in a worker thread: on a data-path worker
        the trio thread is the one that bounds the writes."""
        blobs = [e.blob for e in group]
        try:
            if self.local is not None and self.local.usable(target.address, blobs):
                done = await self.local.put(target.address, blobs, token)
                if done is not None:
                    return done
            if len(group) == 1:
                frame = await trio.to_thread.run_sync(chunkwire.encode_put, *blobs[0])
                return [await self._benefactors.put(target, frame, token)]
            message = await trio.to_thread.run_sync(chunkwire.encode_puts, blobs)
            return await self._benefactors.put_group(target, message, len(blobs), token)
        except errors.MosafsError as exc:
            return [exc] * len(group)
