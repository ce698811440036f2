"""The namespace: inodes and directory entries (lookup, getattr, setattr, readdir, mkdir,
create, unlink, rmdir, rename, symlink, readlink, mknod, link), each in one transaction."""

from __future__ import annotations

import time
from collections import Counter

from mosafs._proto import manager_pb2, metadata_pb2
from mosafs.errors import (
    AlreadyExists,
    DirectoryNotEmpty,
    InvalidArgument,
    IsADirectory,
    NotADirectory,
    NotFound,
    NotPermitted,
    NotSupported,
)
from mosafs.manager.metadata.base import Planned, StoreBase, _rerun_if_grown
from mosafs.manager.metadata.checks import (
    _check_mknod_kind,
    _check_owner,
    _check_time,
    _check_u64,
    _owner_change,
    _permissions,
    check_name,
    check_new_name,
    check_symlink_target,
)
from mosafs.manager.metadata.records import _attr, fill_attr
from mosafs.manager.metadata.schema import (
    _MAX_U32,
    _U64,
    DEVICES,
    DIRECTORY,
    MAX_LINKS,
    MAX_NAME_BYTES,
    MAX_RDEV,
    READDIR_DEFAULT,
    READDIR_MAX,
    REGULAR,
    ROOT_INODE,
    ROOT_OWNER_BITS,
    SYMLINK,
    kind_name,
)
from mosafs.manager.metadata.tx import Tx


def _touch(rec: metadata_pb2.InodeRecord, now: int) -> None:
    """A directory whose entries changed: mtime and ctime."""
    rec.mtime_ns = now
    rec.ctime_ns = now


def _add(tx: Tx, parent: int, pdir: metadata_pb2.InodeRecord, raw: bytes,
         rec: metadata_pb2.InodeRecord, now: int) -> manager_pb2.Attr:
    """REC, a new inode, named RAW in directory PARENT (whose record is PDIR, written back
    with its times at NOW): its attributes."""
    ino = tx.allocate_inode()
    tx.put_inode(ino, rec)
    tx.link(parent, raw, ino)
    if rec.kind == DIRECTORY:
        pdir.nlink += 1  # the new directory's ".."
    _touch(pdir, now)
    tx.put_inode(parent, pdir)
    return _attr(ino, rec)


