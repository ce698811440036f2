"""The manager's side of integrity (docs/benefactor.md, "Scrub"; docs/durability.md): what a
benefactor reports corrupt is dropped from the index and repaired, and `mosafs scrub` has
every live benefactor verify what it stores, drops what is corrupt or missing, and waits
for replication (and the fragment repairer) to make the referenced chunks whole again."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from mosafs._proto import manager_pb2
from mosafs.errors import MosafsError, Unavailable
from mosafs.manager.ec_repair import FragmentRepairer
from mosafs.manager.garbage import check_report
from mosafs.manager.metadata import MetadataStore
from mosafs.manager.redundancy_view import Redundancy
from mosafs.manager.registry import Registry
from mosafs.manager.replication import Replicator

# scrub(benefactor address) -> its progress messages (benefactor_pb2.ScrubProgress), the
# last with done=True and the corrupt ids
ScrubFn = Callable[[str], Iterator[Any]]
# has(benefactor address, ids) -> present[i] for each id
HasFn = Callable[[str, Sequence[bytes]], list[bool]]
HAS_BATCH = 65_536  # ids per HasChunks call while looking for missing copies
REPAIR_TIMEOUT_S = 120.0  # how long `mosafs scrub` waits for replication to repair
MAX_UNREPAIRED_IDS = 1000  # listed in a scrub report


class Integrity:
    """Corrupt and missing copies, for the manager (mosafs.manager.core.Manager). SCRUB
    asks one benefactor to verify every chunk now, HAS which ids it holds; without them
    `scrub` is Unavailable. REPLICATOR and REPAIRER (None where the manager reaches no
    benefactor) make dropped copies and fragments whole again."""

    def __init__(self, store: MetadataStore, registry: Registry,
                 replicator: Replicator | None, repairer: FragmentRepairer | None, *,
                 scrub: ScrubFn | None, has: HasFn | None) -> None:
        self.store = store
        self.registry = registry
        self.replicator = replicator
        self.repairer = repairer
        self._scrub_fn = scrub
        self._has_fn = has

    def report_corrupt(self, bid: str, ids: Sequence[bytes]) -> int:
        """Benefactor BID deleted copies that did not match their ids: the index stops
        naming it for them (replication copies good replicas back). Returns how many
        records named it."""
        check_report(self.store, bid, len(ids), "a report names")
        subjects = self._subjects(ids)  # before: the records may go with the copies
        named = self.store.remove_chunk_locations(bid, ids)
        if self.replicator is not None:
            # Copies from sound replicas, at once; fragments rebuilt (the repairer).
            self.replicator.enqueue(dict.fromkeys(c for cids in subjects.values() for c in cids))
        return named

    def _subjects(self, ids: Sequence[bytes]) -> dict[bytes, list[bytes]]:
        """For each stored blob id, the chunks whose redundancy it is part of: itself as a
        chunk, and the erasure-coded chunks that name it as a fragment."""
        out: dict[bytes, list[bytes]] = {}
        for cid, (rec, owners) in zip(ids, self.store.blob_references(ids), strict=True):
            out[cid] = ([cid] if rec is not None else []) + [o for o, _ in owners]
        return out

    def scrub(self) -> Iterator[manager_pb2.ScrubEvent]:
        """`mosafs scrub`: every live benefactor verifies every chunk it stores (one after
        another), the copies found corrupt, and those the index names but the benefactor
        does not hold, are dropped from the index, and replication passes run until the
        referenced ones have R live copies again (or cannot get them: no sound copy left,
        no progress, or REPAIR_TIMEOUT_S). Yields progress events; the last one (done)
        is the report."""
        if self._scrub_fn is None or self._has_fn is None:
            raise Unavailable("this manager cannot reach benefactors to scrub them")
        live = self.registry.live()
        results = [manager_pb2.BenefactorScrub(id=b.id, address=b.address) for b in live]
        dropped: dict[bytes, set[int]] = {}  # chunk id -> benefactors (indexes) that lost it
        for index, (b, res) in enumerate(zip(live, results, strict=True)):
            event = manager_pb2.ScrubEvent(benefactor_index=index, benefactors=len(live))
            corrupt: list[bytes] = []
            try:
                for p in self._scrub_fn(b.address):
                    res.checked_chunks, res.checked_bytes = p.checked_chunks, p.checked_bytes
                    res.total_chunks, res.corrupt_chunks = p.total_chunks, p.corrupt_chunks
                    if p.done:
                        corrupt = list(p.corrupt_ids)
                    event.progress.CopyFrom(res)
                    yield event
                missing = self._missing_on(b.id, b.address)
            except MosafsError as exc:
                res.error = exc.message
                continue
            res.missing_chunks = len(missing)
            # Corrupt copies were reported by the benefactor itself as it found them
            # (ReportCorruptChunks), and replication may have put a sound copy back there
            # since: dropping them again here would forget that copy (and make a third).
            self.store.remove_chunk_locations(b.id, missing)
            for cid in (*corrupt, *missing):
                dropped.setdefault(cid, set()).add(index)
        yield manager_pb2.ScrubEvent(benefactors=len(live), repairing=True)
        ids = list(dropped)
        # Each blob dropped is a chunk, or a fragment of erasure-coded chunks: the
        # referenced chunks among those are what must be repaired (the rest is garbage).
        subjects = self._subjects(ids)
        chunks = list(dict.fromkeys(c for cids in subjects.values() for c in cids))
        referenced = {cid for cid, rec in zip(chunks, self.store.chunk_records(chunks),
                                              strict=True)
                      if rec is not None and rec.refcount > 0}
        short = self._repair([cid for cid in chunks if cid in referenced])
        done = manager_pb2.ScrubEvent(benefactors=len(live), done=True)
        for cid in ids:
            needed = [c for c in subjects[cid] if c in referenced]
            if not needed:
                continue
            for i in dropped[cid]:
                if any(c in short for c in needed):
                    results[i].unrepaired_chunks += 1
                else:
                    results[i].repaired_chunks += 1
        done.results.extend(results)
        done.unrepaired_ids.extend(sorted(short)[:MAX_UNREPAIRED_IDS])
        yield done

    def _missing_on(self, bid: str, address: str) -> list[bytes]:
        """Ids the index says BID holds that it does not (or holds corrupt): whole copies,
        and fragment blobs of erasure-coded chunks."""
        assert self._has_fn is not None
        named = list(dict.fromkeys([*self.store.chunks_on(bid), *self.store.fragments_on(bid)]))
        missing: list[bytes] = []
        for start in range(0, len(named), HAS_BATCH):
            batch = named[start:start + HAS_BATCH]
            present = self._has_fn(address, batch)
            absent = [cid for cid, ok in zip(batch, present, strict=True) if not ok]
            # Garbage collection may have released and deleted some since the index was
            # read: those are gone by design, not missing.
            for cid, (rec, owners) in zip(absent, self.store.blob_references(absent),
                                          strict=True):
                if (rec is not None and bid in rec.benefactor_ids) or any(
                        f == cid and h == bid for _, o in owners
                        for f, h in zip(o.fragment_ids, o.fragment_holders, strict=True)):
                    missing.append(cid)
        return missing

    def short_of_copies(self, ids: Sequence[bytes]) -> set[bytes]:
        """Of IDS, the referenced chunks with fewer than R counted copies."""
        view = Redundancy(self.store, self.registry)
        records = self.store.chunk_records(ids)
        return {cid for cid, rec in zip(ids, records, strict=True)
                if rec is not None and rec.refcount > 0 and view.missing(rec)}

    def _repair(self, ids: list[bytes]) -> set[bytes]:
        """Replicate IDS now, until each has R live copies, or replication has nothing
        left to try for them (no sound copy anywhere, no benefactor to take one), or
        REPAIR_TIMEOUT_S. Returns the ids still short of copies."""
        short = self.short_of_copies(ids)
        if self.replicator is None or not short:
            return short
        self.replicator.enqueue(short)
        deadline = time.monotonic() + REPAIR_TIMEOUT_S
        while short and time.monotonic() < deadline:
            wait = self.replicator.step()
            if self.repairer is not None:  # coded chunks: fragments rebuilt
                wait = min(wait, self.repairer.step())
            short = self.short_of_copies(list(short))
            if not self.replicator.pending(short) and not (
                    self.repairer is not None and self.repairer.pending(short)):
                break  # examined, and nothing under way: no way to copy them now
            time.sleep(max(wait, 0.02))
        return short
