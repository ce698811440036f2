"""The manager's own access checks (DESIGN §11; docs/operations.md "Identities and
capabilities"): before a namespace, write or read RPC runs, `Guard` checks the caller's
capability (subtree, read-only; mosafs.capability) and the POSIX permissions of the uid
and groups it acts as. A mount host's kernel checks the same permissions first; these hold
against a client that sends raw RPCs with its key.

Positions of an inode relative to a capability's subtrees:
  inside    a subtree's directory or anything below it (a non-directory by the directory
            of the entry its InodeRecord.parent/.name keep, docs/metadata.md; one
            without, whose recorded name went while other hard links remain, or made
            before every kind kept one, has no known place: outside);
  above     a directory above a subtree: it may be looked up in (only the next name on
            the way down), stat'ed and listed (ReadDir shows only that name);
  outside   anything else: every request is refused, whether the name exists or not.
Listings that name directories anywhere (folder settings, a pool's folders) show a
restricted caller only those it may stat (`seen_by`).

POSIX rules, as Linux applies them: search (x) on a directory to look up in it, read (r)
to list it, write and search (wx) to add or remove names; in a sticky directory only the
owner of the name, of the directory, or root removes or replaces a name; chmod by the owner
or root (the setgid bit is dropped when a caller other than root is not in the file's
group, the new one if the same request changes it: `setattr` answers the mode to store,
as Linux's setattr_prepare); a block or character device made only by root (CAP_MKNOD,
EPERM otherwise, as mknod(2)); chown to
another uid only by root, chgrp by the owner to one of their groups; times set by the
owner, root, or a writer (a client cannot tell "now" from an explicit time); a hard link to
a file one neither owns nor may read and write is refused (protected_hardlinks). Root
(uid 0, where the capability allows it) passes every permission check.

The checks read the store in their own transaction, before the operation's: a permission
changed in between is seen by the next request (as with NFS). Refusals are logged on the
"mosafs.audit" logger and counted (metrics.REFUSALS).
"""

from __future__ import annotations

import logging
import stat
from collections.abc import Callable, Sequence
from typing import TypeVar

from mosafs import metrics
from mosafs._proto import metadata_pb2
from mosafs.capability import Caller, R, W, X, posix_allows
from mosafs.errors import AccessDenied, NotFound, NotPermitted, ReadOnly
from mosafs.manager.metadata import (
    DEVICES,
    DIRECTORY,
    ROOT_INODE,
    UNCHANGED_ID,
    MetadataStore,
)

audit = logging.getLogger("mosafs.audit")
INSIDE, ABOVE, OUTSIDE = "inside", "above", "outside"
_Rec = metadata_pb2.InodeRecord
_A = TypeVar("_A")


def _refuse(reason: str, caller: Caller, what: str, exc: Exception) -> Exception:
    metrics.REFUSALS.labels(reason).inc()
    audit.info("refused %s to %s (uid %d): %s", what, caller.name or "a plaintext peer",
               caller.uid, exc)
    return exc


def may(rec: _Rec, caller: Caller, want: int) -> bool:
    """Whether CALLER has the WANT bits (R|W|X) on REC by POSIX's rules."""
    return posix_allows(caller.uid, caller.gids, rec.uid, rec.gid, rec.mode, want,
                        directory=rec.kind == DIRECTORY)


