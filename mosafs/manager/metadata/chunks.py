"""The chunk index: chunk records, their copies and erasure-coded fragments, and the
queries and updates of garbage collection, replication, reconciliation and scrub."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mosafs._proto import manager_pb2, metadata_pb2
from mosafs.errors import InvalidArgument
from mosafs.manager.metadata.base import StoreBase, _rerun_if_grown
from mosafs.manager.metadata.checks import check_benefactor_id, check_ids
from mosafs.manager.metadata.records import (
    FragmentMove,
    Fragments,
    Layout,
    _location,
    blob_needed_on,
    check_fragments,
    garbage_since,
)
from mosafs.manager.metadata.schema import unpack_blockmap

HELD_PAGE = 50_000  # holdings index entries per read transaction of chunks_on


@dataclass(frozen=True)
class HeldPage:
    """A page of a walk over what one benefactor holds (ChunkIndexOps.held_by)."""

    ids: list[bytes]
    last: bytes   # the last chunk id read: where the next page starts after
    end: bool     # nothing of this benefactor after LAST


class ChunkIndexOps(StoreBase):
    """The chunk index: placements, fragments, reference counts."""

    def chunk(self, cid: bytes) -> metadata_pb2.ChunkRecord | None:
        with self._read() as tx:
            return tx.chunk(cid)

    def chunk_locations(self, ids: Sequence[bytes]) -> list[list[str] | None]:
        """For each id: the benefactors holding a whole copy, or None when it is not in
        the index."""
        with self._read() as tx:
            out: list[list[str] | None] = []
            for cid in check_ids(ids):
                rec = tx.chunk(cid)
                out.append(None if rec is None else list(rec.benefactor_ids))
            return out

    def locations(self, ids: Sequence[bytes]
                  ) -> tuple[list[manager_pb2.ChunkLocation | None], dict[str, str]]:
        """For each id: where its copies and fragments are (None when the index lacks
        it), and the address of every registered benefactor named; one snapshot."""
        with self._read() as tx:
            named: dict[str, None] = {}
            out: list[manager_pb2.ChunkLocation | None] = []
            for cid in check_ids(ids):
                rec = tx.chunk(cid)
                out.append(None if rec is None else _location(cid, rec, named))
            addresses = {}
            for bid in named:
                brec = tx.benefactor(bid)
                if brec is not None:
                    addresses[bid] = brec.address
            return out, addresses

    def chunk_page(self, start_after: bytes = b"",
                   limit: int = 4096) -> list[tuple[bytes, metadata_pb2.ChunkRecord]]:
        """Up to LIMIT index records with ids after START_AFTER, in id order (a full scan
        is a loop over pages, each its own short read transaction)."""
        with self._read() as tx:
            cursor = tx.txn.cursor(db=self._db.chunks)
            out: list[tuple[bytes, metadata_pb2.ChunkRecord]] = []
            positioned = cursor.set_range(start_after) if start_after else cursor.first()
            if not positioned:
                return out
            for cid, raw in cursor:
                if cid == start_after:
                    continue
                out.append((bytes(cid), metadata_pb2.ChunkRecord.FromString(raw)))
                if len(out) >= limit:
                    break
            return out

    def chunk_count(self) -> int:
        """Records in the chunk index (referenced, and unreferenced ones waiting for
        collection): LMDB keeps the count, so this reads no record."""
        with self._read() as tx:
            return int(tx.txn.stat(self._db.chunks)["entries"])

    def chunk_records(self, ids: Sequence[bytes]) -> list[metadata_pb2.ChunkRecord | None]:
        """The index record of each id (None where the index has none), one snapshot."""
        with self._read() as tx:
            return [tx.chunk(cid) for cid in check_ids(ids)]

    @_rerun_if_grown
    def release_unreferenced(self, ids: Iterable[bytes], bid: str, *,
                             unreferenced_before: int | None = None
                             ) -> tuple[list[bytes], int]:
        """Garbage collection: of IDS, those that are still unreferenced (refcount 0, or not
        in the index) may be deleted from benefactor BID. One transaction re-checks every
        id (a commit may have referenced one since it was chosen), takes BID out of its
        record, and deletes records left with no copy. UNREFERENCED_BEFORE (wall ns): an
        id whose record (or a record it is a fragment of) became garbage at or after it
        stays (a write opened before that moment may reference it at commit). Returns
        (the ids BID may delete, how many records were deleted)."""
        check_benefactor_id(bid)
        released: list[bytes] = []
        gone = 0
        with self._write() as tx:
            for cid in check_ids(list(ids)):
                # A blob is a chunk, or a fragment of erasure-coded chunks (or both: equal
                # bytes): it goes only if nothing referenced needs it here in either role.
                own = tx.chunk(cid)
                owners = [r for o in tx.fragment_owners(cid) if (r := tx.chunk(o)) is not None]
                if blob_needed_on(cid, bid, own, owners):
                    continue
                if (unreferenced_before is not None
                        and garbage_since([own, *owners]) >= unreferenced_before):
                    continue
                released.append(cid)
                rec = tx.chunk(cid)
                if rec is not None:
                    gone += tx.drop_location(cid, rec, bid)
                for owner in tx.fragment_owners(cid):
                    orec = tx.chunk(owner)
                    if orec is not None:
                        gone += tx.drop_fragment(owner, orec, cid, bid)
        return released, gone

    def blob_references(self, ids: Sequence[bytes]
                        ) -> list[tuple[metadata_pb2.ChunkRecord | None,
                                        list[tuple[bytes, metadata_pb2.ChunkRecord]]]]:
        """For each stored blob id: its own chunk record (None: none), and (id, record) of
        the erasure-coded chunks that name it as a fragment; one snapshot (garbage
        collection, reconciliation, scrub)."""
        with self._read() as tx:
            out = []
            for cid in check_ids(ids):
                owners = [(owner, rec) for owner in tx.fragment_owners(cid)
                          if (rec := tx.chunk(owner)) is not None]
                out.append((tx.chunk(cid), owners))
            return out

    @_rerun_if_grown
    def add_fragment_holders(self, added: Iterable[tuple[bytes, str]]) -> int:
        """Reconciliation of fragments: benefactor BID holds fragment blob FID (for each
        (FID, BID) of ADDED). Recorded in the first slot of a referenced chunk that names
        FID and has no holder, if BID holds no other fragment of that chunk (fragments of
        one chunk stay on distinct benefactors). Returns how many were recorded."""
        recorded = 0
        with self._write() as tx:
            for fid, bid in added:
                check_benefactor_id(bid)
                if tx.benefactor(bid) is None:
                    continue  # removed since it was reported
                for owner in tx.fragment_owners(bytes(fid)):
                    rec = tx.chunk(owner)
                    if rec is None or rec.refcount == 0 or bid in rec.fragment_holders:
                        continue
                    for i, (f, holder) in enumerate(zip(rec.fragment_ids,
                                                        rec.fragment_holders, strict=True)):
                        if f == fid and not holder:
                            rec.fragment_holders[i] = bid
                            tx.put_chunk(owner, rec)
                            recorded += 1
                            break
        return recorded

    @_rerun_if_grown
    def record_fragments(self, cid: bytes, moves: Iterable[FragmentMove]) -> int:
        """Fragments rebuilt or moved for erasure-coded chunk CID, in one transaction: each
        MOVES entry puts its new holder in slot `index`, if the record still names that
        fragment id there with the holder the plan replaced (`old`: a dead, draining or
        moved benefactor, or "" for a hole) and the new holder holds no other fragment of
        the chunk. Returns how many were recorded (0 when the chunk went, or changed)."""
        recorded = 0
        with self._write() as tx:
            rec = tx.chunk(check_ids([cid])[0])
            if rec is None or rec.refcount == 0 or not rec.ec_k:
                return 0
            for move in moves:
                check_benefactor_id(move.holder)
                i = move.index
                if (i >= len(rec.fragment_ids) or rec.fragment_ids[i] != move.fid
                        or rec.fragment_holders[i] != move.old
                        or move.holder in rec.fragment_holders
                        or tx.benefactor(move.holder) is None):
                    continue
                rec.fragment_holders[i] = move.holder
                recorded += 1
            if recorded:
                tx.put_chunk(cid, rec)
        return recorded

    @_rerun_if_grown
    def convert_chunk(self, cid: bytes, expect: Layout, *, fragments: Fragments | None = None,
                      copies: Sequence[str] = ()) -> bool:
        """A conversion (docs/erasure_pools.md): chunk CID was read in layout EXPECT and
        stored anew, as FRAGMENTS or as whole COPIES on those benefactors. One transaction
        swaps the record to the new layout if it still has EXPECT (and a reference): the
        old copies or fragments are no longer named and garbage collection takes them,
        never before this commit. Whether the record was swapped."""
        if fragments is not None:
            fragments = check_fragments(cid, fragments)
            if not all(fragments.holders):
                raise InvalidArgument(f"chunk {cid.hex()}: a conversion stores every fragment")
        elif not copies:
            raise InvalidArgument(f"chunk {cid.hex()}: a conversion stores something")
        for bid in copies:
            check_benefactor_id(bid)
        with self._write() as tx:
            rec = tx.chunk(check_ids([cid])[0])
            if rec is None or rec.refcount == 0 or Layout.of(rec) != expect:
                return False
            named = set(copies) | set(fragments.holders if fragments else ())
            if any(tx.benefactor(bid) is None for bid in named):
                return False  # removed meanwhile: the next examination plans again
            if fragments is not None:
                tx.set_fragments(cid, rec, fragments)
                del rec.benefactor_ids[:]  # the old copies are garbage now
            else:
                tx.clear_fragments(cid, rec)  # its whole copies, if any, stay copies
                rec.benefactor_ids.extend(b for b in dict.fromkeys(copies)
                                          if b not in rec.benefactor_ids)
            tx.put_chunk(cid, rec)
            return True

    @_rerun_if_grown
    def remove_chunk_locations(self, bid: str, ids: Iterable[bytes]) -> int:
        """Benefactor BID no longer holds IDS (scrub found them corrupt or missing): take
        it out of their records in one transaction; a record left with no copy and no
        reference is deleted (a referenced one stays, lost until a copy turns up). Returns
        how many records named BID."""
        check_benefactor_id(bid)
        removed = 0
        with self._write() as tx:
            for cid in check_ids(list(ids)):
                rec = tx.chunk(cid)
                if rec is not None and bid in rec.benefactor_ids:
                    removed += 1
                    tx.drop_location(cid, rec, bid)
                # The id may be a fragment blob: the slots where BID holds it are emptied.
                for owner in tx.fragment_owners(cid):
                    orec = tx.chunk(owner)
                    if orec is None or not any(
                            f == cid and h == bid for f, h in
                            zip(orec.fragment_ids, orec.fragment_holders, strict=True)):
                        continue
                    removed += 1
                    tx.drop_fragment(owner, orec, cid, bid)
        return removed

    def chunks_on(self, bid: str, *, fragments: bool = False) -> list[bytes]:
        """Ids whose records name benefactor BID as holding a whole copy, or also (with
        FRAGMENTS) a fragment (one snapshot; the holdings index, not the chunk index)."""
        out: list[bytes] = []
        after = b""
        while True:
            page = self.held_by(bid, after, HELD_PAGE, fragments=fragments)
            out.extend(page.ids)
            if page.end:
                return out
            after = page.last

    def held_by(self, bid: str, after: bytes, limit: int, *, fragments: bool = True
                ) -> HeldPage:
        """The next ids after chunk id AFTER (b"": from the first) whose records name BID,
        at most LIMIT index entries read (a page of a walk that may span transactions):
        whole copies, and with FRAGMENTS fragment holders."""
        ids: list[bytes] = []
        last = after
        read = 0
        end = True
        with self._read() as tx:
            for cid in tx.held(bid, after):
                if read == limit:
                    end = False  # more after LAST
                    break
                read += 1
                last = cid
                if fragments:
                    ids.append(cid)
                else:
                    rec = tx.chunk(cid)
                    if rec is not None and bid in rec.benefactor_ids:
                        ids.append(cid)
        return HeldPage(ids, last, end)

    def fragments_on(self, bid: str) -> list[bytes]:
        """Fragment blob ids the index says benefactor BID holds (through the holdings
        index)."""
        out: dict[bytes, None] = {}
        held = self.chunks_on(bid, fragments=True)
        with self._read() as tx:
            for cid in held:
                rec = tx.chunk(cid)
                if rec is None:
                    continue
                for f, h in zip(rec.fragment_ids, rec.fragment_holders, strict=True):
                    if h == bid:
                        out[bytes(f)] = None
        return list(out)

    @_rerun_if_grown
    def add_chunk_locations(self, added: Iterable[tuple[bytes, str]]) -> int:
        """Record new copies (id, benefactor id) in one transaction; ids no longer in the
        index are skipped (their file went meanwhile), and so are benefactors no longer
        registered (removed while the copy was made or reported). Returns how many were
        recorded."""
        recorded = 0
        registered: dict[str, bool] = {}
        with self._write() as tx:
            for cid, bid in added:
                check_benefactor_id(bid)
                if bid not in registered:
                    registered[bid] = tx.benefactor(bid) is not None
                rec = tx.chunk(cid)
                if rec is None or not registered[bid] or bid in rec.benefactor_ids:
                    continue
                rec.benefactor_ids.append(bid)
                tx.put_chunk(cid, rec)
                recorded += 1
        return recorded

    def refcount_mismatches(self) -> dict[bytes, tuple[int, int]]:
        """id -> (refcount in the index, count over all block-maps) wherever they differ.
        Empty when the invariant holds (tests; later, fsck)."""
        counted: Counter[bytes] = Counter()
        with self._read() as tx:
            for _, value in tx.txn.cursor(db=self._db.blockmaps):
                counted.update(cid for cid, _ in unpack_blockmap(value))
            out = {}
            for cid, raw in tx.txn.cursor(db=self._db.chunks):
                stored = metadata_pb2.ChunkRecord.FromString(raw).refcount
                if stored != counted.get(cid, 0):
                    out[cid] = (stored, counted.get(cid, 0))
            for cid, count in counted.items():
                if tx.chunk(cid) is None:
                    out[cid] = (0, count)
            return out
