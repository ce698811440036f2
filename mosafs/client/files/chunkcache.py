"""Fetching chunks for readers: an LRU cache of verified chunk bytes, one fetch per id at a
time however many readers want it, replica fail-over, and read-ahead. Each fetch carries
the chunk's read token (mosafs.manager.tokens); a chunk every replica refuses for its
token is TokenRefused, so the reader can ask for a fresh block-map."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence

import cachetools
import trio

from mosafs import errors
from mosafs.client.files.remote import WorkerPool, fetch_remote
from mosafs.client.rpc import Benefactors

# A chunk's verified bytes: a view into the message that brought it (no copy; the cache
# keeps the message alive) or bytes.
ChunkBytes = bytes | memoryview

log = logging.getLogger(__name__)


class ChunkFetcher:
    def __init__(self, benefactors: Benefactors, cache_bytes: int,
                 spawn: Callable[..., None]) -> None:
        self._benefactors = benefactors
        self._cache: cachetools.LRUCache[bytes, ChunkBytes] = cachetools.LRUCache(
            maxsize=cache_bytes, getsizeof=len)
        self._inflight: dict[bytes, trio.Event] = {}
        self._spawn = spawn
        # Data-path workers, when the mount has them: they fetch and verify chunks (gRPC,
        # TLS, BLAKE3 on their own cores) and hand the bytes over their socket.
        self.workers: WorkerPool | None = None

    def cached(self, chunk_id: bytes) -> ChunkBytes | None:
        return self._cache.get(chunk_id)

    def remember(self, chunk_id: bytes, data: ChunkBytes) -> None:
        if len(data) <= self._cache.maxsize:
            self._cache[chunk_id] = data

    async def get(self, chunk_id: bytes, addresses: Sequence[str],
                  token: bytes = b"") -> ChunkBytes:
        while True:
            data = self._cache.get(chunk_id)
            if data is not None:
                return data
            event = self._inflight.get(chunk_id)
            if event is None:
                return await self._fetch(chunk_id, addresses, token)
            await event.wait()  # another task fetched it; if that failed, try ourselves

    def prefetch(self, chunk_id: bytes, addresses: Sequence[str], token: bytes = b"") -> None:
        if chunk_id not in self._cache and chunk_id not in self._inflight:
            self._spawn(self._prefetch, chunk_id, list(addresses), token)

    async def _prefetch(self, chunk_id: bytes, addresses: list[str], token: bytes) -> None:
        # A failed prefetch is silent: the real read of this chunk retries and reports it.
        with contextlib.suppress(errors.MosafsError):
            await self.get(chunk_id, addresses, token)  # joins a reader's fetch meanwhile

    async def _fetch(self, chunk_id: bytes, addresses: Sequence[str],
                     token: bytes) -> ChunkBytes:
        # Only called when no fetch of this id is in flight (checked without a checkpoint
        # in between), so this task owns the entry until it sets the event.
        event = self._inflight[chunk_id] = trio.Event()
        try:
            data = await self._fetch_somewhere(chunk_id, addresses, token)
            self.remember(chunk_id, data)
            return data
        finally:
            del self._inflight[chunk_id]
            event.set()

    async def _report_bad(self, address: str, chunk_id: bytes, token: bytes) -> None:
        # The benefactor answers DATA_LOSS once it has found and deleted the bad copy, or
        # the chunk: either way nothing more to do here; a failed report waits for scrub.
        with contextlib.suppress(errors.MosafsError):
            await self._benefactors.report_bad(address, chunk_id, token)

    async def _fetch_somewhere(self, chunk_id: bytes, addresses: Sequence[str],
                               token: bytes) -> ChunkBytes:
        """Through a data-path worker when the mount has one; here when it has none, or
        when the worker died under the request (its other streams fail, a read need not)."""
        link = self.workers.pick() if self.workers is not None else None
        if link is not None:
            with contextlib.suppress(errors.InternalError):
                return await fetch_remote(link, chunk_id, addresses, token)
        return await self.fetch(chunk_id, addresses, token)

    async def fetch(self, chunk_id: bytes, addresses: Sequence[str],
                    token: bytes = b"") -> ChunkBytes:
        """A chunk's verified bytes from the first replica that has an intact copy (not
        cached: what a data-path worker does for its mount)."""
        failures: list[str] = []
        corrupt = refused = False
        for address in addresses:
            try:
                return await self._benefactors.get(address, chunk_id, token)
            except errors.IntegrityError as exc:
                corrupt = True
                log.warning("chunk %s from %s is corrupt: %s", chunk_id.hex(), address, exc)
                failures.append(f"{address}: corrupt")
                self._spawn(self._report_bad, address, chunk_id, token)
            except errors.TokenRefused as exc:
                refused = True
                failures.append(f"{address}: {exc.message}")
            except errors.MosafsError as exc:
                failures.append(f"{address}: {exc.message}")
        reason = "; ".join(failures) or "no replica is known"
        if corrupt:
            raise errors.IntegrityError(f"chunk {chunk_id.hex()} has no intact copy ({reason})")
        if refused:  # the others unreachable at best: a fresh token is what may help
            raise errors.TokenRefused(f"chunk {chunk_id.hex()} was refused ({reason})")
        raise errors.Unavailable(f"chunk {chunk_id.hex()} could not be read ({reason})")
