"""Domain errors: each carries a message a person can act on, an errno for the FUSE layer
and an exit code for the command line.

The RPC layer (mosafs.rpc.errors) maps every class to one gRPC status code and back, by
`kind`, so an error raised in the manager arrives in the client as the same class. Anything
that is not a MosafsError is a bug and is the only thing that gets a traceback.
"""

from __future__ import annotations

import errno as _errno
from typing import ClassVar


class MosafsError(Exception):
    """Base class. `kind` names the class on the wire; keep kinds stable."""

    kind: ClassVar[str] = "error"
    errno: ClassVar[int] = _errno.EIO
    exit_code: ClassVar[int] = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgument(MosafsError):
    kind = "invalid-argument"
    errno = _errno.EINVAL
    exit_code = 2


class ConfigError(MosafsError):
    """Bad configuration or command-line input."""

    kind = "config"
    errno = _errno.EINVAL
    exit_code = 2


class NotFound(MosafsError):
    kind = "not-found"
    errno = _errno.ENOENT
    exit_code = 3


class AlreadyExists(MosafsError):
    kind = "exists"
    errno = _errno.EEXIST
    exit_code = 4


class NotADirectory(MosafsError):
    kind = "not-a-directory"
    errno = _errno.ENOTDIR
    exit_code = 4


class IsADirectory(MosafsError):
    kind = "is-a-directory"
    errno = _errno.EISDIR
    exit_code = 4


class DirectoryNotEmpty(MosafsError):
    kind = "not-empty"
    errno = _errno.ENOTEMPTY
    exit_code = 4


class NameTooLong(MosafsError):
    kind = "name-too-long"
    errno = _errno.ENAMETOOLONG
    exit_code = 2


class NotPermitted(MosafsError):
    """The operation is never allowed on this object (EPERM): a hard link to a directory,
    a device node, a write to a read-only mosafs attribute."""

    kind = "not-permitted"
    errno = _errno.EPERM
    exit_code = 4


class NotSupported(MosafsError):
    kind = "not-supported"
    errno = _errno.EOPNOTSUPP
    exit_code = 4


class AccessDenied(MosafsError):
    """The caller's certificate does not allow the call (an admin RPC with a client's), or
    the caller could not prove who it is."""

    kind = "access-denied"
    errno = _errno.EACCES
    exit_code = 77  # EX_NOPERM


class TokenRefused(AccessDenied):
    """A benefactor refused a chunk transfer: no chunk access token, or one that is
    malformed, expired, forged, signed with a key it does not know, or issued for another
    chunk or another certificate (docs/operations.md, "Chunk access tokens"). A reader
    whose token expired asks the manager for the block-map again."""

    kind = "token-refused"


class ReadOnly(MosafsError):
    """A change to something that is read-only: the mount's views of older versions."""

    kind = "read-only"
    errno = _errno.EROFS
    exit_code = 4


class NoAttribute(MosafsError):
    """No such extended attribute (ENODATA, which Linux also calls ENOATTR)."""

    kind = "no-attribute"
    errno = _errno.ENODATA
    exit_code = 3


class ValueTooLarge(MosafsError):
    """An extended attribute value or a symlink target over its limit."""

    kind = "too-large"
    errno = _errno.E2BIG
    exit_code = 2


class NoSpace(MosafsError):
    """No live benefactor with space can take the data."""

    kind = "no-space"
    errno = _errno.ENOSPC
    exit_code = 5


class LeaseExpired(MosafsError):
    """A write session's lease is unknown or has run out; the write was not committed."""

    kind = "lease-expired"
    errno = _errno.EIO
    exit_code = 5


class FailedPrecondition(MosafsError):
    kind = "failed-precondition"
    errno = _errno.EIO
    exit_code = 5


class IntegrityError(MosafsError):
    """Bytes whose BLAKE3 id does not match: never handed to a reader."""

    kind = "integrity"
    errno = _errno.EIO
    exit_code = 6


class Unavailable(MosafsError):
    """A peer process cannot be reached."""

    kind = "unavailable"
    errno = _errno.EIO
    exit_code = 7


class DeadlineExceeded(MosafsError):
    kind = "deadline"
    errno = _errno.ETIMEDOUT
    exit_code = 7


class ResourceExhausted(MosafsError):
    """A request larger than a server accepts."""

    kind = "resource-exhausted"
    errno = _errno.EFBIG
    exit_code = 2


class InternalError(MosafsError):
    """A peer hit a bug; its log has the traceback."""

    kind = "internal"
    errno = _errno.EIO
    exit_code = 70


ALL_ERRORS: tuple[type[MosafsError], ...] = (
    MosafsError, InvalidArgument, ConfigError, NotFound, AlreadyExists, NotADirectory,
    IsADirectory, DirectoryNotEmpty, NameTooLong, NotPermitted, NotSupported, AccessDenied,
    TokenRefused, ReadOnly,
    NoAttribute,
    ValueTooLarge, NoSpace, LeaseExpired, FailedPrecondition,
    IntegrityError, Unavailable, DeadlineExceeded, ResourceExhausted, InternalError,
)
BY_KIND: dict[str, type[MosafsError]] = {cls.kind: cls for cls in ALL_ERRORS}


def domain_error(exc: BaseException) -> MosafsError | None:
    """The domain error EXC stands for, or None for a bug. Tasks fail in a trio nursery,
    which wraps their errors in an exception group (several puts or look-ups can fail at
    once when a server goes away): a group of domain errors only is the first of them."""
    if isinstance(exc, MosafsError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        leaves = [domain_error(e) for e in exc.exceptions]
        if leaves and all(leaf is not None for leaf in leaves):
            return leaves[0]
    return None
