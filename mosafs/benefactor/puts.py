"""Puts of chunks and fragments as a benefactor stores them (PutChunk, PutChunks).

A grouped put (PutChunks: the blobs a writer had queued for this benefactor, in one call)
stores its blobs side by side, at most THREADS at a time, each through the same
`ChunkStore.put` as a single put (BLAKE3 checked, written, fsynced, renamed), and answers
each on its own: one bad or refused blob does not fail the others, and a blob that was
stored stays stored whatever happens to the rest. That holds for a bug too: an exception
that is not a MosafsError is logged with its traceback, once, and answers its blob only
(InternalError, as a single put's bug answers INTERNAL), never the whole call, which
would hide the blobs already stored. The call's token and the ingest limit are checked
by the caller, once per call, before anything is stored.

A local put's blobs lie in the writer's memory file, which the writer can still write
while they are stored (mosafs.benefactor.localreads): `from_file` reads each blob into a
buffer of the storing thread (one copy, made by the kernel without the GIL) and stores
that, so the bytes whose BLAKE3 is checked are the bytes written. Stored straight from a
map of the file, a blob could change between its check and its write and be kept under
an id it does not hash to, for every later writer of that content to dedupe against.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, TypeVar

from mosafs import metrics
from mosafs.benefactor.store import Buffer, ChunkStore
from mosafs.errors import InternalError, InvalidArgument, MosafsError

log = logging.getLogger(__name__)

THREADS = 8
# A storing thread keeps a read buffer up to this size (chunks are up to 64 MiB: eight
# threads keeping that much would hold 512 MiB for good).
KEPT_BUFFER = 8 << 20
T = TypeVar("T")
_WAITED = metrics.BENEFACTOR_PUT_SECONDS.labels("wait")
_STORED = metrics.BENEFACTOR_PUT_SECONDS.labels("store")


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
        self._local = threading.local()  # each storing thread's read buffer (from_file)

    def one(self, blob: PutChunk) -> bool:
        """A PutChunk: store BLOB; whether it was there already. Errors are raised."""
        metrics.BENEFACTOR_PUT_CALLS.labels("PutChunk").inc()
        return self._stored(blob.id, blob.data)

    def _stored(self, raw_id: bytes, data: Buffer) -> bool:
        present = self._store.put(raw_id, data)
        metrics.BENEFACTOR_PUTS.labels("present" if present else "stored").inc()
        metrics.BENEFACTOR_PUT_BYTES.inc(memoryview(data).nbytes)
        return present

    def group(self, blobs: Sequence[PutChunk], method: str = "PutChunks") -> list[Outcome]:
        """Store every blob of BLOBS, in parallel; outcomes[i] answers blobs[i], an error
        included (module docstring). METHOD labels the call's metric (PutChunks, or a
        local put)."""
        return self._all(blobs, lambda blob: self._stored(blob.id, blob.data), method)

    def from_file(self, fd: int, spans: Sequence[tuple[bytes, int, int]],
                  method: str = "local") -> list[Outcome]:
        """As group(), for blobs (id, offset, length) in the file FD, which its writer may
        still change (module docstring): each is read into the storing thread's buffer
        and stored from there."""
        return self._all(spans, lambda span: self._stored(span[0], self._read(fd, *span[1:])),
                         method)

    def _read(self, fd: int, offset: int, length: int) -> memoryview:
        """LENGTH bytes of FD at OFFSET in this thread's buffer (grown to the largest blob
        it read up to KEPT_BUFFER bytes, then reused: no page is allocated per blob; a
        larger blob gets a buffer of its own); valid until this thread's next read."""
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < length:
            buf = bytearray(length)
            if length <= KEPT_BUFFER:
                self._local.buf = buf
        view = memoryview(buf)[:length]
        got = 0
        while got < length:
            n = os.preadv(fd, [view[got:]], offset + got)
            if n <= 0:
                raise InvalidArgument(f"the memory file ends inside a blob: {got} of "
                                      f"{length} bytes at offset {offset}; nothing stored")
            got += n
        return view

    def _all(self, items: Sequence[T], store: Callable[[T], bool], method: str
             ) -> list[Outcome]:
        metrics.BENEFACTOR_PUT_CALLS.labels(method).inc()
        if len(items) == 1:
            return [_outcome(store, items[0])]
        queued = [time.monotonic()] * len(items)
        return list(self._pool.map(_outcome, [store] * len(items), items, queued))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _outcome(store: Callable[[T], bool], item: T, queued: float | None = None) -> Outcome:
    """ITEM stored; QUEUED: when it was handed to the storing threads (its wait is
    measured from there)."""
    started = time.monotonic()
    if queued is not None:
        _WAITED.observe(started - queued)
    try:
        return Outcome(present=store(item))
    except MosafsError as exc:
        metrics.BENEFACTOR_PUTS.labels("refused").inc()
        return Outcome(error=exc)
    except Exception:  # a bug: logged here, the only place, and answered for ITEM only
        log.exception("bug while storing a blob of a grouped put")
        metrics.BENEFACTOR_PUTS.labels("refused").inc()
        return Outcome(error=InternalError("internal error storing this blob (the "
                                           "benefactor's log has the traceback)"))
    finally:
        _STORED.observe(time.monotonic() - started)
