"""The manager's metadata store: one LMDB environment holding the namespace, file versions
and their block-maps, extended attributes, the chunk index, benefactor registrations and
pools.

Schema version 1 (docs/metadata.md says the same at more length). The environment lives in
DATA_DIR/metadata.lmdb/ (a directory: data.mdb, lock.mdb), opened with sync and metasync
on, so a write transaction that has committed is on disk when commit returns. Integers in
keys are unsigned 64-bit big-endian ("u64be") so that keys sort numerically; protobuf
records are the messages of protos/mosafs/v1/metadata.proto.

  sub-database  key                          value
  meta          b"schema"                    b"1"
                b"next_inode"                u64be: the next inode number to hand out
  inodes        u64be inode                  InodeRecord
  dirents       u64be parent + name (utf-8)  u64be child inode
  versions      u64be inode + u64be version  VersionRecord
  blockmaps     u64be inode + u64be version  packed block-map (below)
  xattrs        u64be inode + name (utf-8)   the attribute's value, raw bytes
  chunks        32-byte chunk id             ChunkRecord
  fragments     fragment id + chunk id       b"" (an index: which records name a fragment)
  benefactors   benefactor id (utf-8)        BenefactorRecord
  pools         pool name (utf-8)            PoolRecord
  folders       u64be directory inode        FolderRecord (pool, series pattern, policy)

The xattrs, folders and fragments sub-databases, InodeRecord.symlink_target and .name,
the erasure-coding fields of ChunkRecord and PoolSettings, and the parent of regular files
were added to schema 1 without a new schema number: all are additive (a store written
before them has no symlinks, empty xattrs and folders, regular files with parent 0: files
of no known folder, which fall back to the defaults, and no erasure-coded record, so its
empty fragments index is exact).

Packed block-map: the concatenation, in file order, of one 40-byte record per chunk: the
32-byte chunk id, then the chunk's length as u64 little-endian (struct "<32sQ"). A version
of N chunks is 40*N bytes; it parses with struct.iter_unpack without copying.

Inode kinds: directories, regular files, symbolic links (the target in
InodeRecord.symlink_target, size = its length), FIFOs, sockets and block and character
device nodes (metadata only, size 0; a device node's number in InodeRecord.rdev).

Invariants (every write transaction keeps them):
  - Inode 1 is the root directory; its parent is itself. Inode numbers are never reused:
    next_inode only grows.
  - Every dirent names an existing inode. Every directory except the root is named by
    exactly one dirent, and its InodeRecord.parent is the inode whose dirent names it
    (and .name that name, or empty in stores from before names were kept). A regular
    file's parent/name is one of its dirents (its folder), or 0/empty; other kinds have
    parent 0. Every non-directory is named by nlink >= 1 dirents (hard links); its last
    name going removes it.
    Names: 1..255 bytes of UTF-8, no "/" or NUL, not "." or "..".
  - nlink: a directory has 2 + its number of subdirectories; a non-directory has the
    number of dirents naming it (nlink_mismatches() checks both).
  - A regular file has a VersionRecord and a block-map for each version it keeps: a
    subset of 1..newest_version that holds newest_version (pruning removes older ones, and
    a commit removes the provisional version it replaces);
    InodeRecord.size is the newest version's size (0 with no version). Other kinds have
    no versions.
  - ChunkRecord.refcount equals the number of block-map entries naming the id, over every
    version of every file (an id twice in a block-map counts twice). Every id named by a
    block-map has a ChunkRecord. A record whose refcount drops to 0 stays until garbage
    collection removes it.
  - An erasure-coded ChunkRecord (ec_k > 0) has ec_k + ec_m fragment_ids (32 bytes each)
    and as many fragment_holders ("" or a registered benefactor, the named ones
    distinct). The fragments sub-database holds exactly one key, fragment id + chunk id,
    for each distinct fragment id of each record: garbage collection asks it whether a
    blob is a fragment some referenced chunk needs (docs/erasure_pools.md).
  - Every xattrs key names an existing inode (xattr_orphans() checks it); names start with
    "user." and not "user.mosafs."; an inode's names and values total at most 1 MiB, its
    names (each + 1) at most 64 KiB.
  - Pool "default" exists. A benefactor's pool exists. Every folders key names an existing
    directory, and the pool it assigns exists.
  - Attributes (docs/metadata.md, "Attribute values"): mode is permission bits (0o7777;
    a symlink's 0o777; the root directory's owner keeps rwx, ROOT_OWNER_BITS); uid and
    gid are 0..MAX_OWNER_ID (2**32-1, "unchanged" in chown(2), owns nothing); times are
    within MIN_TIME_NS..MAX_TIME_NS; a version is at most MAX_FILE_SIZE bytes; rdev is at
    most MAX_RDEV. Whoever asks, no request stores anything else.
mosafs.manager.fsck checks every one of these (`mosafs fsck`) and repairs what it can.

The map grows by itself up to the ceiling `map_size` (mosafs.manager.mapsize): every
transaction runs inside its gate, writes that add data are refused with NoSpace near the
ceiling while the others may use the reserve kept there, and an operation whose write
transaction found the map full runs again once the map has grown (@_rerun_if_grown).
"""

from __future__ import annotations

import functools
import logging
import re
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar, cast

import lmdb

from mosafs import metrics
from mosafs._proto import common_pb2, manager_pb2, metadata_pb2
from mosafs.errors import (
    AccessDenied,
    AlreadyExists,
    ConfigError,
    DirectoryNotEmpty,
    FailedPrecondition,
    InvalidArgument,
    IsADirectory,
    NameTooLong,
    NoAttribute,
    NoSpace,
    NotADirectory,
    NotFound,
    NotPermitted,
    NotSupported,
    ResourceExhausted,
    ValueTooLarge,
)
from mosafs.ids import ID_LEN
from mosafs.manager import pools
from mosafs.manager.mapsize import MapGrown, MapSizer, initial_size

log = logging.getLogger(__name__)

SCHEMA_VERSION = b"1"
ROOT_INODE = 1
DEFAULT_MAP_SIZE = 16 << 30
MAX_DBS = 16
DB_NAMES = (b"meta", b"inodes", b"dirents", b"versions", b"blockmaps", b"xattrs", b"chunks",
            b"benefactors", b"pools", b"folders", b"fragments")
MAX_NAME_BYTES = 255
MAX_CHUNK_BYTES = pools.MAX_CHUNK_BYTES
READDIR_DEFAULT = 1000
READDIR_MAX = 10_000
MAX_SYMLINK_BYTES = 4095  # PATH_MAX - 1: the longest target Linux accepts
MAX_LINKS = (1 << 32) - 1  # InodeRecord.nlink is a uint32
VERSIONS_DIR = ".versions"  # the mount's read-only view of older versions (docs/lifecycle.md)
XATTR_PREFIX = "user."  # the only namespace stored (the client admits user.* only)
XATTR_RESERVED_PREFIX = "user.mosafs."  # the client's read-only attributes: never stored
XATTR_NAME_MAX = 255  # Linux's limits
XATTR_SIZE_MAX = 64 * 1024
XATTR_LIST_MAX = 64 * 1024  # the names of one inode, each with its NUL, as listxattr(2)
XATTR_TOTAL_MAX = 1 << 20  # names + values of one inode
MAX_SESSION_BYTES = 64  # a client's write session id (CommitVersionRequest.session)
_MAX_U64 = (1 << 64) - 1
_MAX_U32 = (1 << 32) - 1
_MIN_I64, _MAX_I64 = -(1 << 63), (1 << 63) - 1
# Attribute values (docs/metadata.md, "Attribute values"): what the store accepts is what
# every layer between it and a program's stat() can represent.
UNCHANGED_ID = _MAX_U32  # (uid_t)-1: "leave it" in chown(2) and SetAttr; never an owner
MAX_OWNER_ID = _MAX_U32 - 1  # the largest uid/gid an inode may have (capability.MAX_ID)
_NS = 1_000_000_000
TIME_SEC_MAX = _MAX_I64 // _NS  # 9223372036 s: Linux's KTIME_SEC_MAX
MAX_TIME_NS = TIME_SEC_MAX * _NS  # 2262-04-11T23:47:16Z
MIN_TIME_NS = -MAX_TIME_NS  # 1677-09-21T00:12:44Z; -2**63 is outside
MAX_FILE_SIZE = 4 << 40  # 4 TiB, the client's limit (mosafs.client.files.writer)
MAX_RDEV = _MAX_U32  # the device numbers FUSE carries (majors < 4096, minors < 2**20)
ROOT_OWNER_BITS = 0o700  # the root directory's owner always keeps rwx

