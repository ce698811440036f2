"""The chunker/hasher family: what every backend (CPU now, GPU later) provides.

A backend is a class registered under a name ("cpu", "gpu"); it says whether it can run
here and builds chunkers and hashers. Callers only see the abstract types below, so a
CuPy backend plugs in beside the CPU one without changes elsewhere.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mosafs.chunking.spec import ChunkerSpec

BACKEND_CHOICES = ("auto", "cpu", "gpu")  # what --hash-backend takes (mosafs.chunking.registry)

BytesLike = bytes | bytearray | memoryview
"""Any C-contiguous buffer works at run time (numpy arrays included); these are typed."""


@dataclass(slots=True)
class Chunk:
    """One chunk of a stream: where it is, its id (BLAKE3-256, 32 raw bytes), its bytes.

    parity: the chunk's M erasure parity fragments (DESIGN §10) when its stream computed
    them (the GPU stream's `parity=` option; None otherwise, and for chunks below the
    pool's threshold). They are the stream's own copies: valid as long as referenced."""

    offset: int
    length: int
    id: bytes
    data: bytes = field(repr=False)  # a chunk is up to 64 MiB: keep it out of reprs and logs
    parity: tuple[memoryview, ...] | None = field(default=None, repr=False)


class Hasher(ABC):
    """Chunk ids of many buffers at once (batching is what makes a GPU worth it)."""

    backend: ClassVar[str]

    @abstractmethod
    def hash_many(self, buffers: Sequence[BytesLike]) -> list[bytes]:
        """BLAKE3-256 digest of each buffer, in order."""


class ChunkStream(ABC):
    """Chunks one stream that arrives in pieces; the result does not depend on the split."""

    in_place: ClassVar[bool] = False
    """True when pinned_buffer() gives memory to write the next bytes into (no copy)."""

    @abstractmethod
    def feed(self, piece: BytesLike) -> list[Chunk]:
        """Add the next piece; return the chunks it completed (often none).

        The stream copies what it keeps, so the caller may reuse `piece` at once.
        """

    @abstractmethod
    def finish(self) -> list[Chunk]:
        """End the stream: the last chunk, if any bytes are left. The stream is then done."""

    def pinned_buffer(self) -> Any | None:
        """Where the caller may write the stream's next bytes in place, or None.

        A backend that copies input into memory of its own (the GPU's pinned host buffers)
        returns a writable uint8 array there; the caller writes into its start and hands
        the count to `feed_pinned`. Bytes past what was handed over stay the caller's until
        handed over too, so a caller may keep writing into the same array while earlier
        counts are being fed. The array is valid until it is full; then ask again.
        """
        return None

    def feed_pinned(self, count: int) -> list[Chunk]:
        """Like feed() for the next COUNT bytes written into the array of pinned_buffer()."""
        raise TypeError(f"{type(self).__name__} has no pinned buffer")

    # What every stream counts as it takes bytes and returns chunks.
    _fed: int = 0
    _returned: int = 0

    @property
    def fed(self) -> int:
        """Bytes fed so far."""
        return self._fed

    @property
    def pending(self) -> int:
        """Bytes fed but not yet returned in a chunk."""
        return self._fed - self._returned


class Chunker(ABC):
    """Cuts byte streams into chunks by one spec and names each chunk by its id."""

    backend: ClassVar[str]

    def __init__(self, spec: ChunkerSpec) -> None:
        self.spec = spec

    @abstractmethod
    def chunk_all(self, data: BytesLike) -> list[Chunk]:
        """Chunk a whole stream held in memory (same result as one feed and finish)."""

    @abstractmethod
    def stream(self, *, pipelined: bool = False) -> ChunkStream:
        """A new, empty stream.

        pipelined=True lets feed() return before the chunks its bytes complete are known
        (they come from a later feed or from finish()): a backend that works
        asynchronously (the GPU) keeps several buffers in flight that way. Backends that
        compute synchronously ignore it.
        """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec} backend={self.backend}>"


class Backend(ABC):
    """One member of the family: a name, an availability check and two factories."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def unavailable_reason(cls) -> str | None:
        """None when this backend can run here, else why not (completes "... requested but")."""

    @abstractmethod
    def chunker(self, spec: ChunkerSpec, threads: int, *,
                pinned_bytes: int | None = None) -> Chunker:
        """PINNED_BYTES: the bound on page-locked host memory (a backend that uses none
        ignores it)."""

    @abstractmethod
    def hasher(self, threads: int) -> Hasher: ...
