"""Extended attributes (the `user.*` namespace), each operation in one transaction."""

from __future__ import annotations

import time

from mosafs.errors import AlreadyExists, NoAttribute, NoSpace, ValueTooLarge
from mosafs.manager.metadata.base import StoreBase, _rerun_if_grown
from mosafs.manager.metadata.checks import check_xattr_name
from mosafs.manager.metadata.schema import _U64, XATTR_LIST_MAX, XATTR_SIZE_MAX, XATTR_TOTAL_MAX
from mosafs.manager.metadata.tx import Tx


class XattrOps(StoreBase):
    """Extended attributes of any kind of inode."""

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

        def body(tx: Tx) -> None:
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
        self._grouped(body, grows=True)

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

        def body(tx: Tx) -> None:
            rec = tx.inode(inode)
            if not tx.txn.delete(_U64.pack(inode) + raw, db=self._db.xattrs):
                raise NoAttribute(f"inode {inode} has no attribute {name[:80]!r}")
            rec.ctime_ns = now
            tx.put_inode(inode, rec)
        self._grouped(body)

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
