"""The ChunkStore interface of a benefactor's chunk storage, shared by every backend
(mosafs.benefactor.chunkstore holds the file-system one), and what its callers see of a
store: usage, inventory items, scrub verdicts.

Domain code: no gRPC here (an import-linter contract enforces it). Every method validates
its ids and raises mosafs.errors classes; the servicer maps them to status codes.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Self

from mosafs.errors import InvalidArgument
from mosafs.ids import check_id, chunk_id

Buffer = bytes | bytearray | memoryview

# One HasChunks request may name this many ids: 100k ids are 3.2 MB on the wire and take
# well under a second of stat() calls; a larger batch is a client bug or an attack.
MAX_HAS_BATCH = 100_000


@dataclass(frozen=True)
class Usage:
    """What a store holds and how much more it may take."""

    chunks: int
    stored_bytes: int
    capacity_bytes: int
    free_bytes: int


SOUND = "sound"      # scrub: the stored bytes hash to the id
CORRUPT = "corrupt"  # scrub: they do not; the copy was deleted
GONE = "gone"        # scrub: not stored (deleted or never there)


@dataclass(frozen=True)
class InventoryItem:
    id: bytes
    touched_ns: int  # wall clock of the last put (stored, or found already present)
    length: int


class ChunkStore(abc.ABC):
    """Immutable chunks by id. Implementations are thread-safe.

    Contract shared by every backend (tests/unit/test_chunkstore.py checks it):
    - put() refuses data whose BLAKE3 is not the id (InvalidArgument, nothing stored) and
      returns only once the chunk is durable; it returns True when the chunk was already
      stored (nothing rewritten).
    - get() never returns bytes that do not hash to the id (IntegrityError instead);
      NotFound when absent. With verify=False it skips the hash (a reader verifies, DESIGN
      §3) but still refuses a copy it knows to be corrupt.
    - has() is True only for chunks that get() can serve as far as the store knows.
    """

    @abc.abstractmethod
    def put(self, raw_id: bytes, data: Buffer) -> bool:
        """Store DATA under RAW_ID; True when it was already present."""

    @abc.abstractmethod
    def get(self, raw_id: bytes, *, verify: bool = True) -> bytes:
        """The bytes of a chunk, verified unless VERIFY is False."""

    @abc.abstractmethod
    def has(self, raw_id: bytes) -> bool:
        """Whether a chunk is stored (and not known to be corrupt)."""

    @abc.abstractmethod
    def inventory(self) -> Iterator[InventoryItem]:
        """Every stored chunk: its id, when it was last put here, its length."""

    @abc.abstractmethod
    def refresh(self, items: Sequence[InventoryItem]) -> list[InventoryItem]:
        """Of ITEMS (an inventory taken a while ago), those still stored, as they stand
        now: a paced round reports each page as it is when the page leaves, not as the
        round's listing found it (a chunk deleted since must not be reported)."""

    @abc.abstractmethod
    def delete(self, raw_id: bytes, *, touched_ns: int) -> int:
        """Delete a chunk (garbage collection) unless it was put again after TOUCHED_NS (the
        time its inventory entry showed: a write may be about to reference it). Returns
        the bytes freed, 0 when nothing was deleted."""

    @abc.abstractmethod
    def scrub(self, raw_id: bytes) -> tuple[str, int]:
        """Read a stored chunk and check its id: (SOUND, CORRUPT or GONE, bytes read). A
        copy that does not match is deleted, so that has() denies it and the next put of
        the id (a replica pushed back) stores a good one."""

    @abc.abstractmethod
    def usage(self) -> Usage:
        """Chunk count, stored bytes, capacity and free space."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the store holds (locks, files). Idempotent."""

    def has_many(self, raw_ids: Sequence[bytes]) -> list[bool]:
        """Batched has(); every id is validated before any is looked up."""
        if len(raw_ids) > MAX_HAS_BATCH:
            raise InvalidArgument(
                f"too many ids in one request: {len(raw_ids)} (at most {MAX_HAS_BATCH}); "
                "split the batch"
            )
        for raw in raw_ids:
            check_id(raw)
        return [self.has(raw) for raw in raw_ids]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_content(raw_id: bytes, data: Buffer) -> None:
    """Refuse a put whose bytes are not what the id names (the sender has a bug)."""
    actual = chunk_id(data)
    if actual != raw_id:
        raise InvalidArgument(
            f"chunk data does not match its id: {len(data)} bytes hash to {actual.hex()}, "
            f"not {raw_id.hex()}; nothing stored"
        )
