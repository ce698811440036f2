"""The read-only `.versions` view of every directory (docs/lifecycle.md).

`DIR/.versions/` lists the regular files of DIR that have a committed version;
`DIR/.versions/NAME/` lists the versions NAME keeps, by number; `DIR/.versions/NAME/N` is
version N of NAME, a read-only regular file with that version's size and mtime. `.versions`
is hidden (never listed in DIR), so `ls`, `cp -a`, `tar` and `rsync` of a tree do not copy
every version, and reserved (the manager refuses it as a new name).

The view's inodes are the mount's own, numbered from VIRTUAL_BASE up (the manager's
inode numbers never get there). Each is kept while the kernel holds it: a lookup or a
listed entry counts one reference, FORGET takes them away, and at zero the number is
freed (the FUSE lookup-count protocol).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from mosafs import errors
from mosafs._proto import manager_pb2 as mpb
from mosafs.client.rpc import ManagerClient

VERSIONS = ".versions"
VIRTUAL_BASE = 1 << 62
_DIR, _FILE, _VERSION = "versions-dir", "file-versions", "version"


@dataclass(frozen=True)
class Node:
    """What a view inode shows: the `.versions` of DIRECTORY, the versions of file INODE
    (named NAME in DIRECTORY), or VERSION of file INODE."""

    kind: str
    directory: int
    inode: int = 0
    name: str = ""
    version: int = 0


def is_virtual(inode: int) -> bool:
    return inode >= VIRTUAL_BASE


def parse_version(name: str) -> int:
    """A version file's name: a decimal number without leading zeros."""
    # Versions are u64: a longer name names none (it would not fit in the request).
    if not name.isascii() or not name.isdigit() or name.startswith("0") \
            or int(name) >= 1 << 64:
        raise errors.NotFound(f"no version {name[:40]!r}: versions are named 1, 2, ...")
    return int(name)


class VersionNodes:
    """View inode numbers and their lookup counts."""

    def __init__(self) -> None:
        self._numbers = itertools.count(VIRTUAL_BASE)
        self._nodes: dict[int, Node] = {}
        self._by_node: dict[Node, int] = {}
        self._lookups: dict[int, int] = {}

    def number(self, node: Node) -> int:
        """The inode number of NODE (the same one while the kernel holds it)."""
        inode = self._by_node.get(node)
        if inode is None:
            inode = next(self._numbers)
            self._nodes[inode] = node
            self._by_node[node] = inode
            self._lookups[inode] = 0
        return inode

    def node(self, inode: int) -> Node:
        node = self._nodes.get(inode)
        if node is None:
            raise errors.NotFound(f"view inode {inode} is no longer known")
        return node

    def looked_up(self, inode: int) -> None:
        if inode in self._lookups:
            self._lookups[inode] += 1

    def forget(self, inode: int, count: int) -> None:
        left = self._lookups.get(inode, 0) - count
        if left > 0:
            self._lookups[inode] = left
            return
        node = self._nodes.pop(inode, None)
        self._lookups.pop(inode, None)
        if node is not None:
            self._by_node.pop(node, None)

    def sweep(self) -> None:
        """Free the numbers no kernel reference holds (given to listed entries that the
        kernel did not take). Only while no listing of the view is open: its entries may
        still be handed to the kernel."""
        for inode in [i for i, count in self._lookups.items() if count == 0]:
            self.forget(inode, 0)

    def __len__(self) -> int:
        return len(self._nodes)


def view_attr(inode: int, node: Node, owner: mpb.Attr,
              stats: mpb.VersionStats | None = None) -> mpb.Attr:
    """Attributes of a view inode: directories r-x, version files r-- (OWNER's permission
    bits without write), owned like OWNER (the directory or the file)."""
    attr = mpb.Attr(inode=inode, uid=owner.uid, gid=owner.gid, atime_ns=owner.atime_ns,
                    mtime_ns=owner.mtime_ns, ctime_ns=owner.ctime_ns)
    if node.kind == _VERSION:
        assert stats is not None
        attr.kind = mpb.FILE_KIND_REGULAR
        attr.mode = owner.mode & 0o555
        attr.nlink = 1
        attr.size = stats.size
        attr.mtime_ns = stats.mtime_ns
        attr.ctime_ns = attr.atime_ns = stats.commit_time_ns
        attr.version = node.version
    else:
        attr.kind = mpb.FILE_KIND_DIRECTORY
        attr.mode = 0o555
        attr.nlink = 2
    return attr


