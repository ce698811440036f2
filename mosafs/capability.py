"""What a client certificate may do (DESIGN §11, docs/operations.md "Identities and
capabilities"), and who a request acts as.

A capability travels inside the client's certificate, in a non-critical X.509 extension
(CAPABILITY_OID) whose value is this JSON object, signed with the rest of the certificate
by the cluster's CA, so the manager needs no record of its own to know it:

    {"v": 1, "paths": ["/ckpt/jobA", ...], "read_only": false,
     "uids": [1000] | null, "gids": [1000, 1001] | null, "allow_root": false}

- paths: the subtrees the holder may reach (absolute, normalised; "/" is everything). The
  directories above them are traversed, not seen: a Lookup of the next name on the way
  down, GetAttr, and a ReadDir that lists only that name.
- read_only: every request that changes something is refused.
- uids/gids: the uid and groups a request may act as; null: any. uid 0 needs allow_root
  (otherwise a request acting as root is squashed to SQUASH_UID, as NFS's root_squash).

A certificate without the extension (every role but a restricted client) has FULL access:
what `mosafs up` issues for its own mount and what certificates issued before capabilities
existed get. Admin certificates always have full access.

A request says which uid and groups it acts as in gRPC metadata (UID_KEY, GIDS_KEY; the
mount sets them from the FUSE request). Without them (the mount's own calls, admin tools)
it acts as the certificate's own identity: root where root is allowed, else the smallest
uid the capability names with its groups, else SQUASH_UID.
"""

from __future__ import annotations

import contextvars
import json
import posixpath
from dataclasses import dataclass

from mosafs.errors import ConfigError

# 2.25.N is the OID arc for UUIDs (ITU-T X.667): N is a UUID chosen for this extension.
CAPABILITY_OID = "2.25.243017463720183964021846312468734593921"
SQUASH_UID = 65534
SQUASH_GID = 65534
MAX_ID = 2**32 - 2          # 2^32-1 means "unchanged" in chown(2): never an owner
UID_KEY = "mosafs-uid"
GIDS_KEY = "mosafs-gids"
# The mount a request comes from (a random id per mount process, in the request's metadata;
# "" where none is named): the manager does not list a mount's own changes back to it
# (mosafs.manager.changes). Set by the RPC layer for the request being handled.
MOUNT_KEY = "mosafs-mount"
ORIGIN: contextvars.ContextVar[str] = contextvars.ContextVar("mosafs_origin", default="")
MAX_GIDS = 65536            # NGROUPS_MAX on Linux
MAX_PATHS = 64