DIRECTORY = manager_pb2.FILE_KIND_DIRECTORY
REGULAR = manager_pb2.FILE_KIND_REGULAR
SYMLINK = manager_pb2.FILE_KIND_SYMLINK
FIFO = manager_pb2.FILE_KIND_FIFO
SOCKET = manager_pb2.FILE_KIND_SOCKET
BLOCK_DEVICE = manager_pb2.FILE_KIND_BLOCK_DEVICE
CHAR_DEVICE = manager_pb2.FILE_KIND_CHAR_DEVICE
DEVICES = (BLOCK_DEVICE, CHAR_DEVICE)
# What Mknod makes: inodes with nothing but metadata (the kernel does the rest).
MKNOD_KINDS = (FIFO, SOCKET, *DEVICES)
# The S_IF* file-type bits of each kind, as FUSE passes them in a mode.
_TYPE_BITS: dict[int, int] = {
    DIRECTORY: 0o040000, REGULAR: 0o100000, SYMLINK: 0o120000, FIFO: 0o010000,
    SOCKET: 0o140000, BLOCK_DEVICE: 0o060000, CHAR_DEVICE: 0o020000,
}
_KIND_NAMES: dict[int, str] = {
    DIRECTORY: "a directory", REGULAR: "a regular file", SYMLINK: "a symbolic link",
    FIFO: "a FIFO", SOCKET: "a socket", BLOCK_DEVICE: "a block device",
    CHAR_DEVICE: "a character device",
}
KINDS = frozenset(_KIND_NAMES)  # every kind an inode may have

_U64 = struct.Struct(">Q")
_VKEY = struct.Struct(">QQ")
BLOCKMAP_ENTRY = struct.Struct("<32sQ")
_BENEFACTOR_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")

ChunkEntry = tuple[bytes, int]
"""One block-map entry: (32-byte chunk id, length in bytes)."""


# --- encodings and validation -------------------------------------------------------------

def pack_blockmap(chunks: Iterable[ChunkEntry]) -> bytes:
    pack = BLOCKMAP_ENTRY.pack
    return b"".join([pack(cid, length) for cid, length in chunks])


def unpack_blockmap(data: bytes | memoryview) -> list[ChunkEntry]:
    if len(data) % BLOCKMAP_ENTRY.size:
        # Only a damaged database gets here: a bug or a disk fault, worth a traceback.
        raise RuntimeError(f"corrupt block-map of {len(data)} bytes")
    return list(BLOCKMAP_ENTRY.iter_unpack(data))


def check_name(name: str) -> bytes:
    """A directory entry name as stored (UTF-8 bytes)."""
    if not name:
        raise InvalidArgument("a name must not be empty")
    if name in (".", ".."):
        raise InvalidArgument(f"{name!r} is not a valid name")
    if "/" in name or "\0" in name:
        raise InvalidArgument(f"name {name[:80]!r} contains '/' or NUL")
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"name {name[:80]!r} is not valid Unicode") from None
    if len(raw) > MAX_NAME_BYTES:
        raise NameTooLong(f"name {name[:40]!r}... is {len(raw)} bytes long; "
                          f"the limit is {MAX_NAME_BYTES}")
    return raw


def check_new_name(name: str) -> bytes:
    """A name for a new entry: a valid name that is not reserved for the mount's views."""
    raw = check_name(name)
    if name == VERSIONS_DIR:
        raise NotPermitted(f"{VERSIONS_DIR!r} is reserved: every directory of a mount shows "
                           f"the versions of its files there")
    return raw


def check_benefactor_id(bid: str) -> str:
    if not _BENEFACTOR_ID.fullmatch(bid):
        raise InvalidArgument(
            f"bad benefactor id {bid[:80]!r}: use 1..128 characters of A-Z a-z 0-9 . _ -")
    return bid


def check_chunks(chunks: Iterable[ChunkEntry]) -> list[ChunkEntry]:
    """Validate a block-map from a peer: 32-byte ids, lengths 1..64 MiB."""
    out = []
    for i, (cid, length) in enumerate(chunks):
        if len(cid) != ID_LEN:
            raise InvalidArgument(f"chunk {i}: id must be {ID_LEN} bytes, "
                                  f"got {len(cid)} (0x{bytes(cid[:48]).hex()})")
        if not 1 <= length <= MAX_CHUNK_BYTES:
            raise InvalidArgument(f"chunk {i} ({bytes(cid).hex()}): length {length} "
                                  f"is outside 1..{MAX_CHUNK_BYTES}")
        out.append((bytes(cid), int(length)))
    return out


def check_ids(ids: Iterable[bytes]) -> list[bytes]:
    out = []
    for i, cid in enumerate(ids):
        if len(cid) != ID_LEN:
            raise InvalidArgument(f"id {i}: chunk id must be {ID_LEN} bytes, "
                                  f"got {len(cid)} (0x{bytes(cid[:48]).hex()})")
        out.append(bytes(cid))
    return out


def _merge_placements(
    placements: Iterable[tuple[bytes, Sequence[str]]],
) -> dict[bytes, list[str]]:
    """id -> benefactor ids, merging repeated ids; validates ids and benefactor ids."""
    merged: dict[bytes, list[str]] = {}
    for i, (cid, bids) in enumerate(placements):
        if len(cid) != ID_LEN:
            raise InvalidArgument(f"placement {i}: chunk id must be {ID_LEN} bytes, "
                                  f"got {len(cid)} (0x{bytes(cid[:48]).hex()})")
        if not bids:
            raise InvalidArgument(f"placement {i} ({bytes(cid).hex()}) names no benefactor")
        locations = merged.setdefault(bytes(cid), [])
        for bid in bids:
            check_benefactor_id(bid)
            if bid not in locations:
                locations.append(bid)
    return merged


@dataclass(frozen=True)
class Fragments:
    """Where an erasure-coded chunk's K+M fragments are: fragment i is the blob ids[i]
    (its BLAKE3) on benefactor holders[i] ("": not stored, or not known)."""

    k: int
    m: int
    ids: tuple[bytes, ...]
    holders: tuple[str, ...]

    @classmethod
    def of(cls, rec: metadata_pb2.ChunkRecord) -> Fragments | None:
        if not rec.ec_k:
            return None
        return cls(rec.ec_k, rec.ec_m, tuple(bytes(f) for f in rec.fragment_ids),
                   tuple(rec.fragment_holders))


@dataclass(frozen=True)
class Layout:
    """How a chunk record stores its chunk: K+M and the fragment ids (k == 0: whole
    copies). A conversion swaps a record only if it still has the layout it read."""

    k: int = 0
    m: int = 0
    ids: tuple[bytes, ...] = ()

    @classmethod
    def of(cls, rec: metadata_pb2.ChunkRecord) -> Layout:
        if not rec.ec_k:
            return cls()
        return cls(rec.ec_k, rec.ec_m, tuple(bytes(f) for f in rec.fragment_ids))


@dataclass(frozen=True)
class FragmentMove:
    """Fragment `fid`, slot `index` of a chunk, now held by `holder` in place of `old`."""

    index: int
    fid: bytes
    old: str
    holder: str


def check_fragments(cid: bytes, frag: Fragments) -> Fragments:
    """Validate an erasure-coded placement from a peer (InvalidArgument, naming CID)."""
    what = f"erasure-coded chunk {bytes(cid).hex()}"
    if not (1 <= frag.k <= pools.MAX_EC_K and 1 <= frag.m <= pools.MAX_EC_M):
        raise InvalidArgument(f"{what}: ec:{frag.k}+{frag.m} is outside 1..{pools.MAX_EC_K} "
                              f"+ 1..{pools.MAX_EC_M}")
    width = frag.k + frag.m
    if len(frag.ids) != width or len(frag.holders) != width:
        raise InvalidArgument(f"{what}: ec:{frag.k}+{frag.m} needs {width} fragment ids and "
                              f"holders, got {len(frag.ids)} and {len(frag.holders)}")
    for i, fid in enumerate(frag.ids):
        if len(fid) != ID_LEN:
            raise InvalidArgument(f"{what}: fragment {i} id must be {ID_LEN} bytes, got "
                                  f"{len(fid)}")
    named = [h for h in frag.holders if h]
    for bid in named:
        check_benefactor_id(bid)
    if len(set(named)) != len(named):
        raise InvalidArgument(f"{what}: a benefactor holds two of its fragments (each must "
                              f"be on a distinct benefactor)")
    if len(named) < frag.k:
        raise InvalidArgument(f"{what}: {len(named)} fragments stored, at least {frag.k} "
                              f"are needed to read it")
    return Fragments(frag.k, frag.m, tuple(bytes(f) for f in frag.ids), tuple(frag.holders))


