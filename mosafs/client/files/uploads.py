"""Storing a group of new chunks (the write pipeline's, mosafs.client.files.pipeline): every
blob the group needs (whole copies, or an erasure-coded chunk's K+M fragments) is placed
first, then the blobs bound for one benefactor leave together in one call (PutChunks,
through the context's PutGroups), so that a call's fixed cost is paid once for many blobs
(docs/erasure_pools.md, "Grouped puts").

Placement, per chunk, as it always was:
- whole copies: COPIES distinct targets of the stripe starting at the chunk's cursor (the
  stripe's round robin);
- fragments: fragment i on the i-th member of the chunk's own order of the stripe
  (`declustered`: offsets and strides in rotation), every fragment on a distinct
  benefactor.

A blob whose put fails with a benefactor's passing trouble (unreachable, too slow, full)
goes, in the next round, to the chunk's next member not yet tried (a benefactor that died
mid-write costs a retry, not the file); any other refusal fails the write. A chunk ends
with fewer blobs than its layout needs only when the stripe ran out: pessimistic writes
need every copy and all K+M fragments, optimistic ones at least one copy or K fragments
(the rest are holes for repair); short of that the write fails, ENOSPC when every failure
was a full benefactor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from mosafs import errors
from mosafs._proto import common_pb2 as cpb
from mosafs.client.files.putgroups import PutGroups
from mosafs.erasure.base import with_parity
from mosafs.ids import chunk_id as ids_of

Target = cpb.BenefactorAddress
RETRYABLE = (errors.Unavailable, errors.DeadlineExceeded, errors.NoSpace)


@dataclass(frozen=True)
class EcPolicy:
    """How a session stores new chunks of an erasure-coded pool: K+M fragments for chunks of
    at least MIN_CHUNK bytes; ALL: every fragment must be stored (pessimistic), else at
    least K (optimistic)."""

    k: int
    m: int
    min_chunk: int
    all: bool = True

    def codes(self, length: int) -> bool:
        """Whether a chunk of LENGTH bytes is stored as fragments (else as copies)."""
        return length >= max(self.min_chunk, 1)


@dataclass(frozen=True)
class Fragmented:
    """Where a session stored an erasure-coded chunk's fragments: fragment i is the blob
    ids[i] on benefactor holders[i] at addresses[i] ("" both: not stored)."""

    k: int
    m: int
    length: int
    ids: tuple[bytes, ...]
    holders: tuple[str, ...]
    addresses: tuple[str, ...]


@dataclass(frozen=True)
class New:
    """A new chunk to store: its id, bytes, place in the stripe's round robin (CURSOR), and
    PARITY when the chunk stream computed its parity fragments."""

    id: bytes
    data: Any
    cursor: int
    parity: Sequence[Any] | None = None


@dataclass
class _Placing:
    """One chunk's blobs and where they went: slot i is blob BLOBS[i] (id, bytes: the
    chunk itself for every copy), stored on HOLDERS[i]; FREE: the members not tried yet."""

    chunk: New
    blobs: list[tuple[bytes, Any]]
    fragment_ids: list[bytes] | None
    free: list[Target]
    need: int
    holders: list[Target | None] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    full: int = 0

    def __post_init__(self) -> None:
        self.holders = [None] * len(self.blobs)


async def store_group(session: Any, puts: PutGroups, group: list[New],
                      parity_code: tuple[int, int] | None, spread: int = 0) -> None:
    """Store every chunk of GROUP for SESSION (its `ctx`, `targets`, `copies`, `ec`,
    `write_token`, `stored`); PARITY_CODE: the (K, M) the stream's parity was computed for;
    SPREAD: where this session's coded chunks start in the rotation of `declustered`.
    Raises the write's error when a chunk cannot be stored as its layout needs."""
    ec: EcPolicy | None = session.ec
    coded: list[New] = []
    whole: list[New] = []
    for c in group:
        (coded if ec is not None and ec.codes(len(c.data)) else whole).append(c)
    placings: list[_Placing] = []
    if ec is not None and coded:
        placings += await _coded(session, coded, ec, parity_code, spread)
    if whole:
        placings += _whole(session, whole)
    await _place(session, puts, placings)
    for p in placings:
        _record(session, p, ec)


async def _coded(session: Any, chunks: list[New], ec: EcPolicy,
                 parity_code: tuple[int, int] | None, spread: int) -> list[_Placing]:
    """The fragments of CHUNKS and their ids (one worker-thread call for all: the coder
    and BLAKE3 release the GIL), each chunk's members in its declustered order."""
    ctx = session.ctx
    parities = [c.parity if parity_code == (ec.k, ec.m) else None for c in chunks]
    coder = ctx.coder() if any(p is None for p in parities) else None
    encoded = await ctx.cpu(_encode_all, coder, [c.data for c in chunks], ec.k, ec.m,
                            parities)
    need = ec.k + ec.m if ec.all else ec.k
    return [_Placing(c, list(zip(ids, fragments, strict=True)), ids,
                     declustered(session.targets, c.cursor + spread), need)
            for c, (ids, fragments) in zip(chunks, encoded, strict=True)]


def _whole(session: Any, chunks: list[New]) -> list[_Placing]:
    """Whole copies of CHUNKS: COPIES slots each, on the stripe from the chunk's cursor."""
    targets = list(session.targets)
    copies = min(session.copies, len(targets))
    out = []
    for c in chunks:
        start = c.cursor % len(targets) if targets else 0
        out.append(_Placing(c, [(c.id, c.data)] * copies, None,
                            targets[start:] + targets[:start], max(copies, 1)))
    return out


