"""An immutable view of one file version's block-map: offsets to chunks, where each chunk
is stored, and the read token a benefactor wants for it (mosafs.manager.tokens)."""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from mosafs._proto import manager_pb2 as mpb
from mosafs.manager.tokens import expiry_s

# A view's tokens are renewed once this share of their life is left: before they expire,
# so that reads and read-ahead are not refused first.
RENEW_AT = 0.1


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
    # Read tokens by chunk id (none on a plaintext cluster); they expire (--token-ttl):
    # the reader asks for a fresh view shortly before (renew_by), or when refused.
    tokens: dict[bytes, bytes] = field(default_factory=dict)
    renew_by: float = math.inf  # wall clock, seconds since the epoch

    @classmethod
    def build(cls, version: int, entries: Sequence[ChunkEntry],
              addresses: dict[bytes, list[str]] | None = None,
              tokens: dict[bytes, bytes] | None = None) -> BlockMapView:
        starts = tuple(itertools.accumulate((e.length for e in entries), initial=0))
        tokens = dict(tokens or {})
        renew_by = math.inf
        if tokens:
            now = time.time()
            expires = min(expiry_s(t) for t in tokens.values())
            renew_by = expires - RENEW_AT * max(0.0, expires - now)
        return cls(version, tuple(entries), dict(addresses or {}), starts, tokens, renew_by)

    @classmethod
    def from_proto(cls, bm: mpb.BlockMap) -> BlockMapView:
        by_id = {b.id: b.address for b in bm.benefactors}
        addresses = {loc.id: [by_id[b] for b in loc.benefactor_ids if b in by_id]
                     for loc in bm.locations}
        entries = [ChunkEntry(c.id, c.length) for c in bm.chunks]
        tokens = {loc.id: loc.token for loc in bm.locations if loc.token}
        return cls.build(bm.version, entries, addresses, tokens)

    def where(self, chunk_id: bytes) -> tuple[list[str], bytes]:
        """A chunk's replica addresses and read token, as the fetcher takes them."""
        return self.addresses.get(chunk_id, []), self.tokens.get(chunk_id, b"")

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