def _has_copies(rec: metadata_pb2.ChunkRecord) -> bool:
    """Whether REC names any stored bytes: a whole copy or a fragment."""
    return bool(rec.benefactor_ids) or any(rec.fragment_holders)


def wants_whole_copy(rec: metadata_pb2.ChunkRecord, bid: str) -> bool:
    """Whether a whole copy of referenced chunk REC on benefactor BID is needed: always
    for a chunk kept as copies (a copy the record does not name is counted again:
    reconciliation); for an erasure-coded one only where the record names it, or where
    its fragments are too few to read it (a conversion to fragments leaves the old copies
    to garbage collection, docs/erasure_pools.md)."""
    if not rec.ec_k or bid in rec.benefactor_ids:
        return True
    return sum(bool(h) for h in rec.fragment_holders) < rec.ec_k


def fragment_needed_on(blob: bytes, bid: str, owner: metadata_pb2.ChunkRecord) -> bool:
    """Whether fragment blob BLOB on BID is needed by referenced chunk record OWNER: a
    slot names BID for it, or a slot for it is empty and BID holds no other fragment of
    the chunk (reconciliation records it there). A fragment whose slot another benefactor
    took meanwhile (rebuilt or moved while BID was away) is not."""
    if owner.refcount == 0:
        return False
    slots = list(zip(owner.fragment_ids, owner.fragment_holders, strict=True))
    if any(f == blob and h == bid for f, h in slots):
        return True
    return bid not in owner.fragment_holders and any(f == blob and not h for f, h in slots)


def blob_needed_on(blob: bytes, bid: str, rec: metadata_pb2.ChunkRecord | None,
                   owners: Iterable[metadata_pb2.ChunkRecord]) -> bool:
    """Whether blob BLOB stored on benefactor BID must stay: a needed whole copy of its own
    chunk record REC, or a needed fragment of one of OWNERS (the records whose fragments
    include it). Garbage collection releases the rest (after its grace period)."""
    if rec is not None and rec.refcount > 0 and wants_whole_copy(rec, bid):
        return True
    return any(fragment_needed_on(blob, bid, owner) for owner in owners)


def _permissions(mode: int, kind: int) -> int:
    """Permission bits of MODE (0o7777: rwx for owner, group and others, setuid, setgid,
    sticky); the file-type bits of KIND are tolerated (FUSE passes them), any other bit is
    InvalidArgument. What is stored is MODE & 0o7777: the kind never changes."""
    if not 0 <= mode <= _MAX_U32 or mode & ~0o7777 not in (0, _TYPE_BITS.get(kind, 0)):
        raise InvalidArgument(f"mode {mode:#o} has bits outside the permission bits 0o7777")
    return mode & 0o7777


def _check_u64(value: int, what: str) -> int:
    if not 0 <= value <= _MAX_U64:
        raise InvalidArgument(f"{what} {value} is not an unsigned 64-bit integer")
    return value


def _check_id(value: int, what: str) -> int:
    """An owner (uid or gid) an inode may be given: 0..MAX_OWNER_ID. 2**32-1 is (uid_t)-1,
    which chown(2) reads as "unchanged" and the kernel as no user at all (INVALID_UID): an
    inode owned by it could not be stat'ed, chmod'ed (EOVERFLOW) or chown'ed (EPERM) by
    anyone, root included."""
    if value == UNCHANGED_ID:
        raise InvalidArgument(f"{what} {value} is (uid_t)-1, which means \"unchanged\" in "
                              f"chown(2): it cannot own anything")
    if not 0 <= value <= MAX_OWNER_ID:
        raise InvalidArgument(f"{what} {value} is outside 0..{MAX_OWNER_ID}")
    return value


def _merge_fragments(tx: _Tx, cid: bytes, rec: metadata_pb2.ChunkRecord,
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


def _check_owner(uid: int, gid: int) -> None:
    """The owner of a new inode (Create, Mkdir, Mknod, Symlink): uid and gid in
    0..MAX_OWNER_ID; 2**32-1 ("unchanged") is refused, there being nothing to keep."""
    _check_id(uid, "uid")
    _check_id(gid, "gid")


def _owner_change(value: int | None, what: str) -> int | None:
    """The uid or gid a SetAttr sets: None for "unchanged" (absent, or 2**32-1 as in
    chown(2)), else a value _check_id accepts."""
    if value is None or value == UNCHANGED_ID:
        return None
    return _check_id(value, what)


def _check_time(value: int, what: str) -> int:
    """A time in ns since the epoch: MIN_TIME_NS..MAX_TIME_NS, +-9223372036 whole seconds
    (1677-09-21T00:12:44Z .. 2262-04-11T23:47:16Z). Every such time is a signed 64-bit
    count of nanoseconds whose (seconds, nanoseconds) split joins again without overflow
    (the kernel's timespec64/ktime conversions, C's tv_sec * 1e9 + tv_nsec, Python's
    os.stat st_*time_ns), and whose negation fits too; INT64_MIN (-2**63), the sentinel
    of so many programs, is outside."""
    if not MIN_TIME_NS <= value <= MAX_TIME_NS:
        raise InvalidArgument(f"{what} {value} is outside {MIN_TIME_NS}..{MAX_TIME_NS} ns "
                              f"(1677-09-21 .. 2262-04-11)")
    return value


def check_certificate(bid: str, rec: metadata_pb2.BenefactorRecord | None,
                      certificate: str) -> None:
    """AccessDenied when benefactor BID was registered by another certificate than
    CERTIFICATE ("" on either side: a plaintext cluster, or a record from before)."""
    if rec is not None and rec.certificate and certificate and rec.certificate != certificate:
        metrics.REFUSALS.labels("capability").inc()
        logging.getLogger("mosafs.audit").info(
            "refused to let %s speak for benefactor %s (registered by %s)", certificate, bid,
            rec.certificate)
        raise AccessDenied(f"benefactor {bid} belongs to certificate {rec.certificate!r}; "
                           f"{certificate!r} may not speak for it")


def kind_name(kind: int) -> str:
    return _KIND_NAMES.get(kind, f"of unknown kind {kind}")


def _check_mknod_kind(name: str, kind: int) -> None:
    """NotPermitted for a kind Mknod does not make, with the call that makes it."""
    if kind in MKNOD_KINDS:
        return
    hints: dict[int, str] = {
        REGULAR: "regular files are made with Create",
        DIRECTORY: "directories are made with Mkdir",
        SYMLINK: "symbolic links are made with Symlink"}
    what = hints.get(kind, f"kind {kind} is none of them")
    raise NotPermitted(f"mknod {name[:80]!r}: only FIFOs, sockets and device nodes can be "
                       f"made with mknod; {what}")


def check_symlink_target(target: bytes) -> bytes:
    """A symlink target as stored: 1..4095 bytes, any but NUL (symlink(2)'s rules)."""
    target = bytes(target)
    if not target:
        raise InvalidArgument("a symbolic link's target must not be empty")
    if b"\0" in target:
        raise InvalidArgument(f"symbolic link target {target[:80]!r} contains NUL")
    if len(target) > MAX_SYMLINK_BYTES:
        raise NameTooLong(f"symbolic link target of {len(target)} bytes; the limit is "
                          f"{MAX_SYMLINK_BYTES}")
    return target


def check_xattr_name(name: str, *, writing: bool) -> bytes:
    """An extended attribute name as stored (UTF-8 bytes). Only `user.*` is stored;
    `user.mosafs.*` belongs to the client's read-only attributes, so WRITING one (set,
    remove) is NotPermitted, and reading one here finds nothing."""
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"attribute name {name[:80]!r} is not valid Unicode") from None
    if not raw:
        raise InvalidArgument("an attribute name must not be empty")
    if b"\0" in raw:
        raise InvalidArgument(f"attribute name {name[:80]!r} contains NUL")
    if len(raw) > XATTR_NAME_MAX:
        raise NameTooLong(f"attribute name {name[:40]!r}... is {len(raw)} bytes long; "
                          f"the limit is {XATTR_NAME_MAX}")
    if not name.startswith(XATTR_PREFIX):
        raise NotSupported(f"attribute {name[:80]!r}: only the {XATTR_PREFIX!r} namespace "
                           f"is supported")
    if name == XATTR_PREFIX:
        raise InvalidArgument(f"attribute name {name!r} has nothing after the namespace")
    if writing and name.startswith(XATTR_RESERVED_PREFIX):
        raise NotPermitted(f"attribute {name[:80]!r} is read-only: "
                           f"{XATTR_RESERVED_PREFIX}* attributes are kept by mosafs")
    return raw


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


