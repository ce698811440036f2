"""The metadata store's LMDB schema: the sub-databases, their keys and values, the
invariants every write transaction keeps, and the constants and encodings they use.

Schema version 2 (docs/metadata.md says the same at more length; version 1 lacked the
holdings index, which the first open of a version-1 store builds: "Upgrades" there). The
environment lives in DATA_DIR/metadata.lmdb/ (a directory: data.mdb, lock.mdb, and on a
standby standby.journal, mosafs.manager.metadata.journal), opened
with sync and metasync on, so a write transaction that has committed is on disk when
commit returns. Integers in keys are unsigned 64-bit big-endian ("u64be") so that keys
sort numerically; protobuf records are the messages of protos/mosafs/v1/metadata.proto.

  sub-database  key                          value
  meta          b"schema"                    b"2"
                b"next_inode"                u64be: the next inode number to hand out
                b"token_master"              32 bytes: the secret chunk access token
                                             keys are derived from (manager/tokens.py)
  inodes        u64be inode                  InodeRecord
  dirents       u64be parent + name (utf-8)  u64be child inode
  versions      u64be inode + u64be version  VersionRecord
  blockmaps     u64be inode + u64be version  packed block-map (below)
  xattrs        u64be inode + name (utf-8)   the attribute's value, raw bytes
  chunks        32-byte chunk id             ChunkRecord
  fragments     fragment id + chunk id       b"" (an index: which records name a fragment)
  holdings      benefactor id + NUL + chunk id   b"" (an index: what each benefactor holds)
  benefactors   benefactor id (utf-8)        BenefactorRecord
  pools         pool name (utf-8)            PoolRecord
  folders       u64be directory inode        FolderRecord (pool, series pattern, policy)

The xattrs, folders and fragments sub-databases, InodeRecord.symlink_target and .name,
the erasure-coding fields of ChunkRecord and PoolSettings, and the parent of
non-directories were added to schema 1 without a new schema number: all are additive (a
store written before them has no symlinks, empty xattrs and folders, regular files with
parent 0: files of no known folder, which fall back to the defaults, other non-directories
with parent 0: of no known place for the access checks until renamed or linked, and no
erasure-coded record, so its empty fragments index is exact).

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
    (and .name that name, or empty in stores from before names were kept). A
    non-directory's parent/name is one of its dirents (a regular file's folder; for
    every kind its place for the access checks), or 0/empty. Every non-directory is
    named by nlink >= 1 dirents (hard links); its last name going removes it.
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
  - The holdings sub-database holds exactly one key, benefactor id + NUL + chunk id, for
    each benefactor a ChunkRecord names (a whole copy or a fragment holder): what a dead
    or removed benefactor held is found without reading the whole chunk index.
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
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

import lmdb

from mosafs._proto import manager_pb2
from mosafs.manager import pools

SCHEMA_VERSION = b"2"
SCHEMA_WITHOUT_HOLDINGS = b"1"  # upgraded at open: the holdings index is built
ROOT_INODE = 1
DEFAULT_MAP_SIZE = 16 << 30
MAX_DBS = 16
DB_NAMES = (b"meta", b"inodes", b"dirents", b"versions", b"blockmaps", b"xattrs", b"chunks",
            b"benefactors", b"pools", b"folders", b"fragments", b"holdings")
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

ChunkEntry = tuple[bytes, int]
"""One block-map entry: (32-byte chunk id, length in bytes)."""


def kind_name(kind: int) -> str:
    return _KIND_NAMES.get(kind, f"of unknown kind {kind}")


def pack_blockmap(chunks: Iterable[ChunkEntry]) -> bytes:
    pack = BLOCKMAP_ENTRY.pack
    return b"".join([pack(cid, length) for cid, length in chunks])


def unpack_blockmap(data: bytes | memoryview) -> list[ChunkEntry]:
    if len(data) % BLOCKMAP_ENTRY.size:
        # Only a damaged database gets here: a bug or a disk fault, worth a traceback.
        raise RuntimeError(f"corrupt block-map of {len(data)} bytes")
    return list(BLOCKMAP_ENTRY.iter_unpack(data))


@dataclass(frozen=True)
class _Dbs:
    """The open sub-databases, one field per name of DB_NAMES, in that order."""

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
    holdings: lmdb._Database


def holding_key(bid: str, cid: bytes) -> bytes:
    """The holdings index's key of benefactor BID holding (part of) chunk CID. Benefactor
    ids never hold NUL (checks.check_benefactor_id), so the id's end is unambiguous."""
    return bid.encode() + b"\0" + cid


def holding_prefix(bid: str) -> bytes:
    return bid.encode() + b"\0"