class VersionView:
    """Lookups, attributes and listings of the view, from the manager's answers."""

    def __init__(self, manager: ManagerClient) -> None:
        self.manager = manager
        self.nodes = VersionNodes()
        self._open_listings = 0

    def listing_closed(self) -> None:
        self._open_listings -= 1
        if self._open_listings == 0:
            self.nodes.sweep()

    async def lookup_root(self, directory: mpb.Attr) -> mpb.Attr:
        """`.versions` of DIRECTORY (a real directory's attributes)."""
        if directory.kind != mpb.FILE_KIND_DIRECTORY:
            raise errors.NotADirectory(f"inode {directory.inode} is not a directory")
        return await self._looked_up(Node(_DIR, directory.inode))

    async def lookup(self, parent: int, name: str) -> mpb.Attr:
        node = self.nodes.node(parent)
        if node.kind == _DIR:
            child = await self.manager.lookup(node.directory, name)
            if child.kind != mpb.FILE_KIND_REGULAR or not child.version:
                raise errors.NotFound(f"{name!r} has no versions")
            found = Node(_FILE, node.directory, child.inode, name)
        elif node.kind == _FILE:
            found = Node(_VERSION, node.directory, node.inode, node.name, parse_version(name))
        else:
            raise errors.NotADirectory(f"version {node.version} of {node.name!r} is a file")
        return await self._looked_up(found)

    async def _looked_up(self, found: Node) -> mpb.Attr:
        number = self.nodes.number(found)
        self.nodes.looked_up(number)  # before the awaits: a sweep meanwhile keeps it
        try:
            return await self.attr(number)
        except BaseException:
            self.nodes.forget(number, 1)
            raise

    async def attr(self, inode: int) -> mpb.Attr:
        node = self.nodes.node(inode)
        manager = self.manager
        if node.kind == _DIR:
            return view_attr(inode, node, await manager.getattr(node.directory))
        owner = await manager.getattr(node.inode)
        if node.kind == _FILE:
            return view_attr(inode, node, owner)
        stats = await manager.version_stats(node.inode, node.version)
        return view_attr(inode, node, owner, stats)

    async def listing(self, inode: int) -> list[mpb.DirEntry]:
        """The entries of view directory INODE; call listing_closed() when the handle that
        lists them is released."""
        self._open_listings += 1
        try:
            return await self._listing(inode)
        except BaseException:
            self.listing_closed()
            raise

    async def _listing(self, inode: int) -> list[mpb.DirEntry]:
        node = self.nodes.node(inode)
        manager = self.manager
        out = []
        if node.kind == _DIR:
            for entry in await manager.readdir(node.directory):
                if entry.attr.kind == mpb.FILE_KIND_REGULAR and entry.attr.version:
                    child = Node(_FILE, node.directory, entry.attr.inode, entry.name)
                    number = self.nodes.number(child)
                    out.append(mpb.DirEntry(name=entry.name,
                                            attr=view_attr(number, child, entry.attr)))
        elif node.kind == _FILE:
            owner = await manager.getattr(node.inode)
            for stats in await manager.list_versions(node.inode):
                child = Node(_VERSION, node.directory, node.inode, node.name, stats.version)
                number = self.nodes.number(child)
                out.append(mpb.DirEntry(name=str(stats.version),
                                        attr=view_attr(number, child, owner, stats)))
        else:
            raise errors.NotADirectory(f"version {node.version} of {node.name!r} is a file")
        return out

    async def block_map(self, inode: int) -> mpb.BlockMap:
        """The block-map a handle of version file INODE reads."""
        node = self.nodes.node(inode)
        if node.kind != _VERSION:
            raise errors.IsADirectory(f"{VERSIONS} entry {node.name!r} is a directory")
        return await self.manager.block_map(node.inode, node.version)