def _location(cid: bytes, rec: metadata_pb2.ChunkRecord,
              named: dict[str, None]) -> manager_pb2.ChunkLocation:
    """Where CID's copies (and fragments) are, as readers get it; the benefactors it names
    are added to NAMED."""
    out = manager_pb2.ChunkLocation(id=cid, benefactor_ids=rec.benefactor_ids,
                                    length=rec.length)
    named.update(dict.fromkeys(rec.benefactor_ids))
    if rec.ec_k:
        out.ec_k, out.ec_m = rec.ec_k, rec.ec_m
        out.fragment_ids.extend(rec.fragment_ids)
        out.fragment_holders.extend(rec.fragment_holders)
        named.update(dict.fromkeys(h for h in rec.fragment_holders if h))
    return out


def _attr(inode: int, rec: metadata_pb2.InodeRecord) -> manager_pb2.Attr:
    return manager_pb2.Attr(
        inode=inode, kind=rec.kind, mode=rec.mode, nlink=rec.nlink, uid=rec.uid, gid=rec.gid,
        size=rec.size, atime_ns=rec.atime_ns, mtime_ns=rec.mtime_ns, ctime_ns=rec.ctime_ns,
        version=rec.newest_version, rdev=rec.rdev,
    )


@dataclass(frozen=True)
class WriteBase:
    """What a new write of a file dedupes against: its newest committed version."""

    inode: int
    version: int  # 0: none
    size: int
    chunks: list[ChunkEntry] = field(default_factory=list)


@dataclass(frozen=True)
class SessionCommit:
    """How a commit stands in its client's write session (docs/lifecycle.md, Versions).

    PROVISIONAL: committed by fsync, or by a close while the file stays open for writing:
    the session's next commit may replace it. REPLACES_VERSION: this session's provisional
    version that the commit replaces if it is still the file's newest. SESSION: the
    client's random id of its write session, which both need."""

    provisional: bool = False
    replaces_version: int = 0
    session: bytes = b""

    def check(self) -> None:
        _check_u64(self.replaces_version, "replaces_version")
        if len(self.session) > MAX_SESSION_BYTES:
            raise InvalidArgument(f"a write session id has at most {MAX_SESSION_BYTES} "
                                  f"bytes, got {len(self.session)}")
        if (self.provisional or self.replaces_version) and not self.session:
            raise InvalidArgument("a provisional commit, or one that replaces a version, "
                                  "must name its write session")


FINAL_COMMIT = SessionCommit()  # final, replaces nothing: every commit before sessions


@dataclass(frozen=True)
class _Dbs:
    meta: lmdb._Database
    inodes: lmdb._Database
    dirents: lmdb._Database
    versions: lmdb._Database
    blockmaps: lmdb._Database
    xattrs: lmdb._Database
    chunks: lmdb._Database
    benefactors: lmdb._Database
    pools: lmdb._Database
    folders: lmdb._Database
    fragments: lmdb._Database


# --- one transaction ----------------------------------------------------------------------

class _Tx:
    """Typed access to the sub-databases inside one LMDB transaction.

    Decoded inodes are cached per transaction, so an operation that changes one record
    twice (a rename within one directory: the old and the new parent are the same) works on
    one object and writes both changes.
    """

    def __init__(self, txn: lmdb.Transaction[bytes], dbs: _Dbs) -> None:
        self.txn = txn
        self.db = dbs
        self._inodes: dict[int, metadata_pb2.InodeRecord] = {}

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
        return None if raw is None else metadata_pb2.ChunkRecord.FromString(raw)

    def put_chunk(self, cid: bytes, rec: metadata_pb2.ChunkRecord) -> None:
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
        """Delete CID's record and its entries in the fragment index."""
        for fid in set(rec.fragment_ids):
            self.txn.delete(bytes(fid) + cid, db=self.db.fragments)
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
        self.put_chunk(cid, rec)

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


_F = TypeVar("_F", bound=Callable[..., Any])


def _rerun_if_grown(method: _F) -> _F:
    """Run METHOD again when its write transaction found the map full and the map grew
    (MapGrown): the transaction was aborted whole, so the second run is the one that
    counts. One-shot iterators among the arguments are read into lists first, so that it
    sees the same input. Growth is bounded (ceiling, disk), so this ends."""
    @functools.wraps(method)
    def run(self: MetadataStore, *args: Any, **kwargs: Any) -> Any:
        args = tuple(list(a) if isinstance(a, Iterator) else a for a in args)
        kwargs = {k: list(v) if isinstance(v, Iterator) else v for k, v in kwargs.items()}
        while True:
            try:
                return method(self, *args, **kwargs)
            except MapGrown:
                continue
    return cast(_F, run)


def _touch(rec: metadata_pb2.InodeRecord, now: int) -> None:
    """A directory whose entries changed: mtime and ctime."""
    rec.mtime_ns = now
    rec.ctime_ns = now


# --- the store ----------------------------------------------------------------------------