class Guard:
    """Checks for every RPC that touches the namespace or file data; each method returns
    quietly or raises AccessDenied (EACCES), NotPermitted (EPERM) or ReadOnly (EROFS)."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    # -- positions ----------------------------------------------------------------------

    def _roots(self, tx: object, caller: Caller) -> list[list[tuple[int, bytes]]]:
        """For each subtree of the capability: the chain [(dir inode, next name), ...]
        from the root down to it, the subtree's own inode last with name b"". A subtree
        that does not exist (yet) is left out."""
        chains = []
        for path in caller.capability.paths:
            chain: list[tuple[int, bytes]] = []
            ino: int | None = ROOT_INODE
            for name in [p.encode() for p in path.split("/") if p]:
                assert ino is not None
                chain.append((ino, name))
                ino = tx.child(ino, name)  # type: ignore[attr-defined]
                if ino is None:
                    break
            if ino is not None:
                chains.append([*chain, (ino, b"")])
        return chains

    def _position(self, tx: object, caller: Caller, ino: int) -> tuple[str, set[bytes]]:
        """(position, names on the way down when ABOVE) of inode INO."""
        if caller.capability.paths == ("/",):
            return INSIDE, set()
        rec = tx.find_inode(ino)  # type: ignore[attr-defined]
        if rec is None:
            return OUTSIDE, set()
        # A non-directory is where the entry its parent/name keep is (every kind keeps one).
        directory = ino if rec.kind == DIRECTORY else rec.parent
        if directory == 0:  # that name went while other links remain: no known place
            return OUTSIDE, set()
        chains = self._roots(tx, caller)
        for chain in chains:
            top = chain[-1][0]
            if tx.is_ancestor(top, directory):  # type: ignore[attr-defined]
                return INSIDE, set()
        names = {name for chain in chains for d, name in chain[:-1] if d == ino}
        if names and rec.kind == DIRECTORY:
            return ABOVE, names
        return OUTSIDE, set()

    def _need(self, caller: Caller, what: str, ino: int, *, above_ok: bool = False,
              want: int = 0, directory: bool = False) -> _Rec:
        """The inode's record, after the capability and POSIX checks for WANT. DIRECTORY:
        INO is used as a directory; when it is none, the operation's own NotADirectory
        is the answer, so no permission is checked here."""
        with self._store.transaction() as tx:
            rec = tx.find_inode(ino)
            if rec is None:
                raise NotFound(f"no inode {ino}")
            position, _ = self._position(tx, caller, ino)
        if position == OUTSIDE or (position == ABOVE and not above_ok):
            raise _refuse("capability", caller, what, AccessDenied(
                f"{what}: inode {ino} is outside what certificate {caller.name!r} may "
                f"reach ({caller.capability.describe()})"))
        if directory and rec.kind != DIRECTORY:
            return rec
        if want and not may(rec, caller, want):
            raise _refuse("permission", caller, what, AccessDenied(
                f"{what}: uid {caller.uid} lacks {_bits(want)} permission on inode {ino} "
                f"(mode {stat.S_IMODE(rec.mode):04o}, owner {rec.uid}:{rec.gid})"))
        return rec

    def _writable(self, caller: Caller, what: str) -> None:
        if caller.capability.read_only:
            raise _refuse("capability", caller, what, ReadOnly(
                f"{what}: certificate {caller.name!r} is read-only"))

    # -- lookups and listings -------------------------------------------------------------

    def lookup(self, caller: Caller, parent: int, name: str) -> None:
        with self._store.transaction() as tx:
            position, names = self._position(tx, caller, parent)
        if position == ABOVE and name.encode() not in names:
            raise _refuse("capability", caller, "Lookup", AccessDenied(
                f"Lookup: {name!r} in inode {parent} is outside what certificate "
                f"{caller.name!r} may reach"))
        self._need(caller, "Lookup", parent, above_ok=True, want=X, directory=True)

    def visible(self, caller: Caller, ino: int) -> set[bytes] | None:
        """The names of directory INO a ReadDir may show: None for all of them."""
        self._need(caller, "ReadDir", ino, above_ok=True, want=R, directory=True)
        with self._store.transaction() as tx:
            position, names = self._position(tx, caller, ino)
        return names if position == ABOVE else None

    def stat(self, caller: Caller, ino: int, what: str = "GetAttr") -> None:
        """GetAttr, and GetFolderSettings (a folder's path and settings)."""
        self._need(caller, what, ino, above_ok=True)

    def seen_by(self, caller: Caller) -> Callable[[Sequence[int]], list[int]] | None:
        """For listings that name directories anywhere (ListFolderSettings, a pool's
        folders): of some inodes, those CALLER may stat, in order, without refusing the
        others; None when it may stat every one."""
        if caller.capability.paths == ("/",):
            return None

        def seen(inodes: Sequence[int]) -> list[int]:
            with self._store.transaction() as tx:
                return [ino for ino in inodes
                        if self._position(tx, caller, ino)[0] != OUTSIDE]
        return seen

    def read(self, caller: Caller, ino: int, what: str) -> None:
        """File data and versions (GetBlockMap, version stats), xattrs: read permission."""
        self._need(caller, what, ino, want=R)

    def write(self, caller: Caller, ino: int, what: str) -> None:
        """OpenWrite, RestoreVersion, SetXattr, RemoveXattr: write permission."""
        self._writable(caller, what)
        self._need(caller, what, ino, want=W)

    def inside(self, caller: Caller, ino: int, what: str, *, changes: bool = False) -> None:
        if changes:
            self._writable(caller, what)
        self._need(caller, what, ino)

    def writes_chunks(self, caller: Caller, what: str) -> None:
        """Lease and chunk-index calls only a writer makes."""
        self._writable(caller, what)

    # -- changes to directories ---------------------------------------------------------

    def create(self, caller: Caller, parent: int, uid: int, gid: int, what: str) -> None:
        """Mkdir, Create, Symlink, Mknod in PARENT, owned by UID:GID."""
        self._writable(caller, what)
        pdir = self._need(caller, what, parent, want=W | X, directory=True)
        if caller.is_root:
            return
        setgid_gid = pdir.gid if pdir.mode & stat.S_ISGID else None
        if uid != caller.uid or not (caller.in_group(gid) or gid == setgid_gid):
            raise _refuse("permission", caller, what, AccessDenied(
                f"{what}: uid {caller.uid} may not create a name owned by {uid}:{gid}"))

    def mknod(self, caller: Caller, parent: int, kind: int, uid: int, gid: int) -> None:
        """Mknod: as create, and a block or character device only by root (CAP_MKNOD:
        mknod(2) answers EPERM). A mount host's kernel checks this first, but a raw
        request must not leave a device node that every mount host then honours."""
        self.create(caller, parent, uid, gid, "Mknod")
        if kind in DEVICES and not caller.is_root:
            raise _refuse("permission", caller, "Mknod", NotPermitted(
                f"Mknod: uid {caller.uid} may not make a device node (only root may)"))

    def remove(self, caller: Caller, parent: int, name: str, what: str) -> None:
        """Unlink, Rmdir, and the source and target names of Rename."""
        self._writable(caller, what)
        pdir = self._need(caller, what, parent, want=W | X, directory=True)
        if caller.is_root or not pdir.mode & stat.S_ISVTX or pdir.uid == caller.uid:
            return
        with self._store.transaction() as tx:
            child = tx.child(parent, name.encode())
            rec = tx.find_inode(child) if child is not None else None
        if rec is not None and rec.uid != caller.uid:
            raise _refuse("permission", caller, what, NotPermitted(
                f"{what}: {name!r} is in a sticky directory and not owned by uid "
                f"{caller.uid}"))

    def rename(self, caller: Caller, old_parent: int, old_name: str, new_parent: int,
               new_name: str) -> None:
        self.remove(caller, old_parent, old_name, "Rename")
        self.remove(caller, new_parent, new_name, "Rename")
        if old_parent == new_parent or caller.is_root:
            return
        with self._store.transaction() as tx:
            child = tx.child(old_parent, old_name.encode())
            rec = tx.find_inode(child) if child is not None else None
        # A directory that moves rewrites its "..": that needs write permission on it.
        if rec is not None and rec.kind == DIRECTORY and not may(rec, caller, W):
            raise _refuse("permission", caller, "Rename", AccessDenied(
                f"Rename: moving directory {old_name!r} needs write permission on it"))

    def link(self, caller: Caller, ino: int, new_parent: int) -> None:
        self._writable(caller, "Link")
        rec = self._need(caller, "Link", ino)
        self._need(caller, "Link", new_parent, want=W | X, directory=True)
        if not (caller.is_root or rec.uid == caller.uid or may(rec, caller, R | W)):
            raise _refuse("permission", caller, "Link", NotPermitted(
                f"Link: uid {caller.uid} neither owns inode {ino} nor may read and write "
                f"it"))

    # -- attributes -------------------------------------------------------------------------

    def setattr(self, caller: Caller, ino: int, *, mode: int | None, uid: int | None,
                gid: int | None, times: bool) -> int | None:
        """The checks of a SetAttr; the mode to store (None: unchanged): MODE without the
        setgid bit when the caller is not root and not in the file's group (GID where the
        request changes it), as Linux's chmod drops it, so that no one makes a file
        setgid to a group they are not in."""
        self._writable(caller, "SetAttr")
        rec = self._need(caller, "SetAttr", ino)
        if caller.is_root:
            return mode
        # 2^32-1 leaves the owner as it is (chown(2)'s -1): no change to check.
        uid = None if uid == UNCHANGED_ID else uid
        gid = None if gid == UNCHANGED_ID else gid
        owner = rec.uid == caller.uid
        problems: list[str] = []
        if mode is not None and not owner:
            problems.append("only the owner or root changes the mode")
        if uid is not None and uid != rec.uid:
            problems.append("only root gives a file to another uid")
        if gid is not None and gid != rec.gid and not (owner and caller.in_group(gid)):
            problems.append(f"only the owner changes the group, to one of their groups "
                            f"(not {gid})")
        if times and not (owner or may(rec, caller, W)):
            problems.append("only the owner or a writer sets the times")
        if problems:
            raise _refuse("permission", caller, "SetAttr", NotPermitted(
                f"SetAttr of inode {ino} by uid {caller.uid}: " + "; ".join(problems)))
        if mode is not None and not caller.in_group(rec.gid if gid is None else gid):
            mode &= ~stat.S_ISGID
        return mode


def _bits(want: int) -> str:
    return "".join(c for bit, c in ((R, "r"), (W, "w"), (X, "x")) if want & bit)
