"""The "oracle" backend: precomputed chunks in ~no time, for benchmarks only.

A benchmark of everything around chunking (the write path, uploads, the manager) wants
a chunker that costs nothing, to see the ceiling the rest of the system allows. The
oracle is that chunker: it returns chunks and ids that a real backend computed earlier
for the same input ("priming"), without looking at more than a few bytes of it.

    from mosafs.chunking import make_chunker, oracle
    chunks = make_chunker(spec, "cpu").chunk_all(data)   # any real backend
    oracle.prime(spec, data, chunks)     # or oracle.prime(spec, data): chunked on the CPU
    fast = make_chunker(spec, "oracle")  # works only once something is primed
    fast.chunk_all(data)                 # the primed chunks (the same Chunk objects)
    oracle.clear()                       # forget everything; "oracle" is unavailable again

Rules:

* Importing this module registers the backend under the name "oracle" (it is not in
  AUTO_ORDER and never chosen by "auto"). Until `prime` has been called,
  `unavailable_reason()` says so and `make_chunker(spec, "oracle")` is a ConfigError.
* An input is recognised by its spec and a BLAKE3 digest of its first 64 KiB (the whole
  input if shorter); `chunk_all` and `finish` also check its length. Priming two inputs
  that share spec and first 64 KiB is refused. An input that was not primed raises
  ValueError: the oracle never computes chunks itself.
* A stream returns primed chunks as soon as the bytes fed cover them (once 64 KiB, or
  the whole input, have been seen). Its pieces are not copied beyond the first 64 KiB.
* `make_hasher("oracle").hash_many(buffers)` returns the ids of primed chunks, found by
  (length, digest of the chunk's first 64 KiB); other buffers raise ValueError.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import blake3

from mosafs.chunking.base import Backend, BytesLike, Chunk, Chunker, ChunkStream, Hasher
from mosafs.chunking.registry import make_chunker, register_backend
from mosafs.chunking.spec import ChunkerSpec, parse_spec

KEY_BYTES = 64 * 1024
"""Bytes of an input's start that identify it."""


@dataclass(frozen=True, slots=True)
class _Entry:
    length: int
    chunks: tuple[Chunk, ...]


_inputs: dict[tuple[str, bytes], _Entry] = {}
_ids: dict[tuple[int, bytes], bytes] = {}
_lock = threading.Lock()


def _key_digest(view: memoryview) -> bytes:
    return blake3.blake3(view[:KEY_BYTES]).digest()


def _view(data: BytesLike) -> memoryview:
    view = memoryview(data)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def prime(spec: ChunkerSpec | str, data: BytesLike,
          chunks: Sequence[Chunk] | None = None) -> list[Chunk]:
    """Remember the chunks of `data` under `spec` (computed on the CPU when not given).

    Returns the primed chunks. The chunks must cover data exactly, in order.
    """
    if not isinstance(spec, ChunkerSpec):
        spec = parse_spec(spec)
    view = _view(data)
    if chunks is None:
        chunks = make_chunker(spec, "cpu").chunk_all(view)
    offset = 0
    for chunk in chunks:
        if chunk.offset != offset or chunk.length != len(chunk.data):
            raise ValueError("oracle.prime: chunks must cover the data in order")
        offset += chunk.length
    if offset != view.nbytes:
        raise ValueError(f"oracle.prime: chunks cover {offset} bytes, data has {view.nbytes}")
    key = (str(spec), _key_digest(view))
    entry = _Entry(view.nbytes, tuple(chunks))
    with _lock:
        old = _inputs.get(key)
        if old is not None and old.length != entry.length:
            raise ValueError("oracle.prime: another primed input has the same spec and "
                             f"first {KEY_BYTES} bytes")
        _inputs[key] = entry
        for chunk in chunks:
            _ids[(chunk.length, _key_digest(memoryview(chunk.data)))] = chunk.id
    return list(chunks)


def clear() -> None:
    """Forget every primed input."""
    with _lock:
        _inputs.clear()
        _ids.clear()


def primed() -> int:
    """How many inputs are primed."""
    with _lock:
        return len(_inputs)


def _lookup(spec: ChunkerSpec, digest: bytes) -> _Entry:
    with _lock:
        entry = _inputs.get((str(spec), digest))
    if entry is None:
        raise ValueError(f"oracle: this input was not primed for {spec} "
                         "(mosafs.chunking.oracle.prime)")
    return entry


class OracleStream(ChunkStream):
    def __init__(self, spec: ChunkerSpec) -> None:
        self._spec = spec
        self._head = bytearray()
        self._entry: _Entry | None = None
        self._next = 0  # index of the next chunk to return
        self._fed = 0
        self._returned = 0
        self._done = False

    def feed(self, piece: BytesLike) -> list[Chunk]:
        if self._done:
            raise ValueError("this chunk stream is finished; start a new one with stream()")
        view = _view(piece)
        if len(self._head) < KEY_BYTES:
            self._head += view[:KEY_BYTES - len(self._head)]
        self._fed += view.nbytes
        if self._entry is None and len(self._head) >= KEY_BYTES:
            self._entry = _lookup(self._spec, _key_digest(memoryview(self._head)))
        return self._ready()

    def finish(self) -> list[Chunk]:
        if self._done:
            raise ValueError("this chunk stream is finished; start a new one with stream()")
        self._done = True
        if self._fed == 0:
            return []
        if self._entry is None:
            self._entry = _lookup(self._spec, _key_digest(memoryview(self._head)))
        if self._entry.length != self._fed:
            raise ValueError(f"oracle: the primed input has {self._entry.length} bytes, "
                             f"this stream {self._fed}")
        return self._ready()

    def _ready(self) -> list[Chunk]:
        entry = self._entry
        if entry is None:
            return []
        out: list[Chunk] = []
        chunks = entry.chunks
        while self._next < len(chunks):
            chunk = chunks[self._next]
            if chunk.offset + chunk.length > self._fed:
                break
            out.append(chunk)
            self._next += 1
            self._returned += chunk.length
        return out


class OracleChunker(Chunker):
    backend = "oracle"

    def chunk_all(self, data: BytesLike) -> list[Chunk]:
        view = _view(data)
        if view.nbytes == 0:
            return []
        entry = _lookup(self.spec, _key_digest(view))
        if entry.length != view.nbytes:
            raise ValueError(f"oracle: the primed input has {entry.length} bytes, "
                             f"this one {view.nbytes}")
        return list(entry.chunks)

    def stream(self, *, pipelined: bool = False) -> OracleStream:
        return OracleStream(self.spec)


class OracleHasher(Hasher):
    backend = "oracle"

    def hash_many(self, buffers: Sequence[BytesLike]) -> list[bytes]:
        out = []
        for buf in buffers:
            view = _view(buf)
            with _lock:
                found = _ids.get((view.nbytes, _key_digest(view)))
            if found is None:
                raise ValueError("oracle: this buffer is not a primed chunk")
            out.append(found)
        return out


class OracleBackend(Backend):
    name = "oracle"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if primed():
            return None
        return "no input has been primed (call mosafs.chunking.oracle.prime first)"

    def chunker(self, spec: ChunkerSpec, threads: int, *,
                pinned_bytes: int | None = None) -> OracleChunker:
        return OracleChunker(spec)

    def hasher(self, threads: int) -> OracleHasher:
        return OracleHasher()


register_backend(OracleBackend)