class NamespaceOps(StoreBase):
    """The namespace: lookups, attributes, directories, files, links, symbolic links and
    device nodes, and the checks of nlink."""

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

        def body(tx: Tx) -> manager_pb2.Attr:
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
        return self._grouped(body)

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
        page = self.readdir_page(inode, start_after, limit)
        return [(entry.name, entry.attr) for entry in page.entries], page.more

    def readdir_page(self, inode: int, start_after: str = "", limit: int = 0,
                     names: set[bytes] | None = None) -> manager_pb2.ReadDirResponse:
        """One page of a directory as ReadDir answers it (readdir's entries, built in
        place), leaving out the entries whose names are not in NAMES (None: none left
        out)."""
        after = _start_after(start_after)
        limit = min(limit or READDIR_DEFAULT, READDIR_MAX)
        out = manager_pb2.ReadDirResponse()
        entries = out.entries
        with self._read() as tx:
            tx.directory(inode)
            inodes = self._db.inodes
            for name, child in tx.entries(inode, after):
                if names is not None and name not in names:
                    continue
                if len(entries) == limit:
                    out.more = True
                    return out
                raw = tx.txn.get(_U64.pack(child), db=inodes)
                if raw is None:  # a dirent without its inode: fsck's dangling_dirent
                    raise NotFound(f"no inode {child}")
                entry = entries.add(name=name.decode("utf-8"))
                # Decoded here, not through tx.inode: its per-transaction cache of every
                # record is no use to a read of 1,000 different inodes.
                fill_attr(entry.attr, child, metadata_pb2.InodeRecord.FromString(raw))
        return out

    def mkdir(self, parent: int, name: str, mode: int, uid: int = 0,
              gid: int = 0) -> manager_pb2.Attr:
        """A new empty directory NAME in PARENT. MODE: permission bits (0o7777; S_IFDIR
        tolerated); UID, GID: its owner, 0..MAX_OWNER_ID (2**32-1 is refused: it means
        "unchanged" and owns nothing). Times: the manager's clock."""
        raw = check_new_name(name)
        perm = _permissions(mode, DIRECTORY)
        _check_owner(uid, gid)
        now = time.time_ns()
        rec = metadata_pb2.InodeRecord(
            kind=DIRECTORY, mode=perm, nlink=2, uid=uid, gid=gid, atime_ns=now,
            mtime_ns=now, ctime_ns=now, parent=parent, name=raw)
        return self._new_entry(parent, name, raw, rec, now)

    @_rerun_if_grown
    def create(self, parent: int, name: str, mode: int, uid: int = 0, gid: int = 0, *,
               exclusive: bool = False) -> manager_pb2.Attr:
        """A new empty regular file; an existing one is returned unless EXCLUSIVE (O_EXCL).
        MODE, UID and GID as for mkdir (S_IFREG tolerated in MODE)."""
        return self.run_plan(self.plan_create(parent, name, mode, uid, gid,
                                              exclusive=exclusive))

    def plan_create(self, parent: int, name: str, mode: int, uid: int = 0, gid: int = 0, *,
                    exclusive: bool = False) -> Planned[manager_pb2.Attr]:
        """create's arguments checked and its write ready to run, with others, in one group
        commit (run_planned: a Batch RPC's creates)."""
        raw = check_new_name(name)
        perm = _permissions(mode, REGULAR)
        _check_owner(uid, gid)
        now = time.time_ns()

        def body(tx: Tx) -> manager_pb2.Attr:
            pdir = tx.directory(parent)
            existing = tx.child(parent, raw)
            if existing is not None:
                if exclusive:
                    raise AlreadyExists(f"{name!r} exists in directory {parent}")
                rec = tx.inode(existing)
                if rec.kind == DIRECTORY:
                    raise IsADirectory(f"{name!r} in directory {parent} is a directory")
                return _attr(existing, rec)
            rec = metadata_pb2.InodeRecord(
                kind=REGULAR, mode=perm, nlink=1, uid=uid, gid=gid, atime_ns=now,
                mtime_ns=now, ctime_ns=now, parent=parent, name=raw)
            return _add(tx, parent, pdir, raw, rec, now)
        return Planned(body, grows=True)

    @_rerun_if_grown
    def unlink(self, parent: int, name: str) -> None:
        raw = check_name(name)
        now = time.time_ns()

        def body(tx: Tx) -> None:
            tx.directory(parent)
            ino = tx.child(parent, raw)
            if ino is None:
                raise NotFound(f"no {name!r} in directory {parent}")
            if tx.inode(ino).kind == DIRECTORY:
                raise IsADirectory(f"{name!r} in directory {parent} is a directory: use rmdir")
            self.remove_name(tx, parent, raw, ino, now)
        self._grouped(body)

    @_rerun_if_grown
    def rmdir(self, parent: int, name: str) -> None:
        raw = check_name(name)
        now = time.time_ns()

        def body(tx: Tx) -> None:
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
        self._grouped(body)

    @staticmethod
    def remove_name(tx: Tx, parent: int, raw: bytes, ino: int, now: int) -> None:
        """Delete entry RAW of directory PARENT, which names non-directory INO (unlink,
        pruning): the entry, a link of INO (the last one: the file), the parent's times."""
        pdir = tx.directory(parent)
        tx.unlink_entry(parent, raw)
        NamespaceOps._release_file(tx, ino, now, parent, raw)
        _touch(pdir, now)
        tx.put_inode(parent, pdir)

    @staticmethod
    def _release_file(tx: Tx, ino: int, now: int, parent: int, name: bytes) -> None:
        """Dirent NAME in PARENT naming non-directory INO is gone: drop a link, and with
        the last one the inode, its versions, block-maps, chunk references and xattrs."""
        rec = tx.inode(ino)
        if rec.nlink > 1:
            rec.nlink -= 1
            rec.ctime_ns = now
            if (rec.parent, rec.name) == (parent, name):
                rec.parent, rec.name = 0, b""  # its recorded name went; others remain
            tx.put_inode(ino, rec)
        else:
            tx.drop_file(ino)

    @_rerun_if_grown
    def rename(self, old_parent: int, old_name: str, new_parent: int, new_name: str, *,
               no_replace: bool = False) -> None:
        old_raw = check_name(old_name)
        new_raw = check_new_name(new_name)
        now = time.time_ns()

        def body(tx: Tx) -> None:
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
            if moving_dir or (rec.parent, rec.name) in ((old_parent, old_raw), (0, b"")):
                # The recorded entry (a file's folder, a non-directory's place for the
                # access checks) follows its name; one without gets this one.
                rec.parent, rec.name = new_parent, new_raw
            rec.ctime_ns = now
            tx.put_inode(ino, rec)
            _touch(src_dir, now)
            _touch(dst_dir, now)
            tx.put_inode(old_parent, src_dir)
            tx.put_inode(new_parent, dst_dir)
        self._grouped(body)

    @staticmethod
    def _remove_target(tx: Tx, target: int, parent: int, raw: bytes, moving_dir: bool,
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
            NamespaceOps._release_file(tx, target, now, parent, raw)

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
            ctime_ns=now, size=len(target), symlink_target=target, parent=parent, name=raw)
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
        device node (root: CAP_MKNOD) is checked before the request gets here, by the
        mount host's kernel and by the manager (mosafs.manager.permissions).
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
                                       atime_ns=now, mtime_ns=now, ctime_ns=now, rdev=rdev,
                                       parent=parent, name=raw)
        return self._new_entry(parent, name, raw, rec, now)

    @_rerun_if_grown
    def _new_entry(self, parent: int, name: str, raw: bytes, rec: metadata_pb2.InodeRecord,
                   now: int) -> manager_pb2.Attr:
        """Give a new REC an inode number and the name RAW in PARENT (AlreadyExists where
        PARENT has that name)."""

        def body(tx: Tx) -> manager_pb2.Attr:
            pdir = tx.directory(parent)
            if tx.child(parent, raw) is not None:
                raise AlreadyExists(f"{name!r} exists in directory {parent}")
            return _add(tx, parent, pdir, raw, rec, now)
        return self._grouped(body, grows=True)

    @_rerun_if_grown
    def link(self, inode: int, new_parent: int, new_name: str) -> manager_pb2.Attr:
        """A hard link: NEW_NAME in NEW_PARENT names INODE too (nlink + 1). Directories
        cannot be linked (NotPermitted, EPERM as link(2))."""
        raw = check_new_name(new_name)
        now = time.time_ns()

        def body(tx: Tx) -> manager_pb2.Attr:
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
            if not rec.parent:
                rec.parent, rec.name = new_parent, raw  # a recorded entry (folder) again
            tx.put_inode(inode, rec)
            _touch(pdir, now)
            tx.put_inode(new_parent, pdir)
            return _attr(inode, rec)
        return self._grouped(body, grows=True)

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


def _start_after(start_after: str) -> bytes:
    """A ReadDir's START_AFTER as stored names are: UTF-8, at most MAX_NAME_BYTES."""
    try:
        after = start_after.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("start_after is not valid Unicode") from None
    if len(after) > MAX_NAME_BYTES:
        raise InvalidArgument(f"start_after is {len(after)} bytes; names have at most "
                              f"{MAX_NAME_BYTES}")
    return after
