"""Validation of what peers send the store: names, ids, chunk lists and placements,
permission bits, owners, times, certificates, node kinds, symlink targets, xattr names.
Each check raises the error the caller answers with, or returns the value as stored."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence

from mosafs import metrics
from mosafs._proto import metadata_pb2
from mosafs.errors import AccessDenied, InvalidArgument, NameTooLong, NotPermitted, NotSupported
from mosafs.ids import ID_LEN
from mosafs.manager.metadata.schema import (
    _MAX_U32,
    _MAX_U64,
    _TYPE_BITS,
    DIRECTORY,
    MAX_CHUNK_BYTES,
    MAX_NAME_BYTES,
    MAX_OWNER_ID,
    MAX_SYMLINK_BYTES,
    MAX_TIME_NS,
    MIN_TIME_NS,
    MKNOD_KINDS,
    REGULAR,
    SYMLINK,
    UNCHANGED_ID,
    VERSIONS_DIR,
    XATTR_NAME_MAX,
    XATTR_PREFIX,
    XATTR_RESERVED_PREFIX,
    ChunkEntry,
)


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


_BENEFACTOR_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


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