async def _place(session: Any, puts: PutGroups, placings: list[_Placing]) -> None:
    """Rounds of puts: each slot without a holder takes its chunk's next free member; the
    slots of a round are grouped per benefactor into one call each, all calls at once."""
    pending = [(p, i) for p in placings for i in range(len(p.blobs))]
    while pending:
        batch: dict[str, list[tuple[_Placing, int, Target]]] = {}
        for p, i in pending:
            if p.free:
                target = p.free.pop(0)
                batch.setdefault(target.address, []).append((p, i, target))
        if not batch:
            return
        retry: list[tuple[_Placing, int]] = []
        fatal: list[errors.MosafsError] = []
        async with trio.open_nursery() as nursery:
            for entries in batch.values():
                nursery.start_soon(_send, puts, session.write_token, entries, retry, fatal)
        if fatal:
            raise fatal[0]
        pending = retry


async def _send(puts: PutGroups, token: bytes, entries: list[tuple[_Placing, int, Target]],
                retry: list[tuple[_Placing, int]], fatal: list[errors.MosafsError]) -> None:
    """The puts of ENTRIES (all to one benefactor), each outcome recorded: its holder, a
    slot to RETRY elsewhere, or a FATAL refusal."""
    outcomes = await puts.put_all(entries[0][2], [p.blobs[i] for p, i, _ in entries], token)
    for (p, i, target), outcome in zip(entries, outcomes, strict=True):
        if not isinstance(outcome, errors.MosafsError):
            p.holders[i] = target
        elif isinstance(outcome, RETRYABLE):
            p.failures.append(f"{target.address}: {outcome.message}")
            p.full += isinstance(outcome, errors.NoSpace)
            retry.append((p, i))
        else:
            fatal.append(outcome)


def _record(session: Any, p: _Placing, ec: EcPolicy | None) -> None:
    """What P stored, into the session's Stored; the write's error if too little."""
    c = p.chunk
    holders = [h for h in p.holders if h is not None]
    if len(holders) < p.need:
        error = errors.NoSpace if p.failures and p.full == len(p.failures) \
            else errors.Unavailable
        why = "; ".join(p.failures) or "no more benefactors in the stripe"
        width = len(p.blobs)
        if p.fragment_ids is not None:
            assert ec is not None
            raise error(f"chunk {c.id.hex()}: ec:{ec.k}+{ec.m} needs {p.need} of its {width} "
                        f"fragments on distinct benefactors, {len(holders)} stored with "
                        f"{len(session.targets)} benefactors to write to ({why})")
        raise error(f"chunk {c.id.hex()}: {len(holders)} of {width} copies stored ({why})")
    stored = session.stored
    if p.fragment_ids is not None:
        assert ec is not None
        stored.fragments[c.id] = Fragmented(
            ec.k, ec.m, len(c.data), tuple(p.fragment_ids),
            tuple(h.id if h is not None else "" for h in p.holders),
            tuple(h.address if h is not None else "" for h in p.holders))
    else:
        stored.placements[c.id] = [h.id for h in holders]
        stored.addresses[c.id] = [h.address for h in holders]
    stored.new_bytes += len(c.data)


def declustered(targets: Sequence[Any], cursor: int) -> list[Any]:
    """The stripe members in the order a coded chunk's fragments take them: member j of
    the chunk at CURSOR is targets[(cursor + j * d) mod n], d the (cursor // n)-th number
    prime to n, so that consecutive chunks rotate through every offset and every stride.

    Why (parity declustering, as in declustered RAID): consecutive members for every chunk
    (as whole copies take them) give each benefactor the same few partners in every chunk
    of a narrow code (ec:2+1 over 7: its neighbours), so that after its loss only those
    serve the rebuild's reads; a random order per chunk spreads them, but unevenly (the
    partner that happened to get the most chunks bounds the rebuild: with 192 chunks over
    six survivors the busiest had about a third more than the mean, and the rebuild ran at
    three quarters of its links). With offsets and strides in rotation every ordered pair
    of members shares the same number of chunks over each n * phi(n) consecutive chunks
    when n is prime (nearly so otherwise): a lost benefactor's partners are spread evenly
    over all the survivors, whose links then finish the rebuild together
    (docs/erasure_pools.md, "Repair"). The pipeline starts each write session's cursor at
    a random point, so that the first chunks of many small files do not all take the same
    members."""
    n = len(targets)
    if n <= 2:
        return list(targets)
    units = [d for d in range(1, n) if math.gcd(d, n) == 1]
    offset, stride = cursor % n, units[(cursor // n) % len(units)]
    return [targets[(offset + j * stride) % n] for j in range(n)]


def _encode_all(coder: Any, chunks: list[Any], k: int, m: int,
                parities: list[Sequence[Any] | None]) -> list[tuple[list[bytes], list[Any]]]:
    return [encode(coder, data, k, m, parity)
            for data, parity in zip(chunks, parities, strict=True)]


def encode(coder: Any, data: Any, k: int, m: int,
           parity: Sequence[Any] | None = None) -> tuple[list[bytes], list[Any]]:
    """(the BLAKE3 of each of CHUNK's K+M fragments, the fragments): the data fragments
    are the chunk's own bytes; the parity is PARITY (the M fragments the chunk stream
    computed) or CODER's. Runs in a worker thread: the coder and BLAKE3 release the
    GIL."""
    if parity is None:
        fragments = coder.fragments(data, k, m)
    else:
        try:
            fragments = with_parity(data, k, m, parity)
        except errors.InvalidArgument as exc:  # the stream's parity: a bug, not bad input
            raise errors.InternalError(f"chunk stream parity: {exc.message}") from None
    return [ids_of(f) for f in fragments], list(fragments)
