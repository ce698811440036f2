"""The CPU backend: the gear scan compiled with numba, BLAKE3 from the `blake3` package.

Both release the GIL, so callers get every core by chunking several streams in threads
(the client does); `threads` > 1 additionally spreads the hashing of one batch of chunks.

A stream keeps the bytes it has not yet returned in a chunk in a `_Window`: one copy in,
one copy out (into each Chunk's `bytes`), with the tail moved down only when the window
fills, so the cost per byte does not grow with the size of the stream or of the pieces.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np
import numpy.typing as npt

from mosafs.chunking.base import Backend, BytesLike, Chunk, Chunker, ChunkStream, Hasher
from mosafs.chunking.gear import GEAR, HISTORY
from mosafs.chunking.spec import ChunkerSpec
from mosafs.ids import chunk_id

ByteArray = npt.NDArray[np.uint8]

_CUTS_PER_CALL = 1024
"""Cut ends the compiled scan returns per call (bounds its output array for tiny MINs)."""
_FEED_SLICE = 16 << 20
"""A larger piece is taken in slices of this size, so the window stays near 2 x (MAX +
slice) bytes instead of growing to twice the largest piece ever fed."""
_MIN_WINDOW = 64 << 10
_PARALLEL_MIN_BYTES = 1 << 20
"""Below this much in one hash_many call, thread hand-offs cost more than they save."""


class CpuHasher(Hasher):
    backend = "cpu"

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads

    def hash_many(self, buffers: Sequence[BytesLike]) -> list[bytes]:
        if (self.threads > 1 and len(buffers) > 1
                and sum(memoryview(b).nbytes for b in buffers) >= _PARALLEL_MIN_BYTES):
            return list(_pool(self.threads).map(chunk_id, buffers))
        return [chunk_id(b) for b in buffers]


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    # One pool per size for the life of the process: hashers are made per stream.
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mosafs-blake3")


class _Cutter(Protocol):
    """Where chunks end. `history`: bytes before a chunk's start that must stay buffered."""

    history: int

    def cuts(self, data: ByteArray, start: int, scan: int) -> tuple[list[int], int]:
        """Cut ends after `start` found in data, and the new scan position."""
        ...


class _CdcCutter:
    history = HISTORY  # h_p of the chunk's first candidate may need bytes before its start

    def __init__(self, spec: ChunkerSpec) -> None:
        # Imported here, not at module level: numba costs ~0.5 s to import, and processes
        # that only validate specs (manager, CLI) import this package too.
        from mosafs.chunking import _kernels

        self._find_cuts = _kernels.find_cuts
        self._min = spec.min_size
        self._args = (spec.min_size, spec.avg_size, spec.max_size,
                      np.uint64(spec.mask_s), np.uint64(spec.mask_l))

    def cuts(self, data: ByteArray, start: int, scan: int) -> tuple[list[int], int]:
        if data.shape[0] <= max(scan, start + self._min - 1):
            return [], scan  # nothing new to look at: skip the call (tiny pieces)
        out = np.empty(_CUTS_PER_CALL, dtype=np.int64)
        found: list[int] = []
        while True:
            count, start, scan = self._find_cuts(data, GEAR, start, scan, *self._args, out)
            found.extend(out[:count].tolist())
            if count < out.shape[0]:
                return found, scan


class _FixedCutter:
    history = 0

    def __init__(self, spec: ChunkerSpec) -> None:
        self._size = spec.max_size

    def cuts(self, data: ByteArray, start: int, scan: int) -> tuple[list[int], int]:
        return list(range(start + self._size, data.shape[0] + 1, self._size)), scan


def _cutter(spec: ChunkerSpec) -> _Cutter:
    return _CdcCutter(spec) if spec.kind == "cdc" else _FixedCutter(spec)


def _byte_array(piece: BytesLike) -> ByteArray:
    """A read-only uint8 array over the piece's memory, without copying where possible.

    Read-only also keeps the compiled scan to one specialisation (one compile, one cache
    entry) whatever buffer type the caller passes.
    """
    view = memoryview(piece)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    array = np.frombuffer(view, dtype=np.uint8)
    array.flags.writeable = False
    return array


def _make_chunks(data: ByteArray, base: int, start: int, cuts: list[int],
                 hasher: CpuHasher, whole: bytes | None = None) -> list[Chunk]:
    """Chunks for data[start:cuts[0]], data[cuts[0]:cuts[1]], ... at stream offset base."""
    if not cuts:
        return []
    bounds = list(zip([start, *cuts[:-1]], cuts, strict=True))
    if whole is not None and bounds == [(0, len(whole))]:
        return [Chunk(0, len(whole), hasher.hash_many([whole])[0], whole)]  # no copy at all
    chunks: list[Chunk] = []
    # Copy and hash a few chunks at a time (one per hashing thread), not all copies first,
    # so each copy is hashed while it is still in cache. Hashing the copies rather than
    # the window also means threads hash immutable bytes.
    step = hasher.threads
    for first in range(0, len(bounds), step):
        group = bounds[first:first + step]
        pieces = [data[a:b].tobytes() for a, b in group]
        ids = hasher.hash_many(pieces)
        chunks.extend(Chunk(base + a, b - a, digest, piece)
                      for (a, b), digest, piece in zip(group, ids, pieces, strict=True))
    return chunks


