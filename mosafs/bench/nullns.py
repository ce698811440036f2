"""A null namespace: the ceiling of metadata operations through any pyfuse3 file system.

    python -m mosafs.bench.nullns MOUNTPOINT [--ready-file F] [--allow-other]

mosafs.bench.nullfs measures the write and read path's ceiling on one file; this one
measures the namespace's. It keeps a tree of directories and empty files in a dict and
answers every request at once: `lookup`, `getattr`, `mkdir`, `create` (with `open`,
`flush` and `release`), `unlink`, `readdir` and extended attributes, with no RPC, no
durability and no cache of its own. It runs like `mosafs mount` (mosafs/client/main.py):
pyfuse3 on trio, one task per request, pyfuse3's default options plus fsname/subtype,
the same entry and attribute timeouts (1 s), ENODATA for every extended attribute.

So creates/s and stats/s through it are what pyfuse3, trio and the kernel's FUSE
module cost on the machine before a file system does any work of its own: a mosafs
mount (which also asks a manager, whose commit is durable) cannot pass them on the same
CPUs. `mosafs bench metadata` runs its create and stat phases with 8 clients on it
beside mosafs (unless `--no-floor`).

SIGINT/SIGTERM unmount and exit. Once mounted, the ready file (if given) gets
{"pid", "address", "mountpoint"} like every mosafs daemon's.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import pyfuse3
import trio

from mosafs.bench.nullfs import mount_parser, serve_ops

ROOT = pyfuse3.ROOT_INODE
TIMEOUT = 1.0  # mosafs.client.files.ClientConfig.attr_timeout


@dataclass
class _Node:
    mode: int
    children: dict[bytes, int] | None = None  # a directory's names
    times: int = field(default_factory=time.time_ns)


class NullNamespace(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False  # as mosafs.client.operations.Operations

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[int, _Node] = {ROOT: _Node(stat.S_IFDIR | 0o755, {})}
        self.next_inode = ROOT + 1
        self.uid, self.gid = os.getuid(), os.getgid()

    def _entry(self, inode: int) -> pyfuse3.EntryAttributes:
        node = self.nodes.get(inode)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        entry.st_mode = node.mode
        entry.st_nlink = 2 if node.children is not None else 1
        entry.st_size = 0
        entry.st_uid, entry.st_gid = self.uid, self.gid
        entry.st_blksize = 1 << 17
        entry.st_blocks = 0
        entry.st_atime_ns = entry.st_mtime_ns = entry.st_ctime_ns = node.times
        entry.generation = 0
        entry.entry_timeout = entry.attr_timeout = TIMEOUT
        return entry

    def _dir(self, inode: int) -> dict[bytes, int]:
        node = self.nodes.get(inode)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if node.children is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return node.children

    def _make(self, parent: int, name: bytes, mode: int, is_dir: bool) -> int:
        names = self._dir(parent)
        if name in names:
            raise pyfuse3.FUSEError(errno.EEXIST)
        inode = self.next_inode
        self.next_inode += 1
        self.nodes[inode] = _Node(mode, {} if is_dir else None)
        names[name] = inode
        self.nodes[parent].times = time.time_ns()
        return inode

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self._entry(inode)

    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: Any = None) -> pyfuse3.EntryAttributes:
        inode = self._dir(parent_inode).get(name)
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._entry(inode)

    async def setattr(self, inode: int, attr: Any, fields: Any, fh: Any,
                      ctx: Any) -> pyfuse3.EntryAttributes:
        return self._entry(inode)

    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: Any) -> pyfuse3.EntryAttributes:
        return self._entry(self._make(parent_inode, name, stat.S_IFDIR | (mode & 0o7777),
                                      True))

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: Any) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        inode = self._make(parent_inode, name, stat.S_IFREG | (mode & 0o7777), False)
        return pyfuse3.FileInfo(fh=inode, keep_cache=False), self._entry(inode)

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        self._entry(inode)
        return pyfuse3.FileInfo(fh=inode, keep_cache=False)

    async def flush(self, fh: int) -> None:
        return None

    async def release(self, fh: int) -> None:
        return None

    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        inode = self._dir(parent_inode).pop(name, None)
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        self.nodes.pop(inode, None)

    async def opendir(self, inode: int, ctx: Any) -> int:
        self._dir(inode)
        return inode

    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        names = sorted(self._dir(fh).items())
        for offset, (name, inode) in enumerate(names[start_id:], start_id + 1):
            if not pyfuse3.readdir_reply(token, name, self._entry(inode), offset):
                return

    async def releasedir(self, fh: int) -> None:
        return None

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = 4096
        data.f_blocks = data.f_bfree = data.f_bavail = 1 << 30
        data.f_files = len(self.nodes)
        data.f_ffree = data.f_favail = 1 << 30
        data.f_namemax = 255
        return data

    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)  # as the mosafs mount for these names

    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        return []


def main(argv: list[str] | None = None) -> int:
    args = mount_parser("nullns", "Mount the null pyfuse3 namespace.").parse_args(argv)
    if not os.path.isdir(args.mountpoint):
        print(f"mount point {args.mountpoint} is not a directory", file=sys.stderr)
        return 2
    trio.run(serve_ops, NullNamespace(), "mosafs-nullns", os.path.abspath(args.mountpoint),
             args.allow_other, args.ready_file, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
