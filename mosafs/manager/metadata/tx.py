"""One transaction: typed access to every sub-database, shared by every concern of the
store."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator

import lmdb

from mosafs._proto import common_pb2, manager_pb2, metadata_pb2
from mosafs.errors import InvalidArgument, IsADirectory, NotADirectory, NotFound
from mosafs.ids import ID_LEN
from mosafs.manager.metadata.records import Fragments, _has_copies, blob_needed_on
from mosafs.manager.metadata.schema import (
    _MAX_U64,
    _U64,
    _VKEY,
    DIRECTORY,
    MAX_NAME_BYTES,
    REGULAR,
    ROOT_INODE,
    ChunkEntry,
    _Dbs,
    holding_key,
    holding_prefix,
    kind_name,
    unpack_blockmap,
)

log = logging.getLogger("mosafs.manager.metadata")


def holders_of(rec: metadata_pb2.ChunkRecord) -> set[str]:
    """The benefactors chunk record REC names: whole copies and fragment holders."""
    return set(rec.benefactor_ids) | {h for h in rec.fragment_holders if h}


def sync_holdings(txn: lmdb.Transaction[bytes], db: _Dbs, cid: bytes, before: set[str],
                  after: set[str]) -> None:
    """Bring the holdings index of chunk CID from benefactors BEFORE to AFTER."""
    for bid in before - after:
        txn.delete(holding_key(bid, cid), db=db.holdings)
    for bid in after - before:
        txn.put(holding_key(bid, cid), b"", db=db.holdings)


class Tx:
    """Typed access to the sub-databases inside one LMDB transaction.

    Decoded inodes are cached per transaction, so an operation that changes one record
    twice (a rename within one directory: the old and the new parent are the same) works on
    one object and writes both changes.
    """

    def __init__(self, txn: lmdb.Transaction[bytes], dbs: _Dbs) -> None:
        self.txn = txn
        self.db = dbs
        self._inodes: dict[int, metadata_pb2.InodeRecord] = {}
        # The benefactors each chunk record read or written in this transaction names, as
        # stored: put_chunk keeps the holdings index in step from them without reading and
        # decoding the record again (a commit reads each record, then puts it). A record
        # read is kept raw and its holders decoded only when a put needs them: a put that
        # changes only the refcount (most of a commit's, `holders_same`) needs none, and
        # walking the record's repeated fields was 40 % of a commit's CPU.
        self._stored_holders: dict[bytes, set[str]] = {}
        self._stored_raw: dict[bytes, bytes] = {}
        # Chunks whose refcount this transaction brought to 0 and left there (one released
        # and referenced again in it, as a commit that replaces a provisional version
        # does, is not): told to the store's `on_unreferenced` once it has committed
        # (garbage collection's queue).
        self.unreferenced: dict[bytes, None] = {}

    # inodes
    def find_inode(self, ino: int) -> metadata_pb2.InodeRecord | None:
        if not 0 < ino <= _MAX_U64:
            return None
        rec = self._inodes.get(ino)
        if rec is None:
            raw = self.txn.get(_U64.pack(ino), db=self.db.inodes)
            if raw is None:
                return None
            rec = metadata_pb2.InodeRecord.FromString(raw)
            self._inodes[ino] = rec
        return rec

    def inode(self, ino: int) -> metadata_pb2.InodeRecord:
        rec = self.find_inode(ino)
        if rec is None:
            raise NotFound(f"no inode {ino}")
        return rec

    def directory(self, ino: int) -> metadata_pb2.InodeRecord:
        rec = self.inode(ino)
        if rec.kind != DIRECTORY:
            raise NotADirectory(f"inode {ino} is not a directory")
        return rec

    def regular_file(self, ino: int) -> metadata_pb2.InodeRecord:
        """A file with versions: IsADirectory for a directory, InvalidArgument for a
        symlink, FIFO or socket (EINVAL, as read/write of them would be here)."""
        rec = self.inode(ino)
        if rec.kind == DIRECTORY:
            raise IsADirectory(f"inode {ino} is a directory")
        if rec.kind != REGULAR:
            raise InvalidArgument(f"inode {ino} is {kind_name(rec.kind)}, not a regular "
                                  f"file: it has no data")
        return rec

    def put_inode(self, ino: int, rec: metadata_pb2.InodeRecord) -> None:
        self._inodes[ino] = rec
        self.txn.put(_U64.pack(ino), rec.SerializeToString(), db=self.db.inodes)

    def delete_inode(self, ino: int) -> None:
        self._inodes.pop(ino, None)
        self.txn.delete(_U64.pack(ino), db=self.db.inodes)

    def allocate_inode(self) -> int:
        raw = self.txn.get(b"next_inode", db=self.db.meta)
        assert raw is not None, "meta/next_inode is written when the store is created"
        ino: int = _U64.unpack(raw)[0]
        self.txn.put(b"next_inode", _U64.pack(ino + 1), db=self.db.meta)
        return ino

    # directory entries
    def child(self, parent: int, name: bytes) -> int | None:
        raw = self.txn.get(_U64.pack(parent) + name, db=self.db.dirents)
        return None if raw is None else int(_U64.unpack(raw)[0])

    def link(self, parent: int, name: bytes, ino: int) -> None:
        self.txn.put(_U64.pack(parent) + name, _U64.pack(ino), db=self.db.dirents)

    def unlink_entry(self, parent: int, name: bytes) -> None:
        self.txn.delete(_U64.pack(parent) + name, db=self.db.dirents)

    def has_entries(self, ino: int) -> bool:
        prefix = _U64.pack(ino)
        cursor = self.txn.cursor(db=self.db.dirents)
        return cursor.set_range(prefix) and cursor.key().startswith(prefix)

    def entries(self, ino: int, start_after: bytes) -> Iterator[tuple[bytes, int]]:
        """(name, child) of directory INO in bytewise name order, after START_AFTER."""
        prefix = _U64.pack(ino)
        cursor = self.txn.cursor(db=self.db.dirents)
        if not cursor.set_range(prefix + start_after):
            return
        for key, value in cursor:
            if not key.startswith(prefix):
                return
            name = key[len(prefix):]
            if name != start_after:
                yield name, int(_U64.unpack(value)[0])

    def is_ancestor(self, ancestor: int, ino: int) -> bool:
        """Whether directory ANCESTOR is INO or above it."""
        seen = set()
        while ino not in seen:
            if ino == ancestor:
                return True
            if ino == ROOT_INODE:
                return False
            seen.add(ino)
            ino = self.inode(ino).parent
        raise RuntimeError(f"directory parent pointers loop at inode {ino}")

    # versions and block-maps
    def version(self, ino: int, version: int) -> metadata_pb2.VersionRecord:
        raw = self.txn.get(_VKEY.pack(ino, version), db=self.db.versions)
        if raw is None:
            raise NotFound(f"file {ino} has no version {version}")
        return metadata_pb2.VersionRecord.FromString(raw)

    def blockmap(self, ino: int, version: int) -> list[ChunkEntry]:
        raw = self.txn.get(_VKEY.pack(ino, version), db=self.db.blockmaps)
        if raw is None:
            raise NotFound(f"file {ino} has no block-map for version {version}")
        return unpack_blockmap(raw)

    def versions_of(self, ino: int) -> list[tuple[int, metadata_pb2.VersionRecord]]:
        """(version, record) of every version file INO keeps, oldest first."""
        prefix = _U64.pack(ino)
        out = []
        cursor = self.txn.cursor(db=self.db.versions)
        if cursor.set_range(prefix):
            for key, raw in cursor:
                if not key.startswith(prefix):
                    break
                out.append((int(_VKEY.unpack(key)[1]),
                            metadata_pb2.VersionRecord.FromString(raw)))
        return out

    def has_version(self, ino: int, version: int) -> bool:
        return self.txn.get(_VKEY.pack(ino, version), db=self.db.versions) is not None

    def drop_version(self, ino: int, version: int) -> None:
        """Delete one version that is not the newest (pruning, a provisional version
        replaced) and release its chunks."""
        key = _VKEY.pack(ino, version)
        raw = self.txn.get(key, db=self.db.blockmaps)
        if raw is not None:
            for cid, count in Counter(cid for cid, _ in unpack_blockmap(raw)).items():
                self.release_chunk(cid, count)
        self.txn.delete(key, db=self.db.blockmaps)
        self.txn.delete(key, db=self.db.versions)

    def origin(self, ino: int) -> tuple[int, bytes] | None:
        """The folder and name of regular file INO, if that entry still names it."""
        rec = self.inode(ino)
        if not rec.parent or not rec.name or self.child(rec.parent, rec.name) != ino:
            return None
        return rec.parent, bytes(rec.name)

    def drop_file(self, ino: int) -> None:
        """Delete a file's inode, versions and block-maps; release its chunk references."""
        prefix = _U64.pack(ino)
        released: Counter[bytes] = Counter()
        blockmap_keys = []
        cursor = self.txn.cursor(db=self.db.blockmaps)
        if cursor.set_range(prefix):
            for key, value in cursor:
                if not key.startswith(prefix):
                    break
                blockmap_keys.append(key)
                released.update(cid for cid, _ in unpack_blockmap(value))
        version_keys = []
        cursor = self.txn.cursor(db=self.db.versions)
        if cursor.set_range(prefix):
            for key in cursor.iternext(keys=True, values=False):
                if not key.startswith(prefix):
                    break
                version_keys.append(key)
        for key in blockmap_keys:
            self.txn.delete(key, db=self.db.blockmaps)
        for key in version_keys:
            self.txn.delete(key, db=self.db.versions)
        for cid, count in released.items():
            self.release_chunk(cid, count)
        self.forget_inode(ino)

    def forget_inode(self, ino: int) -> None:
        """Delete inode INO's record, its extended attributes and folder settings (the
        versions of a file are drop_file's)."""
        prefix = _U64.pack(ino)
        for name, _ in list(self.xattrs(ino)):
            self.txn.delete(prefix + name, db=self.db.xattrs)
        self.txn.delete(prefix, db=self.db.folders)
        self.delete_inode(ino)

    # extended attributes
    def xattrs(self, ino: int) -> Iterator[tuple[bytes, bytes]]:
        """(name, value) of every extended attribute of INO, in bytewise name order."""
        prefix = _U64.pack(ino)
        cursor = self.txn.cursor(db=self.db.xattrs)
        if not cursor.set_range(prefix):
            return
        for key, value in cursor:
            if not key.startswith(prefix):
                return
            yield key[len(prefix):], value

    def xattr(self, ino: int, name: bytes) -> bytes | None:
        return self.txn.get(_U64.pack(ino) + name, db=self.db.xattrs)

    # chunk index
    def chunk(self, cid: bytes) -> metadata_pb2.ChunkRecord | None:
        raw = self.txn.get(cid, db=self.db.chunks)
        if raw is None:
            return None
        self._stored_holders.pop(cid, None)
        self._stored_raw[cid] = raw
        return metadata_pb2.ChunkRecord.FromString(raw)

    def held(self, bid: str, after: bytes = b"") -> Iterator[bytes]:
        """The chunk ids the holdings index lists under benefactor BID, in order, after
        chunk id AFTER (b"": from the first)."""
        prefix = holding_prefix(bid)
        cursor = self.txn.cursor(db=self.db.holdings)
        found = cursor.set_range(prefix + after)
        while found:
            key = bytes(cursor.key())
            if not key.startswith(prefix):
                return
            if key[len(prefix):] != after:
                yield key[len(prefix):]
            found = cursor.next()

    def _holders_stored(self, cid: bytes) -> set[str]:
        """The benefactors CID's stored record names (none without a record)."""
        known = self._stored_holders.get(cid)
        if known is not None:
            return known
        raw = self._stored_raw.pop(cid, None)
        if raw is None:
            raw = self.txn.get(cid, db=self.db.chunks)
        known = set() if raw is None else holders_of(metadata_pb2.ChunkRecord.FromString(raw))
        self._stored_holders[cid] = known
        return known

    def put_chunk(self, cid: bytes, rec: metadata_pb2.ChunkRecord, *,
                  holders_same: bool = False) -> None:
        """Store REC, keeping the holdings index in step with the benefactors it names.
        HOLDERS_SAME: REC is the stored record as chunk() read it in this transaction,
        with no benefactor or fragment holder changed (a reference counted): the index
        needs nothing."""
        if rec.refcount:
            if cid in self.unreferenced:
                del self.unreferenced[cid]  # referenced again in the same transaction
            if rec.unreferenced_ns:
                rec.unreferenced_ns = 0
        if not (holders_same and (cid in self._stored_raw or cid in self._stored_holders)):
            after = holders_of(rec)
            sync_holdings(self.txn, self.db, cid, self._holders_stored(cid), after)
            self._stored_holders[cid] = after
            self._stored_raw.pop(cid, None)
        self.txn.put(cid, rec.SerializeToString(), db=self.db.chunks)

    def drop_location(self, cid: bytes, rec: metadata_pb2.ChunkRecord, bid: str) -> bool:
        """Benefactor BID no longer holds a whole copy of chunk CID: out of its record; a
        record left with no copy, no fragment and no reference is deleted (a referenced
        one stays: lost until a copy turns up). Whether the record was deleted."""
        holders = [b for b in rec.benefactor_ids if b != bid]
        del rec.benefactor_ids[:]
        rec.benefactor_ids.extend(holders)
        return self._store_or_forget(cid, rec)

    def drop_fragment(self, cid: bytes, rec: metadata_pb2.ChunkRecord, fid: bytes,
                      bid: str) -> bool:
        """Benefactor BID no longer holds fragment blob FID of chunk CID: the slots where
        it was recorded are emptied; as drop_location. Whether the record was deleted."""
        for i, (f, holder) in enumerate(zip(rec.fragment_ids, rec.fragment_holders,
                                            strict=True)):
            if f == fid and holder == bid:
                rec.fragment_holders[i] = ""
        return self._store_or_forget(cid, rec)

    def drop_benefactor(self, cid: bytes, rec: metadata_pb2.ChunkRecord, bid: str) -> bool:
        """BID holds nothing of CID any more (whole copy or fragment); as drop_location."""
        holders = [b for b in rec.benefactor_ids if b != bid]
        del rec.benefactor_ids[:]
        rec.benefactor_ids.extend(holders)
        for i, holder in enumerate(rec.fragment_holders):
            if holder == bid:
                rec.fragment_holders[i] = ""
        return self._store_or_forget(cid, rec)

    def _store_or_forget(self, cid: bytes, rec: metadata_pb2.ChunkRecord) -> bool:
        if rec.refcount == 0 and not _has_copies(rec):
            self.delete_chunk(cid, rec)
            return True
        self.put_chunk(cid, rec)
        return False

    def delete_chunk(self, cid: bytes, rec: metadata_pb2.ChunkRecord) -> None:
        """Delete CID's record and its entries in the fragment and holdings indexes."""
        for fid in set(rec.fragment_ids):
            self.txn.delete(bytes(fid) + cid, db=self.db.fragments)
        sync_holdings(self.txn, self.db, cid, self._holders_stored(cid), set())
        self._stored_holders[cid] = set()
        self._stored_raw.pop(cid, None)
        self.txn.delete(cid, db=self.db.chunks)

    def set_fragments(self, cid: bytes, rec: metadata_pb2.ChunkRecord,
                      frag: Fragments) -> None:
        """Give REC (of CID; the caller puts it) the fragment layout FRAG, keeping the
        fragment index in step: entries of fragments it no longer names go."""
        old = {bytes(f) for f in rec.fragment_ids}
        new = set(frag.ids)
        for fid in old - new:
            self.txn.delete(fid + cid, db=self.db.fragments)
        for fid in new - old:
            self.txn.put(fid + cid, b"", db=self.db.fragments)
        rec.ec_k, rec.ec_m = frag.k, frag.m
        del rec.fragment_ids[:]
        rec.fragment_ids.extend(frag.ids)
        del rec.fragment_holders[:]
        rec.fragment_holders.extend(frag.holders)

    def fragment_owners(self, fid: bytes) -> list[bytes]:
        """Ids of the chunk records that name FID as one of their fragments."""
        cursor = self.txn.cursor(db=self.db.fragments)
        out: list[bytes] = []
        if not cursor.set_range(fid):
            return out
        for key in cursor.iternext(keys=True, values=False):
            if key[:ID_LEN] != fid:
                break
            out.append(bytes(key[ID_LEN:]))
        return out

    def blob_referenced(self, blob: bytes) -> bool:
        """Whether a stored blob named BLOB is needed: a referenced chunk, or a fragment
        of one."""
        rec = self.chunk(blob)
        if rec is not None and rec.refcount > 0:
            return True
        return any((owner := self.chunk(cid)) is not None and owner.refcount > 0
                   for cid in self.fragment_owners(blob))

    def blob_needed_on(self, blob: bytes, bid: str) -> bool:
        """Whether BLOB stored on benefactor BID must stay (blob_needed_on)."""
        owners = [rec for cid in self.fragment_owners(blob)
                  if (rec := self.chunk(cid)) is not None]
        return blob_needed_on(blob, bid, self.chunk(blob), owners)

    def clear_fragments(self, cid: bytes, rec: metadata_pb2.ChunkRecord) -> None:
        """REC (of CID; the caller puts it) is no longer erasure-coded: its fragment
        fields go, with their entries in the fragment index."""
        for fid in {bytes(f) for f in rec.fragment_ids}:
            self.txn.delete(fid + cid, db=self.db.fragments)
        rec.ec_k = rec.ec_m = 0
        del rec.fragment_ids[:]
        del rec.fragment_holders[:]

    def release_chunk(self, cid: bytes, count: int) -> None:
        rec = self.chunk(cid)
        if rec is None or rec.refcount < count:
            # The invariant is broken (a bug or damage); removing the file must still work.
            log.error("chunk index damaged: %s has refcount %s, releasing %d",
                      cid.hex(), None if rec is None else rec.refcount, count)
            if rec is None:
                return
        rec.refcount = max(0, rec.refcount - count)
        if rec.refcount == 0:
            # When it became garbage, kept with it: collection compares it with the
            # writes still open (ChunkRecord.unreferenced_ns).
            rec.unreferenced_ns = time.time_ns()
            self.unreferenced[cid] = None
        self.put_chunk(cid, rec, holders_same=True)

    # registrations
    def benefactor(self, bid: str) -> metadata_pb2.BenefactorRecord | None:
        raw = self.txn.get(bid.encode(), db=self.db.benefactors)
        return None if raw is None else metadata_pb2.BenefactorRecord.FromString(raw)

    def pool(self, name: str) -> metadata_pb2.PoolRecord | None:
        key = name.encode("utf-8", "replace")
        if not 0 < len(key) <= MAX_NAME_BYTES:  # no pool has such a name (LMDB keys < 512)
            return None
        raw = self.txn.get(key, db=self.db.pools)
        return None if raw is None else metadata_pb2.PoolRecord.FromString(raw)

    def put_pool(self, settings: common_pb2.PoolSettings) -> None:
        rec = metadata_pb2.PoolRecord(settings=settings)
        self.txn.put(settings.name.encode(), rec.SerializeToString(), db=self.db.pools)

    def put_benefactor(self, bid: str, rec: metadata_pb2.BenefactorRecord) -> None:
        self.txn.put(bid.encode(), rec.SerializeToString(), db=self.db.benefactors)

    # folder settings
    def folder(self, ino: int) -> manager_pb2.FolderSettings | None:
        raw = self.txn.get(_U64.pack(ino), db=self.db.folders)
        return None if raw is None else metadata_pb2.FolderRecord.FromString(raw).settings

    def put_folder(self, ino: int, settings: manager_pb2.FolderSettings) -> None:
        """Store SETTINGS of directory INO; settings that set nothing are deleted."""
        key = _U64.pack(ino)
        if settings.ByteSize() == 0:
            self.txn.delete(key, db=self.db.folders)
        else:
            rec = metadata_pb2.FolderRecord(settings=settings)
            self.txn.put(key, rec.SerializeToString(), db=self.db.folders)

    def folders(self) -> Iterator[tuple[int, manager_pb2.FolderSettings]]:
        for key, raw in self.txn.cursor(db=self.db.folders):
            yield int(_U64.unpack(key)[0]), metadata_pb2.FolderRecord.FromString(raw).settings

    def name_of(self, ino: int) -> bytes | None:
        """A directory's name in its parent (a scan of the parent for old records)."""
        rec = self.inode(ino)
        if ino == ROOT_INODE:
            return b""
        if rec.name and self.child(rec.parent, rec.name) == ino:
            return bytes(rec.name)
        for name, child in self.entries(rec.parent, b""):
            if child == ino:
                return name
        return None

    def file_path(self, ino: int) -> str | None:
        """/a/b of regular file INO by its folder entry, for people: "" when it has none
        (that name went while other hard links remain), None when INO is gone."""
        if self.find_inode(ino) is None:
            return None
        origin = self.origin(ino)
        if origin is None:
            return ""
        parent, name = origin
        return self.path_of(parent).rstrip("/") + "/" + name.decode("utf-8", "replace")

    def path_of(self, ino: int) -> str:
        """/a/b of directory INO, for people ("?" where a name cannot be found)."""
        names: list[str] = []
        seen: set[int] = set()
        while ino != ROOT_INODE and ino not in seen:
            seen.add(ino)
            name = self.name_of(ino)
            names.append("?" if name is None else name.decode("utf-8", "replace"))
            ino = self.inode(ino).parent
        return "/" + "/".join(reversed(names))
