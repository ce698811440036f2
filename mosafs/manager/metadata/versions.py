"""Versions and block-maps of regular files: the base of a write, commits (with the
chunk references they add), restores, block-maps with their chunks' locations, and the
figures of each version."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence

from mosafs._proto import common_pb2, manager_pb2, metadata_pb2
from mosafs.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from mosafs.ids import ID_LEN
from mosafs.manager import pools
from mosafs.manager.metadata.base import StoreBase, _rerun_if_grown
from mosafs.manager.metadata.checks import _check_time, _check_u64, _merge_placements, check_chunks
from mosafs.manager.metadata.records import (
    FINAL_COMMIT,
    Fragments,
    SessionCommit,
    WriteBase,
    _attr,
    _location,
    check_fragments,
)
from mosafs.manager.metadata.schema import (
    _MAX_U64,
    _U64,
    _VKEY,
    MAX_FILE_SIZE,
    ChunkEntry,
    pack_blockmap,
)
from mosafs.manager.metadata.tx import Tx

log = logging.getLogger("mosafs.manager.metadata")


def _merge_fragments(tx: Tx, cid: bytes, rec: metadata_pb2.ChunkRecord,
                     frag: Fragments) -> None:
    """Fragments a writer just stored for chunk CID, whose record REC exists (its chunk
    was garbage, or had too few live fragments, when the writer asked): the same layout
    takes the new holders (just stored and verified, so they win; a benefactor stays on
    one index only); another layout replaces the old one (whose fragments become garbage)."""
    old = Fragments.of(rec)
    if old is None or (old.k, old.m, old.ids) != (frag.k, frag.m, frag.ids):
        tx.set_fragments(cid, rec, frag)
        return
    holders = list(old.holders)
    for i, bid in enumerate(frag.holders):
        if not bid:
            continue
        holders = ["" if h == bid else h for h in holders]
        holders[i] = bid
    del rec.fragment_holders[:]
    rec.fragment_holders.extend(holders)


def _version_stats(inode: int, version: int,
                   v: metadata_pb2.VersionRecord) -> manager_pb2.VersionStats:
    """A version's figures as recorded (the base's name is filled in by _name_base)."""
    return manager_pb2.VersionStats(
        inode=inode, version=version, size=v.size, chunks=v.chunks,
        shared_chunks=v.shared_chunks, base_inode=v.base_inode, base_version=v.base_version,
        new_bytes=v.new_bytes, commit_time_ns=v.commit_time_ns, mtime_ns=v.mtime_ns,
        shared_bytes=v.shared_bytes, stored_chunks=v.stored_chunks,
        stored_bytes=v.stored_bytes, indexed_chunks=v.indexed_chunks,
        indexed_bytes=v.indexed_bytes, repeated_chunks=v.repeated_chunks,
        repeated_bytes=v.repeated_bytes, provisional=v.provisional,
        replaced_versions=v.replaced_versions,
        # A record from before the sources were counted has them all 0: they add up only
        # when every entry was shared with the base (then that is the whole story).
        sources_known=(v.shared_chunks + v.stored_chunks + v.indexed_chunks
                       + v.repeated_chunks == v.chunks))


def _count_sources(vrec: metadata_pb2.VersionRecord, entries: list[ChunkEntry],
                   base_ids: set[bytes], stored: set[bytes]) -> list[bool]:
    """Count where each entry of a new version came from into VREC: the base (shared_*),
    else the first entry of a chunk this write STORED (stored_*) or found in the index
    (indexed_*), else a repeat of an earlier entry (repeated_*). Returns, per entry,
    whether it was counted as stored."""
    seen: set[bytes] = set()
    counted = []
    for cid, length in entries:
        source = "shared" if cid in base_ids else "repeated" if cid in seen else \
            "stored" if cid in stored else "indexed"
        seen.add(cid)
        field_chunks = f"{source}_chunks"
        setattr(vrec, field_chunks, getattr(vrec, field_chunks) + 1)
        setattr(vrec, f"{source}_bytes", getattr(vrec, f"{source}_bytes") + length)
        counted.append(source == "stored")
    return counted


def _bitmap(flags: list[bool]) -> bytes:
    """FLAGS packed, flag i as bit i % 8 of byte i // 8."""
    out = bytearray((len(flags) + 7) // 8)
    for i, flag in enumerate(flags):
        if flag:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def _marked(entries: list[ChunkEntry], bitmap: bytes) -> set[bytes]:
    """The ids of the ENTRIES whose bit is set in BITMAP (_bitmap's packing)."""
    return {cid for i, (cid, _) in enumerate(entries)
            if i >> 3 < len(bitmap) and bitmap[i >> 3] >> (i & 7) & 1}


class VersionOps(StoreBase):
    """Versions of regular files and their block-maps: commits, restores and reads."""

    def write_base(self, inode: int) -> WriteBase:
        """The newest committed version of regular file INODE (version 0: none)."""
        with self._read() as tx:
            rec = tx.regular_file(inode)
            if rec.newest_version == 0:
                return WriteBase(inode, 0, 0)
            return WriteBase(inode, rec.newest_version, rec.size,
                             tx.blockmap(inode, rec.newest_version))

    @_rerun_if_grown
    def commit_version(
        self, inode: int, chunks: Iterable[ChunkEntry],
        placements: Iterable[tuple[bytes, Sequence[str]]] = (), *, base_inode: int = 0,
        base_version: int = 0, mtime_ns: int = 0, new_bytes: int = 0, pool: str = "",
        session: SessionCommit = FINAL_COMMIT,
        fragments: Iterable[tuple[bytes, Fragments]] = (),
    ) -> tuple[int, manager_pb2.Attr]:
        """Store a new version of INODE with block-map CHUNKS in one write transaction.

        Every chunk must be in the index already or be named in PLACEMENTS (id -> benefactor
        ids where the client stored it). Placements of ids the block-map does not name are
        validated and ignored: the index only tracks referenced chunks. BASE_* name the
        version the write deduped against (for shared_chunks). MTIME_NS 0: the commit time,
        else a time _check_time accepts. The version's size (the sum of the lengths) is at
        most MAX_FILE_SIZE (ResourceExhausted, EFBIG, beyond). POOL: the pool the write
        stored new chunks in (their records keep it: their R). SESSION: whether the version
        is provisional, and the provisional version of the same write session it replaces
        (dropped here, with its chunk references, if it is still the newest;
        docs/lifecycle.md, Versions). FRAGMENTS: (id, where its fragments were stored) of
        the erasure-coded chunks the write stored (docs/erasure_pools.md); such a chunk
        needs no placement.
        """
        entries = check_chunks(chunks)
        placed = _merge_placements(placements)
        coded: dict[bytes, Fragments] = {}
        for cid, frag in fragments:
            if len(cid) != ID_LEN:
                raise InvalidArgument(f"fragment placement: chunk id must be {ID_LEN} bytes, "
                                      f"got {len(cid)}")
            coded[bytes(cid)] = check_fragments(cid, frag)
        _check_u64(new_bytes, "new_bytes")
        if mtime_ns:
            _check_time(mtime_ns, "mtime_ns")
        session.check()
        occurrences: Counter[bytes] = Counter(cid for cid, _ in entries)
        lengths: dict[bytes, int] = {}
        for cid, length in entries:
            if lengths.setdefault(cid, length) != length:
                raise InvalidArgument(f"chunk {cid.hex()} appears with lengths "
                                      f"{lengths[cid]} and {length}")
        size = sum(lengths[cid] * count for cid, count in occurrences.items())
        if size > MAX_FILE_SIZE:
            raise ResourceExhausted(f"a version of {size} bytes is over the largest file "
                                    f"mosafs stores ({MAX_FILE_SIZE} bytes, 4 TiB)")
        now = time.time_ns()

        def body(tx: Tx) -> tuple[int, manager_pb2.Attr]:
            rec = tx.regular_file(inode)  # NotFound: unlinked while the client wrote
            named = {bid for bids in placed.values() for bid in bids}
            named.update(h for frag in coded.values() for h in frag.holders if h)
            for bid in sorted(named):
                if tx.benefactor(bid) is None:
                    raise InvalidArgument(f"placement names unknown benefactor {bid!r}")
            replaced = self._replaceable(tx, inode, rec, session)
            for cid, count in occurrences.items():
                self._reference_chunk(tx, cid, lengths[cid], count, placed.get(cid), pool,
                                      coded.get(cid))
            stored = set(placed) | set(coded)
            b_inode, b_version, sent = base_inode, base_version, new_bytes
            if replaced is not None:
                # The version replacing a provisional one stands for the whole session:
                # the base it started from, every byte it sent, every chunk it stored.
                b_inode, b_version = replaced.base_inode, replaced.base_version
                sent = min(sent + replaced.new_bytes, _MAX_U64)
                stored |= _marked(tx.blockmap(inode, session.replaces_version),
                                  replaced.stored_entries)
            base_ids = self._base_ids(tx, b_inode, b_version) if b_version else set()
            vrec = metadata_pb2.VersionRecord(
                size=size, chunks=len(entries), base_inode=b_inode,
                base_version=b_version, new_bytes=sent, commit_time_ns=now,
                mtime_ns=mtime_ns or now)
            counted = _count_sources(vrec, entries, base_ids, stored)
            if session.provisional:
                vrec.provisional = True
                vrec.session = session.session
                vrec.stored_entries = _bitmap(counted)
            if replaced is not None:
                vrec.replaced_versions = replaced.replaced_versions + 1
            result = self._add_version(tx, inode, rec, vrec, entries)
            if replaced is not None:
                tx.drop_version(inode, session.replaces_version)
            return result
        return self._grouped(body, grows=True)

    @staticmethod
    def _replaceable(tx: Tx, inode: int, rec: metadata_pb2.InodeRecord,
                     session: SessionCommit) -> metadata_pb2.VersionRecord | None:
        """The provisional version SESSION replaces, if it may: still the file's newest
        version, and committed by the same write session. Otherwise None, and the commit
        only adds its version: another writer committed since (both stay), or the version
        went (pruned, restored over)."""
        version = session.replaces_version
        if not version or rec.newest_version != version:
            return None
        try:
            old = tx.version(inode, version)
        except NotFound:
            return None
        if not old.provisional or old.session != session.session:
            return None
        return old

    @staticmethod
    def _add_version(tx: Tx, inode: int, rec: metadata_pb2.InodeRecord,
                     vrec: metadata_pb2.VersionRecord,
                     entries: list[ChunkEntry]) -> tuple[int, manager_pb2.Attr]:
        """Write VREC and ENTRIES as the newest version of INODE (chunks referenced)."""
        version = rec.newest_version + 1
        key = _VKEY.pack(inode, version)
        tx.txn.put(key, vrec.SerializeToString(), db=tx.db.versions)
        tx.txn.put(key, pack_blockmap(entries), db=tx.db.blockmaps)
        rec.newest_version = version
        rec.size = vrec.size
        rec.mtime_ns = vrec.mtime_ns
        rec.ctime_ns = vrec.commit_time_ns
        tx.put_inode(inode, rec)
        return version, _attr(inode, rec)

    @staticmethod
    def _reference_chunk(tx: Tx, cid: bytes, length: int, count: int,
                         locations: list[str] | None, pool: str = "",
                         fragments: Fragments | None = None) -> None:
        crec = tx.chunk(cid)
        if crec is None:
            if not locations and fragments is None:
                raise FailedPrecondition(
                    f"chunk {cid.hex()} is neither stored nor placed: store it on a "
                    f"benefactor and name it in the commit's placements")
            crec = metadata_pb2.ChunkRecord(length=length, refcount=count,
                                            benefactor_ids=locations or [],
                                            pool="" if pool == pools.DEFAULT_POOL else pool)
            if fragments is not None:
                tx.set_fragments(cid, crec, fragments)
        else:
            if crec.length != length:
                raise InvalidArgument(f"chunk {cid.hex()} has length {crec.length} in the "
                                      f"index, the commit says {length}")
            crec.refcount += count
            known = crec.benefactor_ids
            new = [bid for bid in locations or () if bid not in known]
            known.extend(dict.fromkeys(new))
            if fragments is not None:
                _merge_fragments(tx, cid, crec, fragments)
            tx.put_chunk(cid, crec, holders_same=not new and fragments is None)
            return
        tx.put_chunk(cid, crec)

    @staticmethod
    def _base_ids(tx: Tx, base_inode: int, base_version: int) -> set[bytes]:
        """Ids of the base block-map; a base removed since the write began shares nothing."""
        try:
            return {cid for cid, _ in tx.blockmap(base_inode, base_version)}
        except NotFound:
            return set()

    def block_map(self, inode: int, version: int = 0) -> manager_pb2.BlockMap:
        """Version VERSION (0: the newest) of a file with the locations of its chunks and the
        addresses of every benefactor named. No committed version: version 0, empty."""
        with self._read() as tx:
            rec = tx.regular_file(inode)
            version = version or rec.newest_version
            out = manager_pb2.BlockMap(inode=inode)
            if version == 0:
                return out
            vrec = tx.version(inode, version)
            chunks = tx.blockmap(inode, version)
            out.version = version
            out.size = vrec.size
            out.chunks.extend(common_pb2.ChunkRef(id=cid, length=n) for cid, n in chunks)
            named: dict[str, None] = {}
            for cid in dict.fromkeys(cid for cid, _ in chunks):
                crec = tx.chunk(cid)
                if crec is None:
                    log.error("chunk index damaged: %s of file %d version %d has no record",
                              cid.hex(), inode, version)
                    out.locations.add(id=cid)
                    continue
                out.locations.append(_location(cid, crec, named))
            for bid in named:
                brec = tx.benefactor(bid)
                if brec is not None:
                    out.benefactors.add(id=bid, address=brec.address)
            return out

    def version_stats(self, inode: int, version: int = 0) -> manager_pb2.VersionStats:
        with self._read() as tx:
            rec = tx.regular_file(inode)
            version = version or rec.newest_version
            if version == 0:
                raise NotFound(f"file {inode} has no committed version")
            out = _version_stats(inode, version, tx.version(inode, version))
            self._name_base(tx, out, {})
            return out

    def list_versions(self, inode: int) -> list[manager_pb2.VersionStats]:
        """Every version regular file INODE keeps, oldest first."""
        with self._read() as tx:
            tx.regular_file(inode)
            paths: dict[int, str | None] = {}
            out = [_version_stats(inode, v, rec) for v, rec in tx.versions_of(inode)]
            for stats in out:
                self._name_base(tx, stats, paths)
            return out

    @staticmethod
    def _name_base(tx: Tx, out: manager_pb2.VersionStats,
                   paths: dict[int, str | None]) -> None:
        """Name OUT's base for people as the store is now: its path, whether the file is
        gone, whether the version is still kept. PATHS caches file_path per inode."""
        if not out.base_version:
            return
        if out.base_inode not in paths:
            paths[out.base_inode] = tx.file_path(out.base_inode)
        path = paths[out.base_inode]
        out.base_removed = path is None
        out.base_path = path or ""
        out.base_version_kept = tx.has_version(out.base_inode, out.base_version)

    @_rerun_if_grown
    def restore_version(self, inode: int, version: int) -> tuple[int, manager_pb2.Attr]:
        """Make VERSION of INODE the newest again: a new version with its block-map (its
        chunks referenced once more; nothing is copied), in one write transaction."""
        _check_u64(version, "version")
        now = time.time_ns()

        def body(tx: Tx) -> tuple[int, manager_pb2.Attr]:
            rec = tx.regular_file(inode)
            if version == 0:
                raise InvalidArgument("name the version to restore (1 or more)")
            old = tx.version(inode, version)  # NotFound names the version
            entries = tx.blockmap(inode, version)
            for cid, count in Counter(cid for cid, _ in entries).items():
                crec = tx.chunk(cid)
                if crec is None:
                    raise FailedPrecondition(f"version {version} of file {inode} names chunk "
                                             f"{cid.hex()}, which the index lacks: run "
                                             f"mosafs fsck")
                crec.refcount += count
                tx.put_chunk(cid, crec, holders_same=True)
            vrec = metadata_pb2.VersionRecord(
                size=old.size, chunks=old.chunks, shared_chunks=old.chunks,
                base_inode=inode, base_version=version, new_bytes=0, commit_time_ns=now,
                mtime_ns=old.mtime_ns, shared_bytes=old.size)
            return self._add_version(tx, inode, rec, vrec, entries)
        return self._grouped(body, grows=True)

    def versions(self, inode: int) -> list[int]:
        """Committed version numbers of a file, oldest first."""
        prefix = _U64.pack(inode)
        with self._read() as tx:
            tx.regular_file(inode)
            cursor = tx.txn.cursor(db=self._db.versions)
            out = []
            if cursor.set_range(prefix):
                for key in cursor.iternext(keys=True, values=False):
                    if not key.startswith(prefix):
                        break
                    out.append(int(_VKEY.unpack(key)[1]))
            return out