@dataclass(frozen=True)
class Capability:
    paths: tuple[str, ...] = ("/",)
    read_only: bool = False
    uids: frozenset[int] | None = None
    gids: frozenset[int] | None = None
    allow_root: bool = True

    @property
    def full(self) -> bool:
        return self == FULL

    @property
    def sees_everything(self) -> bool:
        """Whether nothing in the namespace is hidden from it: every subtree, as root (read
        only or not). Only such a holder may be told names from anywhere (the mounts'
        change lists, mosafs.manager.changes)."""
        return (self.paths == ("/",) and self.allow_root and self.uids is None
                and self.gids is None)

    def to_json(self) -> bytes:
        return json.dumps({
            "v": 1, "paths": list(self.paths), "read_only": self.read_only,
            "uids": None if self.uids is None else sorted(self.uids),
            "gids": None if self.gids is None else sorted(self.gids),
            "allow_root": self.allow_root}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Capability:
        try:
            record = json.loads(raw)
            if not isinstance(record, dict) or record.get("v") != 1:
                raise ValueError("not a version 1 capability")
            return make(record["paths"], read_only=record["read_only"],
                        uids=record["uids"], gids=record["gids"],
                        allow_root=record["allow_root"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"the certificate's capability cannot be read: {exc}") from None

    def describe(self) -> str:
        parts = [", ".join(self.paths), "read-only" if self.read_only else "read-write"]
        if self.uids is not None:
            parts.append("uid " + ",".join(map(str, sorted(self.uids))))
        if self.gids is not None:
            parts.append("gids " + ",".join(map(str, sorted(self.gids))))
        parts.append("root allowed" if self.allow_root else "root squashed")
        return "; ".join(parts)


FULL = Capability()


def normal_path(path: str) -> str:
    """An absolute path without ".", ".." or doubled slashes; ConfigError otherwise."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise ConfigError(f"a capability path must be absolute: {path!r}")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ConfigError(f"a capability path may not contain . or ..: {path!r}")
    if any(len(p.encode()) > 255 for p in parts):
        raise ConfigError(f"a name in capability path {path[:80]!r} is longer than 255 bytes")
    return posixpath.join("/", *parts)


def _ids(values: object, what: str) -> frozenset[int] | None:
    if values is None:
        return None
    if not isinstance(values, list | tuple | set | frozenset) or not values:
        raise ConfigError(f"{what} must be a non-empty list of numbers")
    out = set()
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
            raise ConfigError(f"{what}: {value!r} is not a number in 0..{MAX_ID}")
        out.add(value)
    return frozenset(out)


def make(paths: list[str] | tuple[str, ...] | None = None, *, read_only: bool = False,
         uids: object = None, gids: object = None, allow_root: bool = False) -> Capability:
    """A checked Capability. PATHS: None or empty means the whole tree. A uid list that
    holds 0 grants root, as allow_root does."""
    raw_paths = list(paths or ["/"])
    if len(raw_paths) > MAX_PATHS:
        raise ConfigError(f"at most {MAX_PATHS} paths per capability")
    normal = sorted({normal_path(p) for p in raw_paths})
    if "/" in normal:
        normal = ["/"]
    else:  # a path under another adds nothing
        normal = [p for p in normal if not any(p.startswith(q + "/") for q in normal)]
    uid_set, gid_set = _ids(uids, "uids"), _ids(gids, "gids")
    if not isinstance(read_only, bool) or not isinstance(allow_root, bool):
        raise ConfigError("read_only and allow_root must be true or false")
    if uid_set is not None and 0 in uid_set:
        allow_root = True
    return Capability(tuple(normal), read_only, uid_set, gid_set, allow_root)


@dataclass(frozen=True)
class Caller:
    """Who a request comes from and whom it acts as (after squashing)."""

    name: str                  # the certificate's common name ("" on plaintext)
    role: str                  # its role (mosafs.certs.ROLES); "" on plaintext
    capability: Capability
    uid: int
    gids: tuple[int, ...]      # the primary group first
    fingerprint: bytes = b""   # SHA-256 of the certificate (DER); b"" on plaintext

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def in_group(self, gid: int) -> bool:
        return gid in self.gids


ROOT = Caller("", "", FULL, 0, (0,))

R, W, X = 4, 2, 1  # the permission bits a check wants (read, write, search or execute)


def posix_allows(uid: int, gids: tuple[int, ...], owner: int, group: int, mode: int,
                 want: int, *, directory: bool) -> bool:
    """Whether UID, in groups GIDS, has the WANT bits (R|W|X) on an inode of OWNER, GROUP
    and MODE by POSIX's rules: the manager's checks (mosafs.manager.permissions) and a
    mount's answers from its cache (mosafs.client.files) alike. Root passes everything
    but executing a file without any x bit."""
    if uid == 0:
        return not (want & X and not directory and not mode & 0o111)
    if uid == owner:
        bits = mode >> 6
    elif group in gids:
        bits = mode >> 3
    else:
        bits = mode
    return bits & want == want


class Refused(Exception):
    """A request the capability does not allow: (reason, message). The reason is one of
    "capability" (outside the subtree, read-only, another uid) or "permission" (POSIX)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def acting(capability: Capability, name: str, role: str, uid: int | None,
           gids: list[int] | None, fingerprint: bytes = b"") -> Caller:
    """The Caller for a request that says it acts as UID/GIDS (None: as root).

    Refused when the capability names uids or gids and the request asks for others; uid 0
    without allow_root is squashed."""
    if uid is None:
        if capability.allow_root or capability.uids is None:
            uid, gids = 0, [0]
        else:
            uid = min(capability.uids)
            gids = sorted(capability.gids) if capability.gids is not None else [uid]
    groups = [0] if gids is None or not gids else list(gids)
    if not 0 <= uid <= MAX_ID or any(not 0 <= g <= MAX_ID for g in groups):
        raise Refused("capability", f"uid {uid} or a gid of {groups[:4]} is out of range")
    if len(groups) > MAX_GIDS:
        raise Refused("capability", f"{len(groups)} groups; at most {MAX_GIDS}")
    if uid == 0 and not capability.allow_root:
        if capability.uids is not None:
            raise Refused("capability", f"certificate {name!r} may not act as root")
        return Caller(name, role, capability, SQUASH_UID, (SQUASH_GID,), fingerprint)
    if capability.uids is not None and uid not in capability.uids:
        raise Refused("capability", f"certificate {name!r} may not act as uid {uid}")
    if capability.gids is not None:
        outside = [g for g in groups if g not in capability.gids]
        if outside:
            raise Refused("capability", f"certificate {name!r} may not act as gid "
                                        f"{outside[0]}")
    return Caller(name, role, capability, uid, tuple(dict.fromkeys(groups)), fingerprint)
