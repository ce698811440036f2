"""A null pyfuse3 file system: the ceiling of any pyfuse3 write and read path on a machine.

    python -m mosafs.bench.nullfs MOUNTPOINT [--ready-file F] [--allow-other]

The root directory holds one regular file, `data`. `write` discards the bytes and answers
their length (the size grows to the end of the write); `read` answers zero bytes up to the
size; `getattr` reports the size; opening with O_TRUNC (or a truncate) sets the size. It
runs like `mosafs mount` (mosafs/client/main.py): pyfuse3 on trio, one task per request,
pyfuse3's default options plus fsname/subtype, no writeback cache, `keep_cache=False` on
open, the same attribute timeout, and it answers extended attributes (the kernel asks for
`security.capability` around writes, as it does on the mosafs mount).

Request counts and sizes are readable as JSON in the `user.nullfs.stats` attribute of
`data` (the benchmark reads them before and after each measurement) and are printed to
stderr at exit. `--writeback-cache` and `--no-xattrs` are for experiments only.

SIGINT/SIGTERM unmount and exit. Once mounted, the ready file (if given) gets
{"pid", "address", "mountpoint"} like every mosafs daemon's.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import stat
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyfuse3
import trio

ROOT = pyfuse3.ROOT_INODE
FILE_INODE = ROOT + 1
FILE_NAME = b"data"
STATS_XATTR = b"user.nullfs.stats"
ATTR_TIMEOUT = 1.0  # mosafs.client.files.ClientConfig.attr_timeout


class NullOperations(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False  # as mosafs.client.operations.Operations

    def __init__(self, *, writeback_cache: bool = False, xattrs: bool = True) -> None:
        super().__init__()
        # Experiments only (the benchmark uses the defaults, which match the mosafs client).
        self.enable_writeback_cache = writeback_cache
        self.xattrs = xattrs
        self.size = 0
        now = time.time_ns()
        self.times = now
        self._zeros = bytes(1 << 20)
        self.counts: Counter[str] = Counter()
        self.write_bytes = 0
        self.read_bytes = 0
        self.write_max = 0
        self.read_max = 0
        self.write_min = 0
        self.read_min = 0

    # -- attributes --------------------------------------------------------------------------

    def _entry(self, inode: int) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        if inode == ROOT:
            entry.st_mode = stat.S_IFDIR | 0o755
            entry.st_nlink = 2
            entry.st_size = 0
        else:
            entry.st_mode = stat.S_IFREG | 0o644
            entry.st_nlink = 1
            entry.st_size = self.size
        entry.st_uid = os.getuid()
        entry.st_gid = os.getgid()
        entry.st_blksize = 1 << 17
        entry.st_blocks = (entry.st_size + 511) // 512
        entry.st_atime_ns = entry.st_mtime_ns = entry.st_ctime_ns = self.times
        entry.generation = 0
        entry.entry_timeout = ATTR_TIMEOUT
        entry.attr_timeout = ATTR_TIMEOUT
        return entry

    def _check(self, inode: int) -> None:
        if inode not in (ROOT, FILE_INODE):
            raise pyfuse3.FUSEError(errno.ENOENT)

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        self.counts["getattr"] += 1
        self._check(inode)
        return self._entry(inode)

    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: Any = None) -> pyfuse3.EntryAttributes:
        self.counts["lookup"] += 1
        if parent_inode != ROOT or name != FILE_NAME:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._entry(FILE_INODE)

    async def setattr(self, inode: int, attr: Any, fields: Any, fh: Any,
                      ctx: Any) -> pyfuse3.EntryAttributes:
        self.counts["setattr"] += 1
        self._check(inode)
        if fields.update_size:
            if inode != FILE_INODE:
                raise pyfuse3.FUSEError(errno.EISDIR)
            self.size = attr.st_size
        return self._entry(inode)

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = 4096
        data.f_blocks = data.f_bfree = data.f_bavail = 1 << 30
        data.f_files = 2
        data.f_ffree = data.f_favail = 0
        data.f_namemax = 255
        return data

    # -- the directory -----------------------------------------------------------------------

    async def opendir(self, inode: int, ctx: Any) -> int:
        if inode != ROOT:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return ROOT

    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        if start_id == 0:
            pyfuse3.readdir_reply(token, FILE_NAME, self._entry(FILE_INODE), 1)

    async def releasedir(self, fh: int) -> None:
        return None

    # -- the file ----------------------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        self.counts["open"] += 1
        if inode != FILE_INODE:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if flags & os.O_TRUNC:
            self.size = 0
        return pyfuse3.FileInfo(fh=inode, keep_cache=False)

    # pyfuse3 takes any buffer: a view of one zero buffer costs no copy per read.
    async def read(self, fh: int, off: int, size: int) -> memoryview:  # type: ignore[override]
        n = max(0, min(size, self.size - off))
        self.counts["read"] += 1
        self.read_bytes += n
        self.read_max = max(self.read_max, size)
        self.read_min = min(self.read_min, size) if self.read_min else size
        if n > len(self._zeros):
            self._zeros = bytes(n)
        return memoryview(self._zeros)[:n]

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        n = len(buf)
        self.counts["write"] += 1
        self.write_bytes += n
        self.write_max = max(self.write_max, n)
        self.write_min = min(self.write_min, n) if self.write_min else n
        if off + n > self.size:
            self.size = off + n
        return n

    async def flush(self, fh: int) -> None:
        self.counts["flush"] += 1

    async def fsync(self, fh: int, datasync: bool) -> None:
        self.counts["fsync"] += 1

    async def release(self, fh: int) -> None:
        self.counts["release"] += 1

    # -- extended attributes -----------------------------------------------------------------

    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        if name == STATS_XATTR:
            return json.dumps(self.stats()).encode()
        self.counts["getxattr"] += 1
        # ENOSYS makes the kernel stop asking for any attribute (the stats then come from
        # the log at exit): only for the --no-xattrs experiment.
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR if self.xattrs else errno.ENOSYS)

    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        return [STATS_XATTR]

    def stats(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "requests": dict(self.counts),
            "write_bytes": self.write_bytes,
            "write_min": self.write_min,
            "write_max": self.write_max,
            "read_bytes": self.read_bytes,
            "read_min": self.read_min,
            "read_max": self.read_max,
        }


def read_stats(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The null file system's counters, read through the mount (PATH: its `data` file)."""
    return dict(json.loads(os.getxattr(path, STATS_XATTR.decode())))


