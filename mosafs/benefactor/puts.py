"""Puts of chunks and fragments as a benefactor stores them (PutChunk, PutChunks).

A grouped put (PutChunks: the blobs a writer had queued for this benefactor, in one call)
stores its blobs side by side, at most THREADS at a time, each through the same
`ChunkStore.put` as a single put (BLAKE3 checked, written, fsynced, renamed), and answers
each on its own: one bad or refused blob does not fail the others, and a blob that was
stored stays stored whatever happens to the rest. The call's token and the ingest limit
are checked by the caller, once per call, before anything is stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from mosafs import metrics
from mosafs.benefactor.chunkstore import Buffer, ChunkStore
from mosafs.errors import MosafsError

THREADS = 8


class PutChunk(Protocol):
    """A blob to store (mosafs.rpc.chunkwire.PutChunk: DATA a view into the message)."""

    @property
    def id(self) -> bytes: ...

    @property
    def data(self) -> Buffer: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """A blob's put: stored (ERROR None; PRESENT: it was there already) or refused."""

    present: bool = False
    error: MosafsError | None = None


class Puts:
    """Stores blobs into STORE, one or a group at a time (thread-safe)."""

    def __init__(self, store: ChunkStore, threads: int = THREADS) -> None:
        self._store = store
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="put")

    def one(self, blob: PutChunk) -> bool:
        """A PutChunk: store BLOB; whether it was there already. Errors are raised."""
        metrics.BENEFACTOR_PUT_CALLS.labels("PutChunk").inc()
        return self._store_one(blob)

    def _store_one(self, blob: PutChunk) -> bool:
        present = self._store.put(blob.id, blob.data)
        metrics.BENEFACTOR_PUTS.labels("present" if present else "stored").inc()
        metrics.BENEFACTOR_PUT_BYTES.inc(memoryview(blob.data).nbytes)
        return present

    def group(self, blobs: Sequence[PutChunk], method: str = "PutChunks") -> list[Outcome]:
        """Store every blob of BLOBS, in parallel; outcomes[i] answers blobs[i]. An error
        that is not a MosafsError is a bug and is raised (after the others ended). METHOD
        labels the call's metric (PutChunks, or a local put)."""
        metrics.BENEFACTOR_PUT_CALLS.labels(method).inc()
        if len(blobs) == 1:
            return [self._outcome(blobs[0])]
        return list(self._pool.map(self._outcome, blobs))

    def _outcome(self, blob: PutChunk) -> Outcome:
        try:
            return Outcome(present=self._store_one(blob))
        except MosafsError as exc:
            metrics.BENEFACTOR_PUTS.labels("refused").inc()
            return Outcome(error=exc)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
