"""The null file system with several files: the ceiling of N concurrent writers.

    python -m mosafs.bench.nullfiles MOUNTPOINT --files N [--ready-file F]

As mosafs.bench.nullfs (same process model, mount options and answers), but the root
holds `data.0` .. `data.{N-1}`, each with its own inode and size. `mosafs bench write`'s
concurrent writers each write their own file, on mosafs and MooseFS alike; on the
single-file null file system they would share one inode, and the kernel serializes
writes to one inode (FUSE takes the inode lock for every write without the writeback
cache), which would make the ceiling lower than what N writers can reach.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from typing import Any

import pyfuse3
import trio

from mosafs.bench.nullfs import FILE_INODE, ROOT, NullOperations, _serve

MAX_FILES = 1024


class NullFiles(NullOperations):
    """N files that discard what is written and read as zeros up to their size."""

    def __init__(self, files: int) -> None:
        super().__init__()
        self.inodes = {f"data.{i}".encode(): FILE_INODE + i for i in range(files)}
        self.sizes = dict.fromkeys(self.inodes.values(), 0)

    def _entry(self, inode: int) -> pyfuse3.EntryAttributes:
        entry = super()._entry(inode)
        if inode != ROOT:
            entry.st_size = self.sizes[inode]
            entry.st_blocks = (entry.st_size + 511) // 512
        return entry

    def _check(self, inode: int) -> None:
        if inode != ROOT and inode not in self.sizes:
            raise pyfuse3.FUSEError(errno.ENOENT)

    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: Any = None) -> pyfuse3.EntryAttributes:
        self.counts["lookup"] += 1
        if parent_inode != ROOT or name not in self.inodes:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._entry(self.inodes[name])

    async def setattr(self, inode: int, attr: Any, fields: Any, fh: Any,
                      ctx: Any) -> pyfuse3.EntryAttributes:
        self.counts["setattr"] += 1
        self._check(inode)
        if fields.update_size:
            if inode == ROOT:
                raise pyfuse3.FUSEError(errno.EISDIR)
            self.sizes[inode] = attr.st_size
        return self._entry(inode)

    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        for n, (name, inode) in enumerate(self.inodes.items()):
            if n >= start_id and not pyfuse3.readdir_reply(token, name, self._entry(inode),
                                                           n + 1):
                return

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        self.counts["open"] += 1
        if inode not in self.sizes:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if flags & os.O_TRUNC:
            self.sizes[inode] = 0
        return pyfuse3.FileInfo(fh=inode, keep_cache=False)

    async def read(self, fh: int, off: int, size: int) -> memoryview:  # type: ignore[override]
        self.size = self.sizes[fh]  # the parent's read answers up to self.size
        return await super().read(fh, off, size)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        n = await super().write(fh, off, buf)
        self.sizes[fh] = max(self.sizes[fh], off + n)
        return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mosafs.bench.nullfiles",
                                     description="Mount the null file system with N files.")
    parser.add_argument("mountpoint", help="an existing empty directory")
    parser.add_argument("--files", type=int, default=8, help="files data.0 .. data.N-1")
    parser.add_argument("--ready-file", help="JSON {pid, address, mountpoint} once mounted")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.mountpoint) or not 1 <= args.files <= MAX_FILES:
        print(f"need a directory and 1..{MAX_FILES} files", file=sys.stderr)
        return 2
    trio.run(_serve, NullFiles(args.files), os.path.abspath(args.mountpoint), False,
             args.ready_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
