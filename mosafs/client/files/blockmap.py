"""An immutable view of one file version's block-map: offsets to chunks, and where each
chunk is stored."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from mosafs._proto import manager_pb2 as mpb


@dataclass(frozen=True, slots=True)
class ChunkEntry:
    id: bytes
    length: int


@dataclass(frozen=True)
class BlockMapView:
    version: int
    entries: tuple[ChunkEntry, ...]
    # Replica addresses by chunk id; a chunk missing here is located on demand.
    addresses: dict[bytes, list[str]] = field(default_factory=dict)
    starts: tuple[int, ...] = ()

    @classmethod
    def build(cls, version: int, entries: Sequence[ChunkEntry],
              addresses: dict[bytes, list[str]] | None = None) -> BlockMapView:
        starts = tuple(itertools.accumulate((e.length for e in entries), initial=0))
        return cls(version, tuple(entries), dict(addresses or {}), starts)

    @classmethod
    def from_proto(cls, bm: mpb.BlockMap) -> BlockMapView:
        by_id = {b.id: b.address for b in bm.benefactors}
        addresses = {loc.id: [by_id[b] for b in loc.benefactor_ids if b in by_id]
                     for loc in bm.locations}
        entries = [ChunkEntry(c.id, c.length) for c in bm.chunks]
        return cls.build(bm.version, entries, addresses)

    @property
    def size(self) -> int:
        return self.starts[-1] if self.starts else 0

    def pieces(self, offset: int, size: int) -> Iterator[tuple[int, int, int]]:
        """(entry index, start, end) within each chunk overlapping [offset, offset+size)."""
        end = min(offset + size, self.size)
        if offset >= end:
            return
        i = bisect.bisect_right(self.starts, offset) - 1
        while i < len(self.entries) and self.starts[i] < end:
            lo = max(offset, self.starts[i]) - self.starts[i]
            hi = min(end, self.starts[i + 1]) - self.starts[i]
            yield i, lo, hi
            i += 1
