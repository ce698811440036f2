"""Fetching chunks for readers: an LRU cache of verified chunk bytes, one fetch per id at a
time however many readers want it, replica fail-over, and read-ahead. Each fetch carries
the chunk's read token (mosafs.manager.tokens); a chunk every replica refuses for its
token is TokenRefused, so the reader can ask for a fresh block-map.

An erasure-coded chunk (docs/erasure_pools.md) is read from its fragments: the K data
fragments in parallel (each verified against its BLAKE3 as it arrives), joined and cut to
the chunk's length, no decoding. A fragment that is missing, unreachable, refused or
corrupt is replaced by the next one not tried yet (parity after data), and with any
parity among the K the chunk is decoded (the coder runs in a worker thread). The chunk is
then verified against its id, as every chunk is: a degraded read is a read like any
other to the application."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import cachetools
import trio

from mosafs import errors, ids
from mosafs.client.files.blockmap import Coded
from mosafs.client.files.remote import WorkerPool, fetch_remote
from mosafs.client.rpc import Benefactors
from mosafs.manager.pools import fragment_size

# A chunk's verified bytes: a view into the message that brought it (no copy; the cache
# keeps the message alive) or bytes.
ChunkBytes = bytes | memoryview

log = logging.getLogger(__name__)


class ChunkFetcher:
    def __init__(self, benefactors: Benefactors, cache_bytes: int,
                 spawn: Callable[..., None], *,
                 cpu: Callable[..., Awaitable[Any]] | None = None,
                 coder: Callable[[], Any] | None = None) -> None:
        """CPU runs a function in a worker thread (joining, decoding and verifying the
        fragments of erasure-coded chunks); CODER makes the erasure coder."""
        self._benefactors = benefactors
        self._cpu = cpu or _in_thread
        self._coder = coder
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
                  token: bytes = b"", coded: Coded | None = None) -> ChunkBytes:
        while True:
            data = self._cache.get(chunk_id)
            if data is not None:
                return data
            event = self._inflight.get(chunk_id)
            if event is None:
                return await self._fetch(chunk_id, addresses, token, coded)
            await event.wait()  # another task fetched it; if that failed, try ourselves

    def prefetch(self, chunk_id: bytes, addresses: Sequence[str], token: bytes = b"",
                 coded: Coded | None = None) -> None:
        if chunk_id not in self._cache and chunk_id not in self._inflight:
            self._spawn(self._prefetch, chunk_id, list(addresses), token, coded)

    async def _prefetch(self, chunk_id: bytes, addresses: list[str], token: bytes,
                        coded: Coded | None) -> None:
        # A failed prefetch is silent: the real read of this chunk retries and reports it.
        with contextlib.suppress(errors.MosafsError):
            await self.get(chunk_id, addresses, token, coded)  # joins a reader's fetch

    async def _fetch(self, chunk_id: bytes, addresses: Sequence[str],
                     token: bytes, coded: Coded | None) -> ChunkBytes:
        # Only called when no fetch of this id is in flight (checked without a checkpoint
        # in between), so this task owns the entry until it sets the event.
        event = self._inflight[chunk_id] = trio.Event()
        try:
            data = await self._fetch_somewhere(chunk_id, addresses, token, coded)
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
                               token: bytes, coded: Coded | None) -> ChunkBytes:
        """Through a data-path worker when the mount has one; here when it has none, or
        when the worker died under the request (its other streams fail, a read need not)."""
        link = self.workers.pick() if self.workers is not None else None
        if link is not None:
            with contextlib.suppress(errors.InternalError):
                return await fetch_remote(link, chunk_id, addresses, token, coded)
        return await self.fetch(chunk_id, addresses, token, coded)

    async def fetch(self, chunk_id: bytes, addresses: Sequence[str],
                    token: bytes = b"", coded: Coded | None = None) -> ChunkBytes:
        """A chunk's verified bytes from the first replica that has an intact copy, else
        (erasure-coded) from its fragments (not cached: what a data-path worker does for
        its mount)."""
        if coded is None:
            return await self._fetch_whole(chunk_id, addresses, token)
        if addresses:
            with contextlib.suppress(errors.MosafsError):
                return await self._fetch_whole(chunk_id, addresses, token)
        return await self._fetch_coded(chunk_id, coded)

    async def _fetch_coded(self, chunk_id: bytes, coded: Coded) -> ChunkBytes:
        """An erasure-coded chunk from K of its fragments (module docstring)."""
        k, width = coded.k, coded.k + coded.m
        known = [i for i in range(width) if coded.addresses[i]]
        # Data before parity (no decoding), live holders before the others.
        order = sorted(known, key=lambda i: (not coded.live[i], i >= k, i))
        size = fragment_size(coded.length, k) if coded.length else 0
        got: dict[int, Any] = {}
        failures: list[str] = []
        flags = {"corrupt": False, "refused": False}

        async def take() -> None:
            """One of the K fragments: the next candidate, and the next after a failure."""
            while order and len(got) < k:
                i = order.pop(0)
                address, fid, token = coded.addresses[i], coded.ids[i], coded.tokens[i]
                try:
                    data = await self._benefactors.get(address, fid, token)
                except errors.IntegrityError as exc:
                    flags["corrupt"] = True
                    log.warning("fragment %d of chunk %s from %s is corrupt: %s", i,
                                chunk_id.hex(), address, exc)
                    failures.append(f"fragment {i} at {address}: corrupt")
                    self._spawn(self._report_bad, address, fid, token)
                    continue
                except errors.TokenRefused as exc:
                    flags["refused"] = True
                    failures.append(f"fragment {i} at {address}: {exc.message}")
                    continue
                except errors.MosafsError as exc:
                    failures.append(f"fragment {i} at {address}: {exc.message}")
                    continue
                if len(data) != size:
                    failures.append(f"fragment {i} at {address}: {len(data)} bytes, "
                                    f"not {size}")
                    continue
                got[i] = data
                return

        async with trio.open_nursery() as nursery:
            for _ in range(min(k, len(order))):
                nursery.start_soon(take)
        if len(got) < k:
            reason = "; ".join(failures) or "no fragment holder is known"
            what = (f"chunk {chunk_id.hex()} (ec:{coded.k}+{coded.m}): {len(got)} of the "
                    f"{k} fragments needed could be read ({reason})")
            if flags["corrupt"]:
                raise errors.IntegrityError(what)
            if flags["refused"]:
                raise errors.TokenRefused(what)
            raise errors.Unavailable(what)
        if failures:
            log.info("chunk %s read degraded from fragments %s (%s)", chunk_id.hex(),
                     sorted(got), "; ".join(failures))
        if self._coder is None:
            raise errors.InternalError(f"chunk {chunk_id.hex()}: no erasure coder to read "
                                       "fragments with")
        return await self._cpu(_assemble, chunk_id, got, coded, self._coder())

    async def _fetch_whole(self, chunk_id: bytes, addresses: Sequence[str],
                           token: bytes) -> ChunkBytes:
        """A chunk from the first replica that has an intact copy."""
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


def _assemble(chunk_id: bytes, got: dict[int, Any], coded: Coded, coder: Any) -> memoryview:
    """The chunk from K verified fragments (GOT: index -> bytes): CODER joins the data
    fragments and decodes only those missing; verified against CHUNK_ID, since the
    fragment ids are the writer's word. Runs in a worker thread."""
    out = coder.decode(got, coded.k, coded.m, coded.length)
    ids.verify(chunk_id, out)  # every chunk, however it was put together
    return memoryview(out)


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await trio.to_thread.run_sync(functools.partial(fn, *args))