async def _serve(ops: NullOperations, mountpoint: str, allow_other: bool,
                 ready_file: str | None) -> None:
    await serve_ops(ops, "mosafs-null", mountpoint, allow_other, ready_file,
                    lambda: print(json.dumps(ops.stats()), file=sys.stderr, flush=True))


async def serve_ops(ops: pyfuse3.Operations, name: str, mountpoint: str, allow_other: bool,
                    ready_file: str | None, at_exit: Callable[[], None] | None) -> None:
    """Serve OPS at MOUNTPOINT as `mosafs mount` serves its operations, until a signal."""
    from mosafs.procutil import serving

    options = set(pyfuse3.default_options)  # as mosafs.client.main._serve
    options |= {f"fsname={name}", f"subtype={name}"}
    if allow_other:
        options.add("allow_other")
    pyfuse3.init(ops, mountpoint, options)
    try:
        async with trio.open_nursery() as nursery:
            serving(ready_file, address=mountpoint, mountpoint=mountpoint)
            nursery.start_soon(_terminate_on_signal)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()
    finally:
        pyfuse3.close(unmount=True)
        if at_exit is not None:
            at_exit()


async def _terminate_on_signal() -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            pyfuse3.terminate()
            return


def mount_parser(name: str, description: str) -> argparse.ArgumentParser:
    """The command line every null file system takes (python -m mosafs.bench.NAME)."""
    parser = argparse.ArgumentParser(prog=f"python -m mosafs.bench.{name}",
                                     description=description)
    parser.add_argument("mountpoint", help="an existing empty directory")
    parser.add_argument("--ready-file", help="JSON {pid, address, mountpoint} once mounted")
    parser.add_argument("--allow-other", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = mount_parser("nullfs", "Mount the null pyfuse3 file system.")
    parser.add_argument("--writeback-cache", action="store_true",
                        help="experiment: ask for the kernel's writeback cache")
    parser.add_argument("--no-xattrs", action="store_true",
                        help="experiment: answer getxattr with ENOSYS (the kernel stops asking)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.mountpoint):
        print(f"mount point {args.mountpoint} is not a directory", file=sys.stderr)
        return 2
    ops = NullOperations(writeback_cache=args.writeback_cache, xattrs=not args.no_xattrs)
    trio.run(_serve, ops, os.path.abspath(args.mountpoint), args.allow_other, args.ready_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