class MetadataStore:
    """All metadata operations, each in its own LMDB transaction (one write transaction per
    mutating operation). Thread-safe: LMDB serialises writers and gives every reader a
    snapshot; one store is shared by all gRPC worker threads."""

    def __init__(self, path: str | Path, *, map_size: int = DEFAULT_MAP_SIZE) -> None:
        """MAP_SIZE: the ceiling the map may grow to (mosafs.manager.mapsize)."""
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._env = lmdb.open(str(self.path), subdir=True, map_size=initial_size(map_size),
                              max_dbs=MAX_DBS, sync=True, metasync=True)
        # Reader slots of processes that died (a manager killed with SIGKILL) are freed here.
        self._env.reader_check()
        env = self._env
        self._db = _Dbs(*(env.open_db(name) for name in DB_NAMES))
        self._map = MapSizer(env, [getattr(self._db, f.name) for f in fields(_Dbs)],
                             self.path, map_size)
        self._writes = 0
        self._count_lock = threading.Lock()
        self._initialise()

    def close(self) -> None:
        self._env.close()

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def map_size(self) -> int:
        """Bytes the LMDB map has now (it grows up to the map_size given at open)."""
        return self._map.map_size

    @contextmanager
    def _read(self) -> Iterator[_Tx]:
        with self._map.gate.shared(), self._env.begin() as txn:
            yield _Tx(txn, self._db)

    @property
    def write_transactions(self) -> int:
        """Write transactions committed since this store was opened."""
        with self._count_lock:
            return self._writes

    @contextmanager
    def _write(self, *, grows: bool = False) -> Iterator[_Tx]:
        """One write transaction. GROWS: it adds data (a new name, version, attribute), so
        it is refused near the ceiling, keeping the reserve for the writes that free
        space. A full map raises MapGrown once the map grew (the caller runs again:
        @_rerun_if_grown), else NoSpace."""
        self._map.prepare(grows=grows)
        seen = self._map.map_size
        try:
            with self._map.gate.shared(), self._env.begin(write=True) as txn:
                yield _Tx(txn, self._db)
            with self._count_lock:
                self._writes += 1
        except lmdb.MapFullError:
            raise self._map.full(seen, grows=grows) from None

    @contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[_Tx]:
        """One transaction over the whole store, for tools that check or repair it as a
        whole (mosafs.manager.fsck); everything else uses the operations below."""
        with self._write() if write else self._read() as tx:
            yield tx

    @_rerun_if_grown
    def _initialise(self) -> None:
        """Schema marker, inode counter, root directory and default pool on first open."""
        now = time.time_ns()
        with self._write() as tx:
            schema = tx.txn.get(b"schema", db=self._db.meta)
            if schema is not None and schema != SCHEMA_VERSION:
                raise ConfigError(f"{self.path} holds metadata schema {schema.decode()!r}; "
                                  f"this manager reads schema {SCHEMA_VERSION.decode()}")
            if schema is None:
                tx.txn.put(b"schema", SCHEMA_VERSION, db=self._db.meta)
                tx.txn.put(b"next_inode", _U64.pack(ROOT_INODE + 1), db=self._db.meta)
                tx.put_inode(ROOT_INODE, metadata_pb2.InodeRecord(
                    kind=DIRECTORY, mode=0o755, nlink=2, atime_ns=now, mtime_ns=now,
                    ctime_ns=now, parent=ROOT_INODE))
            if tx.pool(pools.DEFAULT_POOL) is None:
                tx.put_pool(pools.default_settings())

    # --- namespace ------------------------------------------------------------------------

    def lookup(self, parent: int, name: str) -> manager_pb2.Attr:
        raw = check_name(name)
        with self._read() as tx:
            tx.directory(parent)
            ino = tx.child(parent, raw)
            if ino is None:
                raise NotFound(f"no {name!r} in directory {parent}")
            return _attr(ino, tx.inode(ino))

    def getattr(self, inode: int) -> manager_pb2.Attr:
        with self._read() as tx:
            return _attr(inode, tx.inode(inode))

    @_rerun_if_grown
    def setattr(
        self, inode: int, *, mode: int | None = None, uid: int | None = None,
        gid: int | None = None, atime_ns: int | None = None, mtime_ns: int | None = None,
        ctime_ns: int | None = None,
    ) -> manager_pb2.Attr:
        """Change the given attributes of any kind of inode (None: unchanged). Whoever
        asks, no value can leave an inode that stat, chmod or chown cannot handle
        (docs/metadata.md, "Attribute values"):

        - MODE: permission bits only (0o7777; the inode's own file-type bits are
          tolerated, as FUSE passes them, others are InvalidArgument): the kind never
          changes. A symbolic link keeps 0o777 (NotSupported otherwise, as Linux's
          fchmodat(AT_SYMLINK_NOFOLLOW)). The root directory keeps its owner's rwx
          (ROOT_OWNER_BITS; InvalidArgument otherwise), so it is never locked.
        - UID, GID: 0..MAX_OWNER_ID; 2**32-1 means unchanged, as -1 in chown(2).
        - ATIME_NS, MTIME_NS: stored as given, within MIN_TIME_NS..MAX_TIME_NS.
        - CTIME_NS: the manager's clock at the change when absent (the mount never sends
          one); a given one (a tool restoring metadata) is stored as given, within the same
          range.
        Every value is checked before anything is written: a refused request changes
        nothing."""
        uid = _owner_change(uid, "uid")
        gid = _owner_change(gid, "gid")
        if mode is not None and not 0 <= mode <= _MAX_U32:
            raise InvalidArgument(f"mode {mode:#o} has bits outside the permission bits "
                                  f"0o7777")
        for what, value in (("atime_ns", atime_ns), ("mtime_ns", mtime_ns),
                            ("ctime_ns", ctime_ns)):
            if value is not None:
                _check_time(value, what)
        with self._write() as tx:
            rec = tx.inode(inode)
            if mode is not None:
                rec.mode = self._new_mode(inode, rec, mode)
            for name, value in (("uid", uid), ("gid", gid), ("atime_ns", atime_ns),
                                ("mtime_ns", mtime_ns)):
                if value is not None:
                    setattr(rec, name, value)
            rec.ctime_ns = time.time_ns() if ctime_ns is None else ctime_ns
            tx.put_inode(inode, rec)
            return _attr(inode, rec)

    @staticmethod
    def _new_mode(inode: int, rec: metadata_pb2.InodeRecord, mode: int) -> int:
        """The permission bits a SetAttr of MODE gives INODE (see setattr)."""
        perm = _permissions(mode, rec.kind)
        if rec.kind == SYMLINK and perm != 0o777:
            raise NotSupported(f"inode {inode} is a symbolic link: its mode is always 0777 "
                               f"(mode {perm:#o} asked)")
        if inode == ROOT_INODE and perm & ROOT_OWNER_BITS != ROOT_OWNER_BITS:
            raise InvalidArgument(f"mode {perm:#o} for the root directory: its owner keeps "
                                  f"read, write and search (0o700) so that the file system "
                                  f"stays usable")
        return perm

    def readdir(
        self, inode: int, start_after: str = "", limit: int = 0,
    ) -> tuple[list[tuple[str, manager_pb2.Attr]], bool]:
        """One page of a directory, in bytewise name order: (entries, more)."""
        try:
            after = start_after.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument("start_after is not valid Unicode") from None
        if len(after) > MAX_NAME_BYTES:
            raise InvalidArgument(f"start_after is {len(after)} bytes; names have at most "
                                  f"{MAX_NAME_BYTES}")
        limit = min(limit or READDIR_DEFAULT, READDIR_MAX)
        out: list[tuple[str, manager_pb2.Attr]] = []
        with self._read() as tx:
            tx.directory(inode)
            for name, child in tx.entries(inode, after):
                if len(out) == limit:
                    return out, True
                out.append((name.decode("utf-8"), _attr(child, tx.inode(child))))
        return out, False

    @_rerun_if_grown
    def mkdir(self, parent: int, name: str, mode: int, uid: int = 0,
              gid: int = 0) -> manager_pb2.Attr:
        """A new empty directory NAME in PARENT. MODE: permission bits (0o7777; S_IFDIR
        tolerated); UID, GID: its owner, 0..MAX_OWNER_ID (2**32-1 is refused: it means
        "unchanged" and owns nothing). Times: the manager's clock."""
        raw = check_new_name(name)
        perm = _permissions(mode, DIRECTORY)
        _check_owner(uid, gid)
        now = time.time_ns()
        with self._write(grows=True) as tx:
            pdir = tx.directory(parent)
            if tx.child(parent, raw) is not None:
                raise AlreadyExists(f"{name!r} exists in directory {parent}")
            ino = tx.allocate_inode()
            rec = metadata_pb2.InodeRecord(
                kind=DIRECTORY, mode=perm, nlink=2, uid=uid, gid=gid, atime_ns=now,
                mtime_ns=now, ctime_ns=now, parent=parent, name=raw)
            tx.put_inode(ino, rec)
            tx.link(parent, raw, ino)
            pdir.nlink += 1
            _touch(pdir, now)
            tx.put_inode(parent, pdir)
            return _attr(ino, rec)

    @_rerun_if_grown
    def create(self, parent: int, name: str, mode: int, uid: int = 0, gid: int = 0, *,
               exclusive: bool = False) -> manager_pb2.Attr:
        """A new empty regular file; an existing one is returned unless EXCLUSIVE (O_EXCL).
        MODE, UID and GID as for mkdir (S_IFREG tolerated in MODE)."""
        raw = check_new_name(name)
        perm = _permissions(mode, REGULAR)
        _check_owner(uid, gid)
        now = time.time_ns()
        with self._write(grows=True) as tx:
            pdir = tx.directory(parent)
            existing = tx.child(parent, raw)
            if existing is not None:
                if exclusive:
                    raise AlreadyExists(f"{name!r} exists in directory {parent}")
                rec = tx.inode(existing)
                if rec.kind == DIRECTORY:
                    raise IsADirectory(f"{name!r} in directory {parent} is a directory")
                return _attr(existing, rec)
            ino = tx.allocate_inode()
            rec = metadata_pb2.InodeRecord(
                kind=REGULAR, mode=perm, nlink=1, uid=uid, gid=gid, atime_ns=now,
                mtime_ns=now, ctime_ns=now, parent=parent, name=raw)
            tx.put_inode(ino, rec)
            tx.link(parent, raw, ino)
            _touch(pdir, now)
            tx.put_inode(parent, pdir)
            return _attr(ino, rec)

    @_rerun_if_grown
    def unlink(self, parent: int, name: str) -> None:
        raw = check_name(name)
        now = time.time_ns()
        with self._write() as tx:
            tx.directory(parent)
            ino = tx.child(parent, raw)
            if ino is None:
                raise NotFound(f"no {name!r} in directory {parent}")
            if tx.inode(ino).kind == DIRECTORY:
                raise IsADirectory(f"{name!r} in directory {parent} is a directory: use rmdir")
            self.remove_name(tx, parent, raw, ino, now)

    @_rerun_if_grown
    def rmdir(self, parent: int, name: str) -> None:
        raw = check_name(name)
        now = time.time_ns()
        with self._write() as tx:
            pdir = tx.directory(parent)
            ino = tx.child(parent, raw)
            if ino is None:
                raise NotFound(f"no {name!r} in directory {parent}")
            if tx.inode(ino).kind != DIRECTORY:
                raise NotADirectory(f"{name!r} in directory {parent} is not a directory")
            if tx.has_entries(ino):
                raise DirectoryNotEmpty(f"directory {name!r} is not empty")
            tx.unlink_entry(parent, raw)
            tx.forget_inode(ino)
            pdir.nlink -= 1
            _touch(pdir, now)
            tx.put_inode(parent, pdir)

    @staticmethod
    def remove_name(tx: _Tx, parent: int, raw: bytes, ino: int, now: int) -> None:
        """Delete entry RAW of directory PARENT, which names non-directory INO (unlink,
        pruning): the entry, a link of INO (the last one: the file), the parent's times."""
        pdir = tx.directory(parent)
        tx.unlink_entry(parent, raw)
        MetadataStore._release_file(tx, ino, now, parent, raw)
        _touch(pdir, now)
        tx.put_inode(parent, pdir)

    @staticmethod
    def _release_file(tx: _Tx, ino: int, now: int, parent: int, name: bytes) -> None:
        """Dirent NAME in PARENT naming non-directory INO is gone: drop a link, and with
        the last one the inode, its versions, block-maps, chunk references and xattrs."""
        rec = tx.inode(ino)
        if rec.nlink > 1:
            rec.nlink -= 1
            rec.ctime_ns = now
            if rec.kind == REGULAR and (rec.parent, rec.name) == (parent, name):
                rec.parent, rec.name = 0, b""  # its folder's name went; others remain
            tx.put_inode(ino, rec)
        else:
            tx.drop_file(ino)

    @_rerun_if_grown
    def rename(self, old_parent: int, old_name: str, new_parent: int, new_name: str, *,
               no_replace: bool = False) -> None:
        old_raw = check_name(old_name)
        new_raw = check_new_name(new_name)
        now = time.time_ns()
        with self._write() as tx:
            src_dir = tx.directory(old_parent)
            dst_dir = tx.directory(new_parent)
            ino = tx.child(old_parent, old_raw)
            if ino is None:
                raise NotFound(f"no {old_name!r} in directory {old_parent}")
            target = tx.child(new_parent, new_raw)
            if target is not None and no_replace:
                raise AlreadyExists(f"{new_name!r} exists in directory {new_parent}")
            if target == ino:
                # The same entry, or two hard links of one file: POSIX says rename does
                # nothing and succeeds (both names stay).
                return
            rec = tx.inode(ino)
            moving_dir = rec.kind == DIRECTORY
            if moving_dir and tx.is_ancestor(ino, new_parent):
                raise InvalidArgument(
                    f"cannot move directory {old_name!r} into itself or its subdirectory")
            if target is not None:
                self._remove_target(tx, target, new_parent, new_raw, moving_dir, dst_dir, now)
            tx.unlink_entry(old_parent, old_raw)
            tx.link(new_parent, new_raw, ino)
            if moving_dir and old_parent != new_parent:
                src_dir.nlink -= 1
                dst_dir.nlink += 1
            if moving_dir or (rec.kind == REGULAR and (rec.parent, rec.name) in (
                    (old_parent, old_raw), (0, b""))):
                rec.parent, rec.name = new_parent, new_raw  # the folder follows its name
            rec.ctime_ns = now
            tx.put_inode(ino, rec)
            _touch(src_dir, now)
            _touch(dst_dir, now)
            tx.put_inode(old_parent, src_dir)
            tx.put_inode(new_parent, dst_dir)

    @staticmethod
    def _remove_target(tx: _Tx, target: int, parent: int, raw: bytes, moving_dir: bool,
                       dst_dir: metadata_pb2.InodeRecord, now: int) -> None:
        """Take the entry a rename replaces out of the way (its dirent is overwritten)."""
        name = raw.decode("utf-8")
        trec = tx.inode(target)
        target_dir = trec.kind == DIRECTORY
        if target_dir and not moving_dir:
            raise IsADirectory(f"cannot replace directory {name!r} with a file")
        if moving_dir and not target_dir:
            raise NotADirectory(f"cannot replace file {name!r} with a directory")
        if target_dir:
            if tx.has_entries(target):
                raise DirectoryNotEmpty(f"directory {name!r} is not empty")
            tx.forget_inode(target)
            dst_dir.nlink -= 1
        else:
            MetadataStore._release_file(tx, target, now, parent, raw)

    def symlink(self, parent: int, name: str, target: bytes, uid: int = 0,
                gid: int = 0) -> manager_pb2.Attr:
        """A symbolic link: mode 0777, size = the target's length in bytes. UID and GID as
        for mkdir."""
        raw = check_new_name(name)
        target = check_symlink_target(target)
        _check_owner(uid, gid)
        now = time.time_ns()
        rec = metadata_pb2.InodeRecord(
            kind=SYMLINK, mode=0o777, nlink=1, uid=uid, gid=gid, atime_ns=now, mtime_ns=now,
            ctime_ns=now, size=len(target), symlink_target=target)
        return self._new_entry(parent, name, raw, rec, now)

    def readlink(self, inode: int) -> bytes:
        with self._read() as tx:
            rec = tx.inode(inode)
            if rec.kind != SYMLINK:
                raise InvalidArgument(f"inode {inode} is {kind_name(rec.kind)}, not a "
                                      f"symbolic link")
            return bytes(rec.symlink_target)

    def mknod(self, parent: int, name: str, kind: manager_pb2.FileKind, mode: int,
              uid: int = 0, gid: int = 0, rdev: int = 0) -> manager_pb2.Attr:
        """A FIFO, a socket or a block or character device node with device number RDEV:
        metadata only (the kernel does the rest), size 0. Anything else is NotPermitted:
        regular files, directories and symlinks have calls of their own. Who may make a
        device node is the kernel's check (CAP_MKNOD) before the request gets here.
        MODE, UID and GID as for mkdir (the kind's S_IF* bits tolerated in MODE); RDEV at
        most MAX_RDEV, the numbers FUSE carries."""
        _check_mknod_kind(name, kind)
        raw = check_new_name(name)
        perm = _permissions(mode, kind)
        _check_owner(uid, gid)
        if _check_u64(rdev, "rdev") > MAX_RDEV:
            raise InvalidArgument(f"mknod {name[:80]!r}: device number {rdev:#x} is not one "
                                  f"FUSE carries (0..{MAX_RDEV:#x}: majors below 4096, "
                                  f"minors below 2**20)")
        if rdev and kind not in DEVICES:
            raise InvalidArgument(f"mknod {name[:80]!r}: {kind_name(kind)} has no device "
                                  f"number (rdev {rdev:#x} given)")
        now = time.time_ns()
        rec = metadata_pb2.InodeRecord(kind=kind, mode=perm, nlink=1, uid=uid, gid=gid,
                                       atime_ns=now, mtime_ns=now, ctime_ns=now, rdev=rdev)
        return self._new_entry(parent, name, raw, rec, now)

    @_rerun_if_grown
    def _new_entry(self, parent: int, name: str, raw: bytes, rec: metadata_pb2.InodeRecord,
                   now: int) -> manager_pb2.Attr:
        """Give a new non-directory REC an inode number and the name RAW in PARENT."""
        with self._write(grows=True) as tx:
            pdir = tx.directory(parent)
            if tx.child(parent, raw) is not None:
                raise AlreadyExists(f"{name!r} exists in directory {parent}")
            ino = tx.allocate_inode()
            tx.put_inode(ino, rec)
            tx.link(parent, raw, ino)
            _touch(pdir, now)
            tx.put_inode(parent, pdir)
            return _attr(ino, rec)

    @_rerun_if_grown
    def link(self, inode: int, new_parent: int, new_name: str) -> manager_pb2.Attr:
        """A hard link: NEW_NAME in NEW_PARENT names INODE too (nlink + 1). Directories
        cannot be linked (NotPermitted, EPERM as link(2))."""
        raw = check_new_name(new_name)
        now = time.time_ns()
        with self._write(grows=True) as tx:
            rec = tx.inode(inode)
            if rec.kind == DIRECTORY:
                raise NotPermitted(f"inode {inode} is a directory: directories cannot have "
                                   f"hard links")
            pdir = tx.directory(new_parent)
            if tx.child(new_parent, raw) is not None:
                raise AlreadyExists(f"{new_name!r} exists in directory {new_parent}")
            if rec.nlink >= MAX_LINKS:
                raise InvalidArgument(f"inode {inode} has {rec.nlink} links, the most "
                                      f"there can be")
            tx.link(new_parent, raw, inode)
            rec.nlink += 1
            rec.ctime_ns = now
            if rec.kind == REGULAR and not rec.parent:
                rec.parent, rec.name = new_parent, raw  # a folder again
            tx.put_inode(inode, rec)
            _touch(pdir, now)
            tx.put_inode(new_parent, pdir)
            return _attr(inode, rec)

    def inode_count(self) -> int:
        with self._read() as tx:
            return int(tx.txn.stat(self._db.inodes)["entries"])

    def nlink_mismatches(self) -> dict[int, tuple[int, int]]:
        """inode -> (nlink stored, nlink the dirents give) wherever they differ: a
        non-directory's nlink is the number of dirents naming it, a directory's is 2 + its
        subdirectories. A dirent naming a missing inode shows as (0, its count); an inode
        (not the root) that no dirent names, as (nlink, 0). Empty when the invariants hold
        (tests; later, fsck)."""
        names: Counter[int] = Counter()
        subdirs: Counter[int] = Counter()
        with self._read() as tx:
            kinds = {}
            for key, raw in tx.txn.cursor(db=self._db.inodes):
                rec = metadata_pb2.InodeRecord.FromString(raw)
                kinds[int(_U64.unpack(key)[0])] = (rec.kind, rec.nlink)
            for key, value in tx.txn.cursor(db=self._db.dirents):
                child = int(_U64.unpack(value)[0])
                names[child] += 1
                if kinds.get(child, (None, 0))[0] == DIRECTORY:
                    subdirs[int(_U64.unpack(key[:8])[0])] += 1
        out = {}
        for ino, (kind, nlink) in kinds.items():
            if kind != DIRECTORY:
                expected = names[ino]
            elif ino != ROOT_INODE and names[ino] == 0:
                expected = 0  # an orphaned directory
            else:
                expected = 2 + subdirs[ino]
            if nlink != expected:
                out[ino] = (nlink, expected)
        for ino, count in names.items():
            if ino not in kinds:
                out[ino] = (0, count)
        return out

    def xattr_orphans(self) -> list[int]:
        """Inodes that have extended attributes but no InodeRecord: empty when the
        invariant holds (tests; later, fsck)."""
        out: list[int] = []
        with self._read() as tx:
            for key in tx.txn.cursor(db=self._db.xattrs).iternext(keys=True, values=False):
                ino = int(_U64.unpack(key[:8])[0])
                if (not out or out[-1] != ino) and tx.find_inode(ino) is None:
                    out.append(ino)
        return out

    # --- extended attributes --------------------------------------------------------------

    @_rerun_if_grown
    def setxattr(self, inode: int, name: str, value: bytes, *, create: bool = False,
                 replace: bool = False) -> None:
        """Set extended attribute NAME of any kind of inode. CREATE (XATTR_CREATE):
        AlreadyExists when it is set; REPLACE (XATTR_REPLACE): NoAttribute when it is not
        (both: one of the two, as on ext4). Limits: value 64 KiB (ValueTooLarge); per inode
        1 MiB of names and values and 64 KiB of listxattr names (NoSpace)."""
        raw = check_xattr_name(name, writing=True)
        value = bytes(value)
        if len(value) > XATTR_SIZE_MAX:
            raise ValueTooLarge(f"attribute {name[:80]!r}: a value of {len(value)} bytes; "
                                f"the limit is {XATTR_SIZE_MAX}")
        now = time.time_ns()
        with self._write(grows=True) as tx:
            rec = tx.inode(inode)
            total = len(raw) + len(value)
            listed = len(raw) + 1
            exists = False
            for other, other_value in tx.xattrs(inode):
                if other == raw:
                    exists = True
                    continue
                total += len(other) + len(other_value)
                listed += len(other) + 1
            if create and exists:
                raise AlreadyExists(f"inode {inode} already has attribute {name[:80]!r}")
            if replace and not exists:
                raise NoAttribute(f"inode {inode} has no attribute {name[:80]!r} to replace")
            if total > XATTR_TOTAL_MAX:
                raise NoSpace(f"inode {inode} would hold {total} bytes of extended "
                              f"attributes; the limit is {XATTR_TOTAL_MAX}")
            if listed > XATTR_LIST_MAX:
                raise NoSpace(f"inode {inode} would have {listed} bytes of attribute names; "
                              f"the limit is {XATTR_LIST_MAX}")
            tx.txn.put(_U64.pack(inode) + raw, value, db=self._db.xattrs)
            rec.ctime_ns = now
            tx.put_inode(inode, rec)

    def getxattr(self, inode: int, name: str) -> bytes:
        raw = check_xattr_name(name, writing=False)
        with self._read() as tx:
            tx.inode(inode)
            value = tx.xattr(inode, raw)
            if value is None:
                raise NoAttribute(f"inode {inode} has no attribute {name[:80]!r}")
            return bytes(value)

    def listxattr(self, inode: int) -> list[str]:
        """Names of INODE's extended attributes, sorted (bytewise)."""
        with self._read() as tx:
            tx.inode(inode)
            return [name.decode("utf-8") for name, _ in tx.xattrs(inode)]

    @_rerun_if_grown
    def removexattr(self, inode: int, name: str) -> None:
        raw = check_xattr_name(name, writing=True)
        now = time.time_ns()
        with self._write() as tx:
            rec = tx.inode(inode)
            if not tx.txn.delete(_U64.pack(inode) + raw, db=self._db.xattrs):
                raise NoAttribute(f"inode {inode} has no attribute {name[:80]!r}")
            rec.ctime_ns = now
            tx.put_inode(inode, rec)

    # --- versions -------------------------------------------------------------------------

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
        with self._write(grows=True) as tx:
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
            if replaced is not None:
                # The version replacing a provisional one stands for the whole session:
                # the base it started from, every byte it sent, every chunk it stored.
                base_inode, base_version = replaced.base_inode, replaced.base_version
                new_bytes = min(new_bytes + replaced.new_bytes, _MAX_U64)
                stored |= _marked(tx.blockmap(inode, session.replaces_version),
                                  replaced.stored_entries)
            base_ids = self._base_ids(tx, base_inode, base_version) if base_version else set()
            vrec = metadata_pb2.VersionRecord(
                size=size, chunks=len(entries), base_inode=base_inode,
                base_version=base_version, new_bytes=new_bytes, commit_time_ns=now,
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

    @staticmethod
    def _replaceable(tx: _Tx, inode: int, rec: metadata_pb2.InodeRecord,
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
    def _add_version(tx: _Tx, inode: int, rec: metadata_pb2.InodeRecord,
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
    def _reference_chunk(tx: _Tx, cid: bytes, length: int, count: int,
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
            for bid in locations or ():
                if bid not in crec.benefactor_ids:
                    crec.benefactor_ids.append(bid)
            if fragments is not None:
                _merge_fragments(tx, cid, crec, fragments)
        tx.put_chunk(cid, crec)

    @staticmethod
    def _base_ids(tx: _Tx, base_inode: int, base_version: int) -> set[bytes]:
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
    def _name_base(tx: _Tx, out: manager_pb2.VersionStats,
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
        with self._write(grows=True) as tx:
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
                tx.put_chunk(cid, crec)
            vrec = metadata_pb2.VersionRecord(
                size=old.size, chunks=old.chunks, shared_chunks=old.chunks,
                base_inode=inode, base_version=version, new_bytes=0, commit_time_ns=now,
                mtime_ns=old.mtime_ns, shared_bytes=old.size)
            return self._add_version(tx, inode, rec, vrec, entries)

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

    # --- chunk index ----------------------------------------------------------------------

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
    def release_unreferenced(self, ids: Iterable[bytes], bid: str) -> tuple[list[bytes], int]:
        """Garbage collection: of IDS, those that are still unreferenced (refcount 0, or not
        in the index) may be deleted from benefactor BID. One transaction re-checks every
        id (a commit may have referenced one since it was chosen), takes BID out of its
        record, and deletes records left with no copy. Returns (the ids BID may delete,
        how many records were deleted)."""
        check_benefactor_id(bid)
        released: list[bytes] = []
        gone = 0
        with self._write() as tx:
            for cid in check_ids(list(ids)):
                # A blob is a chunk, or a fragment of erasure-coded chunks (or both: equal
                # bytes): it goes only if nothing referenced needs it here in either role.
                if tx.blob_needed_on(cid, bid):
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
        FRAGMENTS) a fragment (one snapshot; a full index scan)."""
        out = []
        with self._read() as tx:
            for cid, raw in tx.txn.cursor(db=self._db.chunks):
                rec = metadata_pb2.ChunkRecord.FromString(raw)
                if bid in rec.benefactor_ids or (fragments and bid in rec.fragment_holders):
                    out.append(bytes(cid))
        return out

    def fragments_on(self, bid: str) -> list[bytes]:
        """Fragment blob ids the index says benefactor BID holds (a full index scan)."""
        out: dict[bytes, None] = {}
        with self._read() as tx:
            for _, raw in tx.txn.cursor(db=self._db.chunks):
                rec = metadata_pb2.ChunkRecord.FromString(raw)
                if bid in rec.fragment_holders:
                    for f, h in zip(rec.fragment_ids, rec.fragment_holders, strict=True):
                        if h == bid:
                            out[bytes(f)] = None
        return list(out)

    @_rerun_if_grown
    def add_chunk_locations(self, added: Iterable[tuple[bytes, str]]) -> int:
        """Record new copies (id, benefactor id) in one transaction; ids no longer in the
        index are skipped (their file went meanwhile). Returns how many were recorded."""
        recorded = 0
        with self._write() as tx:
            for cid, bid in added:
                check_benefactor_id(bid)
                rec = tx.chunk(cid)
                if rec is None or bid in rec.benefactor_ids:
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

    # --- benefactor registrations and pools -----------------------------------------------

    @_rerun_if_grown
    def put_benefactor(self, bid: str, rec: metadata_pb2.BenefactorRecord) -> None:
        check_benefactor_id(bid)
        with self._write() as tx:
            tx.put_benefactor(bid, rec)

    @_rerun_if_grown
    def register_benefactor(self, bid: str, address: str, pool: str, capacity_bytes: int,
                            free_bytes: int, chunks: int,
                            certificate: str = "") -> metadata_pb2.BenefactorRecord:
        """Record a (re-)registration. POOL "" keeps the pool it is in (a new benefactor:
        the default pool); a pool named joins it. Draining survives re-registration.
        CERTIFICATE: the registering certificate's name; an id first registered by another
        certificate is refused (AccessDenied), so one benefactor key cannot speak for the
        others."""
        check_benefactor_id(bid)
        with self._write() as tx:
            old = tx.benefactor(bid)
            check_certificate(bid, old, certificate)
            pool = pool or (old.pool if old is not None else pools.DEFAULT_POOL)
            if tx.pool(pool) is None:
                raise InvalidArgument(f"benefactor {bid}: no pool {pool!r} (mosafs pool list)")
            if old is not None and old.pool != pool:
                log.info("benefactor %s moves from pool %s to %s", bid, old.pool, pool)
            rec = metadata_pb2.BenefactorRecord(
                address=address, pool=pool, capacity_bytes=capacity_bytes,
                free_bytes=free_bytes, chunks=chunks, registered_ns=time.time_ns(),
                draining=old is not None and old.draining,
                certificate=certificate or (old.certificate if old is not None else ""))
            tx.put_benefactor(bid, rec)
            return rec

    @_rerun_if_grown
    def update_benefactor(self, bid: str, *, pool: str | None = None,
                          draining: bool | None = None) -> metadata_pb2.BenefactorRecord:
        """Move registered benefactor BID to POOL and/or set its draining flag."""
        check_benefactor_id(bid)
        with self._write() as tx:
            rec = tx.benefactor(bid)
            if rec is None:
                raise NotFound(f"no benefactor {bid!r} (mosafs benefactor list)")
            if pool is not None:
                if tx.pool(pool) is None:
                    raise NotFound(f"no pool {pool!r} (mosafs pool list)")
                rec.pool = pool
            if draining is not None:
                rec.draining = draining
            tx.put_benefactor(bid, rec)
            return rec

    @_rerun_if_grown
    def remove_benefactor(self, bid: str) -> int:
        """Forget benefactor BID: its registration and every location naming it, in one
        transaction (a full index scan). Records left with no copy and no reference are
        deleted; referenced ones stay (lost until a copy turns up). Returns how many
        records named it."""
        check_benefactor_id(bid)
        named = 0
        with self._write() as tx:
            if tx.benefactor(bid) is None:
                raise NotFound(f"no benefactor {bid!r} (mosafs benefactor list)")
            for cid, raw in list(tx.txn.cursor(db=self._db.chunks)):
                rec = metadata_pb2.ChunkRecord.FromString(raw)
                if bid in rec.benefactor_ids or bid in rec.fragment_holders:
                    named += 1
                    tx.drop_benefactor(bytes(cid), rec, bid)
            tx.txn.delete(bid.encode(), db=self._db.benefactors)
        return named

    def benefactor(self, bid: str) -> metadata_pb2.BenefactorRecord | None:
        with self._read() as tx:
            return tx.benefactor(bid)

    def benefactors(self) -> dict[str, metadata_pb2.BenefactorRecord]:
        with self._read() as tx:
            return {key.decode(): metadata_pb2.BenefactorRecord.FromString(raw)
                    for key, raw in tx.txn.cursor(db=self._db.benefactors)}

    def benefactor_addresses(self, bids: Iterable[str]) -> dict[str, str]:
        """id -> registered address, for the ids that are registered."""
        with self._read() as tx:
            out = {}
            for bid in bids:
                rec = tx.benefactor(bid)
                if rec is not None:
                    out[bid] = rec.address
            return out

    def pool(self, name: str) -> common_pb2.PoolSettings:
        with self._read() as tx:
            rec = tx.pool(name)
            if rec is None:
                raise NotFound(f"no pool {name!r}")
            return rec.settings

    def pools(self) -> list[common_pb2.PoolSettings]:
        with self._read() as tx:
            return [metadata_pb2.PoolRecord.FromString(raw).settings
                    for _, raw in tx.txn.cursor(db=self._db.pools)]

    @_rerun_if_grown
    def update_pool(
        self, name: str, *, replication: int | None = None, stripe_width: int | None = None,
        chunker: str | None = None, write_semantics: str | None = None,
        hash_backend: str | None = None, redundancy: str | None = None,
        ec_min_chunk: int | None = None, create: bool = False,
    ) -> common_pb2.PoolSettings:
        """Apply the settings that are not None to pool NAME; returns the result. CREATE:
        a new pool (AlreadyExists if there is one), the rest of its settings the defaults."""
        if create:
            pools.check_name(name)
        with self._write(grows=create) as tx:
            rec = tx.pool(name)
            if create and rec is not None:
                raise AlreadyExists(f"pool {name!r} exists (mosafs pool set changes it)")
            if not create and rec is None:
                raise NotFound(f"no pool {name!r} (mosafs pool list)")
            current = pools.default_settings(name) if rec is None else rec.settings
            settings = pools.with_overrides(
                current, replication=replication, stripe_width=stripe_width,
                chunker=chunker, write_semantics=write_semantics, hash_backend=hash_backend,
                redundancy=redundancy, ec_min_chunk=ec_min_chunk)
            if rec is None or settings != rec.settings:
                tx.put_pool(settings)
            return settings

    def pool_users(self, name: str) -> tuple[list[str], list[int]]:
        """(benefactor ids in pool NAME, folders assigned to it)."""
        with self._read() as tx:
            if tx.pool(name) is None:
                raise NotFound(f"no pool {name!r} (mosafs pool list)")
            bids = [key.decode() for key, raw in tx.txn.cursor(db=self._db.benefactors)
                    if metadata_pb2.BenefactorRecord.FromString(raw).pool == name]
            folders = [ino for ino, f in tx.folders() if f.HasField("pool") and f.pool == name]
            return bids, folders

    @_rerun_if_grown
    def delete_pool(self, name: str) -> None:
        """Delete an unused pool. Chunks stored through it keep their copies; their R
        becomes the default pool's."""
        if name == pools.DEFAULT_POOL:
            raise NotPermitted(f"pool {name!r} cannot be deleted: new files fall back to it")
        with self._write() as tx:
            if tx.pool(name) is None:
                raise NotFound(f"no pool {name!r} (mosafs pool list)")
            bids = [key.decode() for key, raw in tx.txn.cursor(db=self._db.benefactors)
                    if metadata_pb2.BenefactorRecord.FromString(raw).pool == name]
            if bids:
                raise FailedPrecondition(f"pool {name!r} still has benefactors "
                                         f"{', '.join(sorted(bids))}: move or remove them first")
            folders = [tx.path_of(ino) for ino, f in tx.folders()
                       if f.HasField("pool") and f.pool == name]
            if folders:
                raise FailedPrecondition(f"pool {name!r} is assigned to {', '.join(folders)}: "
                                         f"assign those folders another pool first")
            tx.txn.delete(name.encode(), db=self._db.pools)
