"""`mosafs fsck`: check the metadata invariants (docs/metadata.md, the docstring of
mosafs.manager.metadata.schema) over the whole store, and repair what can be repaired.

A check runs in one read transaction, so it sees one consistent snapshot while the manager
keeps serving; a repair runs the same check inside one write transaction and fixes what it
finds there, so nothing changes between the finding and the fix. Both scan every
sub-database once.

What is checked, and the repair of each finding (docs/metadata.md has the table):

  dangling_dirent       a dirent whose parent is not a directory or whose child does not
                        exist: the dirent is deleted
  dangling_version      a VersionRecord of a missing inode, of an inode that is not a
                        regular file, beyond the inode's newest_version, or without its
                        block-map: the record (and block-map) is deleted
  dangling_blockmap     a block-map without its VersionRecord: deleted
  bad_blockmap          a block-map whose length is not a multiple of 40: not repairable
  newest_version        an inode whose newest_version has no (sound) version: it becomes
                        the newest one left (0 with none)
  size                  a regular file whose size is not its newest version's: corrected
  nlink                 nlink not what the dirents give: corrected
  orphan_inode          an inode (not the root) no dirent names: deleted with its versions
                        and attributes (a directory only when empty; else not repairable)
  directory_parent      a directory whose parent field (or name, where kept) is not the
                        entry naming it: set
  bad_kind              an inode of a kind mosafs does not know: not repairable
  rdev                  a device number on an inode that is not a device node: cleared
  attribute             an attribute outside what SetAttr accepts (stores written before it
                        checked): mode bits outside 0o7777 masked, a symlink's mode 0777,
                        the root directory's owner rwx added; uid/gid 2**32-1 (or above
                        MAX_OWNER_ID) set to 65534 (nobody/nogroup; setuid and setgid
                        cleared, as chown does); times outside MIN_TIME_NS..MAX_TIME_NS
                        clamped into it
  file_folder           a non-directory whose parent/name is not one of its entries: cleared
                        (a file of no known folder; its next rename gives it one again)
  orphan_xattr          extended attributes of a missing inode: deleted
  refcount              ChunkRecord.refcount not the number of block-map entries naming the
                        id: recounted
  missing_chunk_record  an id a block-map names has no record: created with the count and
                        no locations; the next inventory rounds add the benefactors that
                        hold it (reconciliation)
  chunk_length          a record whose length differs from a block-map's: not repairable
  unknown_benefactor    a location naming a benefactor that is not registered: dropped
  duplicate_location    a benefactor named twice in one record: once
  bad_fragments         an erasure-coded record whose K or M is out of range, or whose
                        fragment ids or holders are not K+M
                        (ids not 32 bytes): not repairable
  fragment_holder       a fragment slot naming an unregistered benefactor, or a benefactor
                        that holds another fragment of the chunk: the slot is emptied
  fragment_index        the fragments index lacks an entry of a record's fragment id, or
                        holds one no record names: added / deleted (garbage collection
                        keeps a fragment only while the index names it)
  holdings_index        the holdings index lacks an entry of a benefactor a record names,
                        or holds one no record names: added / deleted (a dead benefactor's
                        chunks are found through it)
  next_inode            the inode counter at or below an inode in use: raised
  root                  no root directory: not repairable
  default_pool          no pool "default": created with the default settings
  dangling_folder       folder settings of an inode that is not a directory: deleted
  unknown_pool          folder settings or a benefactor naming a pool that does not exist:
                        the folder inherits its parent's pool, the benefactor joins
                        "default"

Domain code: no gRPC.
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mosafs._proto import metadata_pb2
from mosafs.manager import pools
from mosafs.manager.metadata import (
    BLOCKMAP_ENTRY,
    DEVICES,
    DIRECTORY,
    KINDS,
    MAX_OWNER_ID,
    MAX_TIME_NS,
    MIN_TIME_NS,
    REGULAR,
    ROOT_INODE,
    ROOT_OWNER_BITS,
    SYMLINK,
    MetadataStore,
    kind_name,
)
from mosafs.manager.metadata.schema import holding_key
from mosafs.manager.metadata.tx import holders_of, sync_holdings

_U64 = struct.Struct(">Q")
_VKEY = struct.Struct(">QQ")
NOBODY = 65534  # the owner an unusable uid or gid is repaired to (nobody, nogroup)
MAX_FINDINGS = 10_000  # in one report; the rest are counted in a last finding


@dataclass(frozen=True)
class Finding:
    kind: str
    detail: str
    repairable: bool = True


@dataclass
class FsckResult:
    findings: list[Finding] = field(default_factory=list)
    repaired: bool = False
    inodes: int = 0
    versions: int = 0
    chunks: int = 0
    dirents: int = 0
    _more: int = 0

    def add(self, kind: str, detail: str, repairable: bool = True) -> None:
        if len(self.findings) < MAX_FINDINGS:
            self.findings.append(Finding(kind, detail, repairable))
        else:
            self._more += 1

    def close(self) -> None:
        if self._more:
            self.findings.append(Finding("more", f"{self._more} more findings not listed",
                                         False))
            self._more = 0


def fsck(store: MetadataStore, *, repair: bool = False) -> FsckResult:
    """Check every invariant; with REPAIR, fix what is repairable in the same (write)
    transaction. The findings are what was found (and, with REPAIR, fixed)."""
    with store.transaction(write=repair) as tx:
        result = _Check(tx, fix=repair).run()
    result.repaired = repair
    result.close()
    return result


class _Check:
    def __init__(self, tx: Any, *, fix: bool) -> None:
        self.tx = tx
        self.txn = tx.txn
        self.db = tx.db
        self.fix = fix
        self.out = FsckResult()
        self.top = ROOT_INODE
        self.dir_names: dict[int, bytes] = {}  # directory -> its name in its parent

    def run(self) -> FsckResult:
        inodes = self._inodes()
        self._kinds(inodes)
        names, subdirs, parents = self._dirents(inodes)
        self._orphans_and_nlinks(inodes, names, subdirs, parents)
        self._file_folders(inodes)
        newest = self._versions(inodes)
        counted, lengths = self._blockmaps(newest)
        self._newest_versions(inodes, newest)
        self._xattrs(inodes)
        self._chunks(counted, lengths)
        self._meta()
        self._folders(inodes)
        return self.out

    # -- namespace ---------------------------------------------------------------------------

    def _inodes(self) -> dict[int, metadata_pb2.InodeRecord]:
        inodes = {int(_U64.unpack(key)[0]): metadata_pb2.InodeRecord.FromString(raw)
                  for key, raw in self.txn.cursor(db=self.db.inodes)}
        self.out.inodes = len(inodes)
        self.top = max(inodes, default=ROOT_INODE)  # orphans deleted later count too
        root = inodes.get(ROOT_INODE)
        if root is None or root.kind != DIRECTORY:
            self.out.add("root", "inode 1 is not a directory: the store is not usable",
                         False)
        return inodes

    def _kinds(self, inodes: dict[int, metadata_pb2.InodeRecord]) -> None:
        """Every inode is of a known kind (FIFOs, sockets and device nodes included), and
        only device nodes carry a device number."""
        for ino, rec in sorted(inodes.items()):
            if rec.kind not in KINDS:
                self.out.add("bad_kind", f"inode {ino} is {kind_name(rec.kind)}", False)
            elif rec.rdev and rec.kind not in DEVICES:
                self.out.add("rdev", f"inode {ino} ({kind_name(rec.kind)}) has device number "
                             f"{rec.rdev:#x}; only device nodes have one")
                rec.rdev = 0
                self._put_inode(ino, rec)
            self._attributes(ino, rec)

    def _attributes(self, ino: int, rec: metadata_pb2.InodeRecord) -> None:
        """Mode, owner and times within what SetAttr and the creates accept
        (docs/metadata.md, "Attribute values"); repaired to the nearest value that is."""
        wrong = []
        mode = rec.mode & 0o7777
        if rec.kind == SYMLINK:
            mode = 0o777
        elif ino == ROOT_INODE:
            mode |= ROOT_OWNER_BITS
        for what in ("uid", "gid"):
            value = getattr(rec, what)
            if value > MAX_OWNER_ID:
                wrong.append(f"{what} {value}")
                setattr(rec, what, NOBODY)
                mode &= ~0o6000  # as chown(2) does: no setuid/setgid for the new owner
        if mode != rec.mode:
            wrong.append(f"mode {rec.mode:#o}")
            rec.mode = mode
        for what in ("atime_ns", "mtime_ns", "ctime_ns"):
            value = getattr(rec, what)
            if not MIN_TIME_NS <= value <= MAX_TIME_NS:
                wrong.append(f"{what} {value}")
                setattr(rec, what, min(max(value, MIN_TIME_NS), MAX_TIME_NS))
        if wrong:
            self.out.add("attribute", f"inode {ino} ({kind_name(rec.kind)}) has "
                         f"{', '.join(wrong)}: outside what SetAttr accepts")
            self._put_inode(ino, rec)

    def _dirents(self, inodes: dict[int, metadata_pb2.InodeRecord],
                 ) -> tuple[Counter[int], Counter[int], dict[int, int]]:
        names: Counter[int] = Counter()
        subdirs: Counter[int] = Counter()
        parents: dict[int, int] = {}  # directory -> the directory naming it
        dangling = []
        for key, value in self.txn.cursor(db=self.db.dirents):
            self.out.dirents += 1
            parent = int(_U64.unpack(key[:8])[0])
            child = int(_U64.unpack(value)[0])
            name = bytes(key[8:]).decode("utf-8", "replace")
            prec = inodes.get(parent)
            if prec is None or prec.kind != DIRECTORY or child not in inodes:
                what = ("its directory does not exist" if prec is None else
                        "its parent is not a directory" if prec.kind != DIRECTORY else
                        f"inode {child} does not exist")
                self.out.add("dangling_dirent", f"entry {name!r} of inode {parent}: {what}")
                dangling.append(bytes(key))
                continue
            names[child] += 1
            if inodes[child].kind == DIRECTORY:
                subdirs[parent] += 1
                parents[child] = parent
                self.dir_names[child] = bytes(key[8:])
        if self.fix:
            for key in dangling:
                self.txn.delete(key, db=self.db.dirents)
        return names, subdirs, parents

    def _orphans_and_nlinks(self, inodes: dict[int, metadata_pb2.InodeRecord],
                            names: Counter[int], subdirs: Counter[int],
                            parents: dict[int, int]) -> None:
        for ino, rec in sorted(inodes.items()):
            if ino != ROOT_INODE and names[ino] == 0:
                empty = not self.tx.has_entries(ino)  # a subdirectory is an entry too
                self.out.add("orphan_inode", f"inode {ino} ({kind_name(rec.kind)}) has no name",
                             empty)
                if self.fix and empty:
                    self._forget(ino)
                    del inodes[ino]
                continue
            expected = 2 + subdirs[ino] if rec.kind == DIRECTORY else names[ino]
            if rec.nlink != expected:
                self.out.add("nlink", f"inode {ino} has nlink {rec.nlink}, its names give "
                             f"{expected}")
                rec.nlink = expected
                self._put_inode(ino, rec)
            if rec.kind == DIRECTORY and ino != ROOT_INODE and (
                    rec.parent != parents[ino] or rec.name not in (b"", self.dir_names[ino])):
                self.out.add("directory_parent", f"directory {ino} has parent {rec.parent} "
                             f"and name {bytes(rec.name)!r}, it is named "
                             f"{self.dir_names[ino]!r} in {parents[ino]}")
                rec.parent, rec.name = parents[ino], self.dir_names[ino]
                self._put_inode(ino, rec)

    def _file_folders(self, inodes: dict[int, metadata_pb2.InodeRecord]) -> None:
        for ino, rec in sorted(inodes.items()):
            if rec.kind == DIRECTORY or not rec.parent:
                continue
            if not rec.name or self.tx.child(rec.parent, bytes(rec.name)) != ino:
                self.out.add("file_folder", f"inode {ino} ({kind_name(rec.kind)}) says it "
                             f"is {bytes(rec.name)!r} in "
                             f"directory {rec.parent}, which names something else")
                rec.parent, rec.name = 0, b""
                self._put_inode(ino, rec)

    def _forget(self, ino: int) -> None:
        """Delete an orphan inode with its versions, block-maps and xattrs (chunk counts
        are recounted afterwards)."""
        prefix = _U64.pack(ino)
        self.txn.delete(prefix, db=self.db.folders)
        for db in (self.db.versions, self.db.blockmaps, self.db.xattrs):
            cursor = self.txn.cursor(db=db)
            keys = []
            if cursor.set_range(prefix):
                for key in cursor.iternext(keys=True, values=False):
                    if not key.startswith(prefix):
                        break
                    keys.append(bytes(key))
            for key in keys:
                self.txn.delete(key, db=db)
        self.txn.delete(prefix, db=self.db.inodes)

    def _put_inode(self, ino: int, rec: metadata_pb2.InodeRecord) -> None:
        if self.fix:
            self.tx.put_inode(ino, rec)

    # -- versions and block-maps -------------------------------------------------------------

    def _versions(self, inodes: dict[int, metadata_pb2.InodeRecord],
                  ) -> dict[int, dict[int, metadata_pb2.VersionRecord]]:
        """inode -> version -> record, of the sound versions."""
        sound: dict[int, dict[int, metadata_pb2.VersionRecord]] = {}
        dangling = []
        for key, raw in self.txn.cursor(db=self.db.versions):
            self.out.versions += 1
            ino, version = _VKEY.unpack(key)
            rec = inodes.get(ino)
            problem = ("its inode does not exist" if rec is None else
                       "its inode is not a regular file" if rec.kind != REGULAR else
                       f"the inode's newest version is {rec.newest_version}"
                       if version > rec.newest_version else
                       "it has no block-map"
                       if self.txn.get(bytes(key), db=self.db.blockmaps) is None else "")
            if problem:
                self.out.add("dangling_version", f"version {version} of inode {ino}: {problem}")
                dangling.append(bytes(key))
                continue
            sound.setdefault(ino, {})[version] = metadata_pb2.VersionRecord.FromString(raw)
        if self.fix:
            for key in dangling:
                self.txn.delete(key, db=self.db.versions)
                self.txn.delete(key, db=self.db.blockmaps)
        return sound

    def _blockmaps(self, sound: dict[int, dict[int, metadata_pb2.VersionRecord]],
                   ) -> tuple[Counter[bytes], dict[bytes, int]]:
        counted: Counter[bytes] = Counter()
        lengths: dict[bytes, int] = {}
        dangling = []
        for key, value in self.txn.cursor(db=self.db.blockmaps):
            ino, version = _VKEY.unpack(key)
            if version not in sound.get(ino, {}):
                if self.txn.get(bytes(key), db=self.db.versions) is None:
                    self.out.add("dangling_blockmap",
                                 f"block-map of version {version} of inode {ino} has no "
                                 f"version record")
                    dangling.append(bytes(key))
                continue
            if len(value) % BLOCKMAP_ENTRY.size:
                self.out.add("bad_blockmap", f"block-map of version {version} of inode {ino} "
                             f"is {len(value)} bytes, not a multiple of "
                             f"{BLOCKMAP_ENTRY.size}", False)
                continue
            for cid, length in BLOCKMAP_ENTRY.iter_unpack(value):
                counted[cid] += 1
                lengths.setdefault(cid, length)
        if self.fix:
            for key in dangling:
                self.txn.delete(key, db=self.db.blockmaps)
        return counted, lengths

    def _newest_versions(self, inodes: dict[int, metadata_pb2.InodeRecord],
                         sound: dict[int, dict[int, metadata_pb2.VersionRecord]]) -> None:
        for ino, rec in sorted(inodes.items()):
            if rec.kind != REGULAR:
                continue
            versions = sound.get(ino, {})
            if rec.newest_version and rec.newest_version not in versions:
                newest = max(versions, default=0)
                self.out.add("newest_version", f"inode {ino}: newest version "
                             f"{rec.newest_version} does not exist; {newest} is the newest")
                rec.newest_version = newest
                self._put_inode(ino, rec)
            size = versions[rec.newest_version].size if rec.newest_version else 0
            if rec.size != size:
                self.out.add("size", f"inode {ino} has size {rec.size}, its newest version "
                             f"{size}")
                rec.size = size
                self._put_inode(ino, rec)

    def _xattrs(self, inodes: dict[int, metadata_pb2.InodeRecord]) -> None:
        orphans = []
        for key in self.txn.cursor(db=self.db.xattrs).iternext(keys=True, values=False):
            ino = int(_U64.unpack(key[:8])[0])
            if ino not in inodes:
                self.out.add("orphan_xattr", f"attribute {bytes(key[8:])!r} of missing inode "
                             f"{ino}")
                orphans.append(bytes(key))
        if self.fix:
            for key in orphans:
                self.txn.delete(key, db=self.db.xattrs)

    # -- chunk index -------------------------------------------------------------------------

    def _chunks(self, counted: Counter[bytes], lengths: dict[bytes, int]) -> None:
        registered = {bytes(key).decode() for key in
                      self.txn.cursor(db=self.db.benefactors).iternext(keys=True, values=False)}
        fixed: list[tuple[bytes, metadata_pb2.ChunkRecord]] = []
        seen = set()
        # What the fragments index holds; _fragments takes out what records name.
        indexed = {bytes(key) for key in
                   self.txn.cursor(db=self.db.fragments).iternext(keys=True, values=False)}
        for cid, raw in self.txn.cursor(db=self.db.chunks):
            cid = bytes(cid)
            seen.add(cid)
            self.out.chunks += 1
            rec = metadata_pb2.ChunkRecord.FromString(raw)
            changed = False
            want = counted.get(cid, 0)
            if rec.refcount != want:
                self.out.add("refcount", f"chunk {cid.hex()} has refcount {rec.refcount}, "
                             f"block-maps name it {want} times")
                rec.refcount = want
                changed = True
            if cid in lengths and rec.length != lengths[cid]:
                self.out.add("chunk_length", f"chunk {cid.hex()} has length {rec.length} in "
                             f"the index, {lengths[cid]} in a block-map", False)
            holders: list[str] = []
            for bid in rec.benefactor_ids:
                if bid not in registered:
                    self.out.add("unknown_benefactor", f"chunk {cid.hex()} names benefactor "
                                 f"{bid!r}, which is not registered")
                elif bid in holders:
                    self.out.add("duplicate_location", f"chunk {cid.hex()} names benefactor "
                                 f"{bid} twice")
                else:
                    holders.append(bid)
            if holders != list(rec.benefactor_ids):
                del rec.benefactor_ids[:]
                rec.benefactor_ids.extend(holders)
                changed = True
            changed |= self._fragments(cid, rec, registered, indexed)
            if changed:
                fixed.append((cid, rec))
        for cid, count in sorted(counted.items()):
            if cid not in seen:
                self.out.add("missing_chunk_record", f"chunk {cid.hex()} is named {count} "
                             f"times by block-maps and has no record")
                fixed.append((cid, metadata_pb2.ChunkRecord(length=lengths[cid],
                                                            refcount=count)))
        for key in sorted(indexed):
            self.out.add("fragment_index", f"the fragments index names fragment "
                         f"{key[:32].hex()} of chunk {key[32:].hex()}, which no record has")
        if self.fix:
            for cid, rec in fixed:
                raw = self.txn.get(cid, db=self.db.chunks)
                before = holders_of(metadata_pb2.ChunkRecord.FromString(raw)) if raw else set()
                sync_holdings(self.txn, self.db, cid, before, holders_of(rec))
                self.txn.put(cid, rec.SerializeToString(), db=self.db.chunks)
            for key in indexed:
                self.txn.delete(key, db=self.db.fragments)
        self._holdings({cid: rec for cid, rec in fixed})

    def _holdings(self, fixed: dict[bytes, metadata_pb2.ChunkRecord]) -> None:
        """Every benefactor a record names (as FIXED leaves it) has its holdings entry,
        and every entry a record that names it: two passes of lookups, no set of the
        whole index in memory."""
        for cid, raw in self.txn.cursor(db=self.db.chunks):
            cid = bytes(cid)
            rec = fixed.get(cid) or metadata_pb2.ChunkRecord.FromString(raw)
            for bid in sorted(holders_of(rec)):
                key = holding_key(bid, cid)
                if self.txn.get(key, db=self.db.holdings) is None:
                    self.out.add("holdings_index", f"chunk {cid.hex()} names benefactor "
                                 f"{bid}, missing from the holdings index")
                    if self.fix:
                        self.txn.put(key, b"", db=self.db.holdings)
        stale = []
        for raw_key in self.txn.cursor(db=self.db.holdings).iternext(keys=True, values=False):
            key = bytes(raw_key)
            name, _, chunk = key.partition(b"\0")
            bid = name.decode(errors="replace")
            stored = self.txn.get(chunk, db=self.db.chunks)
            record = metadata_pb2.ChunkRecord.FromString(stored) if stored else None
            named = fixed.get(chunk) or record
            # An entry the record's own repair removes (an unknown benefactor dropped) is
            # that finding's, not the index's: a check reports what a repair finds.
            if record is not None and bid in holders_of(record):
                continue
            if named is None or bid not in holders_of(named):
                self.out.add("holdings_index", f"the holdings index names benefactor {bid} "
                             f"for chunk {chunk.hex()}, which its record does not")
                stale.append(key)
        if self.fix:
            for key in stale:
                self.txn.delete(key, db=self.db.holdings)

    def _fragments(self, cid: bytes, rec: metadata_pb2.ChunkRecord, registered: set[str],
                   indexed: set[bytes]) -> bool:
        """Check an erasure-coded record's fragments and their index entries (INDEXED
        loses the ones found); whether REC was changed."""
        if not rec.ec_k and not rec.fragment_ids and not rec.fragment_holders:
            return False
        width = rec.ec_k + rec.ec_m
        if (not 1 <= rec.ec_k <= pools.MAX_EC_K or not 1 <= rec.ec_m <= pools.MAX_EC_M
                or len(rec.fragment_ids) != width
                or len(rec.fragment_holders) != width
                or any(len(f) != 32 for f in rec.fragment_ids)):
            self.out.add("bad_fragments", f"chunk {cid.hex()} is ec:{rec.ec_k}+{rec.ec_m} with "
                         f"{len(rec.fragment_ids)} fragment ids and "
                         f"{len(rec.fragment_holders)} holders", False)
            for fid in rec.fragment_ids:
                indexed.discard(bytes(fid) + cid)
            return False
        changed = False
        seen: set[str] = set()
        for i, bid in enumerate(rec.fragment_holders):
            if not bid:
                continue
            if bid not in registered or bid in seen:
                why = "is not registered" if bid not in registered else \
                    "holds another fragment of it"
                self.out.add("fragment_holder", f"fragment {i} of chunk {cid.hex()} is on "
                             f"benefactor {bid!r}, which {why}")
                rec.fragment_holders[i] = ""
                changed = True
            seen.add(bid)
        for fid in dict.fromkeys(bytes(f) for f in rec.fragment_ids):
            key = fid + cid
            if key in indexed:
                indexed.discard(key)
                continue
            self.out.add("fragment_index", f"fragment {fid.hex()} of chunk {cid.hex()} is "
                         f"missing from the fragments index")
            if self.fix:
                self.txn.put(key, b"", db=self.db.fragments)
        return changed

    # -- meta ----------------------------------------------------------------------------------

    def _meta(self) -> None:
        raw = self.txn.get(b"next_inode", db=self.db.meta)
        top = self.top  # inode numbers are never reused, not even a deleted orphan's
        if raw is None or _U64.unpack(raw)[0] <= top:
            self.out.add("next_inode", f"the inode counter is "
                         f"{None if raw is None else _U64.unpack(raw)[0]}, inode {top} exists")
            if self.fix:
                self.txn.put(b"next_inode", _U64.pack(top + 1), db=self.db.meta)
        if self.txn.get(pools.DEFAULT_POOL.encode(), db=self.db.pools) is None:
            self.out.add("default_pool", f"pool {pools.DEFAULT_POOL!r} does not exist")
            if self.fix:
                rec = metadata_pb2.PoolRecord(settings=pools.default_settings())
                self.txn.put(pools.DEFAULT_POOL.encode(), rec.SerializeToString(),
                             db=self.db.pools)

    # -- folders and pools ---------------------------------------------------------------------

    def _folders(self, inodes: dict[int, metadata_pb2.InodeRecord]) -> None:
        pools_known = {bytes(key).decode() for key in
                       self.txn.cursor(db=self.db.pools).iternext(keys=True, values=False)}
        pools_known.add(pools.DEFAULT_POOL)  # created above when missing
        for ino, settings in list(self.tx.folders()):
            rec = inodes.get(ino)
            if rec is None or rec.kind != DIRECTORY:
                self.out.add("dangling_folder", f"folder settings of inode {ino}, which is "
                             f"not a directory")
                if self.fix:
                    self.txn.delete(_U64.pack(ino), db=self.db.folders)
                continue
            if settings.HasField("pool") and settings.pool not in pools_known:
                self.out.add("unknown_pool", f"directory {ino} is assigned pool "
                             f"{settings.pool!r}, which does not exist")
                settings.ClearField("pool")
                if self.fix:
                    self.tx.put_folder(ino, settings)
        for key, raw in list(self.txn.cursor(db=self.db.benefactors)):
            brec = metadata_pb2.BenefactorRecord.FromString(raw)
            if brec.pool and brec.pool not in pools_known:
                self.out.add("unknown_pool", f"benefactor {bytes(key).decode()} is in pool "
                             f"{brec.pool!r}, which does not exist")
                brec.pool = pools.DEFAULT_POOL
                if self.fix:
                    self.txn.put(bytes(key), brec.SerializeToString(), db=self.db.benefactors)
