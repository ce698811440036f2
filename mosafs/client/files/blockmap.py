"""An immutable view of one file version's block-map: offsets to chunks, where each chunk
is stored (whole copies, or the fragments of an erasure-coded chunk), and the read token a
benefactor wants for it (mosafs.manager.tokens)."""

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
class Coded:
    """Where an erasure-coded chunk's fragments are (docs/erasure_pools.md): fragment i is
    the blob ids[i] at addresses[i] ("": none known), read with tokens[i]; live[i]: its
    holder was alive when the manager answered."""

    k: int
    m: int
    length: int
    ids: tuple[bytes, ...]
    addresses: tuple[str, ...]
    tokens: tuple[bytes, ...]
    live: tuple[bool, ...]

    @classmethod
    def from_location(cls, loc: mpb.ChunkLocation, by_id: dict[str, str],
                      length: int = 0) -> Coded:
        width = loc.ec_k + loc.ec_m
        tokens = tuple(loc.fragment_tokens) or (b"",) * width
        live = tuple(loc.fragment_live) or (True,) * width
        return cls(loc.ec_k, loc.ec_m, loc.length or length, tuple(loc.fragment_ids),
                   tuple(by_id.get(h, "") if h else "" for h in loc.fragment_holders),
                   tokens, live)


def coded_of(locations: Sequence[mpb.ChunkLocation], by_id: dict[str, str],
             lengths: dict[bytes, int] | None = None) -> dict[bytes, Coded]:
    """The erasure-coded chunks among LOCATIONS, by id (BY_ID: benefactor addresses)."""
    lengths = lengths or {}
    return {loc.id: Coded.from_location(loc, by_id, lengths.get(loc.id, 0))
            for loc in locations if loc.ec_k and len(loc.fragment_ids) == loc.ec_k + loc.ec_m
            and len(loc.fragment_holders) == len(loc.fragment_ids)}


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
    # The erasure-coded chunks' fragments, by chunk id.
    coded: dict[bytes, Coded] = field(default_factory=dict)

    @classmethod
    def build(cls, version: int, entries: Sequence[ChunkEntry],
              addresses: dict[bytes, list[str]] | None = None,
              tokens: dict[bytes, bytes] | None = None,
              coded: dict[bytes, Coded] | None = None) -> BlockMapView:
        starts = tuple(itertools.accumulate((e.length for e in entries), initial=0))
        tokens = dict(tokens or {})
        coded = dict(coded or {})
        renew_by = math.inf
        every = [*tokens.values(), *(t for c in coded.values() for t in c.tokens if t)]
        if every:
            now = time.time()
            expires = min(expiry_s(t) for t in every)
            renew_by = expires - RENEW_AT * max(0.0, expires - now)
        return cls(version, tuple(entries), dict(addresses or {}), starts, tokens, renew_by,
                   coded)

    @classmethod
    def from_proto(cls, bm: mpb.BlockMap) -> BlockMapView:
        by_id = {b.id: b.address for b in bm.benefactors}
        addresses = {loc.id: [by_id[b] for b in loc.benefactor_ids if b in by_id]
                     for loc in bm.locations}
        entries = [ChunkEntry(c.id, c.length) for c in bm.chunks]
        tokens = {loc.id: loc.token for loc in bm.locations if loc.token}
        lengths = {e.id: e.length for e in entries}
        return cls.build(bm.version, entries, addresses, tokens,
                         coded_of(bm.locations, by_id, lengths))

    def where(self, chunk_id: bytes) -> tuple[list[str], bytes, Coded | None]:
        """A chunk's replica addresses, read token and fragments (erasure-coded chunks),
        as the fetcher takes them."""
        return (self.addresses.get(chunk_id, []), self.tokens.get(chunk_id, b""),
                self.coded.get(chunk_id))

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