class _Window:
    """The buffered bytes of a stream: _buf[_lo:_hi] holds stream offsets [base, ...)."""

    __slots__ = ("_buf", "_hi", "_lo", "base")

    def __init__(self) -> None:
        self._buf: ByteArray = np.empty(0, dtype=np.uint8)
        self._lo = 0
        self._hi = 0
        self.base = 0

    def append(self, piece: ByteArray) -> None:
        n = piece.shape[0]
        if self._hi + n > self._buf.shape[0]:
            self._make_room(n)
        self._buf[self._hi:self._hi + n] = piece
        self._hi += n

    def _make_room(self, n: int) -> None:
        live = self._hi - self._lo
        need = live + n
        # Grow to twice the need, or move the tail down in place when it fills at most
        # half: either way at least half the window is free afterwards, so moving the
        # tail (< MAX + history bytes) is amortised over as many appended bytes.
        target = self._buf if 2 * need <= self._buf.shape[0] else np.empty(
            max(2 * need, _MIN_WINDOW), dtype=np.uint8)
        target[:live] = self._buf[self._lo:self._hi]  # numpy handles the overlap
        self._buf, self._lo, self._hi = target, 0, live

    def view(self) -> ByteArray:
        """The buffered bytes, read-only (valid until the next append)."""
        view = self._buf[self._lo:self._hi]
        view.flags.writeable = False
        return view

    def drop(self, count: int) -> None:
        """Forget the first `count` buffered bytes."""
        self._lo += count
        self.base += count

    def release(self) -> None:
        self._buf = np.empty(0, dtype=np.uint8)
        self.base += self._hi - self._lo
        self._lo = self._hi = 0


class CpuStream(ChunkStream):
    def __init__(self, cutter: _Cutter, hasher: CpuHasher) -> None:
        self._cutter = cutter
        self._hasher = hasher
        self._window = _Window()
        self._start = 0  # current chunk's start, relative to the window
        self._scan = 0   # first position not yet scanned, relative to the window
        self._fed = 0
        self._done = False

    @property
    def pending(self) -> int:  # what was returned is where the open chunk starts
        return self._fed - self._window.base - self._start

    def feed(self, piece: BytesLike) -> list[Chunk]:
        self._check_open()
        data = _byte_array(piece)
        chunks: list[Chunk] = []
        for offset in range(0, data.shape[0], _FEED_SLICE):
            part = data[offset:offset + _FEED_SLICE]
            self._window.append(part)
            self._fed += part.shape[0]
            chunks.extend(self._drain())
        return chunks

    def finish(self) -> list[Chunk]:
        self._check_open()
        self._done = True
        data = self._window.view()
        end = data.shape[0]
        chunks = (_make_chunks(data, self._window.base, self._start, [end], self._hasher)
                  if end > self._start else [])
        self._window.release()
        self._start = self._scan = 0
        return chunks

    def _drain(self) -> list[Chunk]:
        data = self._window.view()
        cuts, self._scan = self._cutter.cuts(data, self._start, self._scan)
        chunks = _make_chunks(data, self._window.base, self._start, cuts, self._hasher)
        if cuts:
            self._start = cuts[-1]
        # Keep only the open chunk and the history its first hash may need.
        drop = max(0, self._start - self._cutter.history)
        if drop:
            self._window.drop(drop)
            self._start -= drop
            self._scan -= drop
        return chunks

    def _check_open(self) -> None:
        if self._done:
            raise ValueError("this chunk stream is finished; start a new one with stream()")


class CpuChunker(Chunker):
    backend = "cpu"

    def __init__(self, spec: ChunkerSpec, hasher: CpuHasher) -> None:
        super().__init__(spec)
        self._hasher = hasher
        self._cutter = _cutter(spec)

    def chunk_all(self, data: BytesLike) -> list[Chunk]:
        array = _byte_array(data)
        end = array.shape[0]
        if end == 0:
            return []
        cuts, _ = self._cutter.cuts(array, 0, 0)
        if not cuts or cuts[-1] < end:
            cuts.append(end)  # the end of the stream ends the last chunk
        whole = data if isinstance(data, bytes) else None
        return _make_chunks(array, 0, 0, cuts, self._hasher, whole)

    def stream(self, *, pipelined: bool = False) -> CpuStream:
        return CpuStream(self._cutter, self._hasher)


class CpuBackend(Backend):
    name = "cpu"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def chunker(self, spec: ChunkerSpec, threads: int, *,
                pinned_bytes: int | None = None) -> CpuChunker:
        return CpuChunker(spec, CpuHasher(threads))

    def hasher(self, threads: int) -> CpuHasher:
        return CpuHasher(threads)

