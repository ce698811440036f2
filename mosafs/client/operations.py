"""The pyfuse3 handlers: the only place that speaks FUSE.

Each handler converts names and attributes, calls the FileSystem, and turns a mosafs error
into FUSEError(errno). An exception escaping a pyfuse3 handler tears the mount down, so
anything else (a bug) is logged with its traceback and answered with EIO. `init` and
`forget` never raise.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import logging
import math
import os
import stat
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

import pyfuse3
import trio

from mosafs import errors
from mosafs._proto import manager_pb2 as mpb
from mosafs.client import acting
from mosafs.client.files import FileSystem
from mosafs.client.files.attrcache import TtlDict
from mosafs.client.files.listing import Listing

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, Any]])
BLOCK = 512
_KINDS = {
    mpb.FILE_KIND_DIRECTORY: stat.S_IFDIR,
    mpb.FILE_KIND_REGULAR: stat.S_IFREG,
    mpb.FILE_KIND_SYMLINK: stat.S_IFLNK,
    mpb.FILE_KIND_FIFO: stat.S_IFIFO,
    mpb.FILE_KIND_SOCKET: stat.S_IFSOCK,
    mpb.FILE_KIND_BLOCK_DEVICE: stat.S_IFBLK,
    mpb.FILE_KIND_CHAR_DEVICE: stat.S_IFCHR,
}
_KIND_OF = {mode: kind for kind, mode in _KINDS.items() if kind != mpb.FILE_KIND_DIRECTORY}
# The times the manager stores: +-9223372036 s, 1677-09-21 .. 2262-04-11 (docs/metadata.md,
# "Attribute values"). The kernel passes any 64-bit seconds (`touch -d 1000-01-01`); like
# Linux for every file system of a narrower range (timestamp_truncate), they are clamped.
_TIME_NS_MAX = ((1 << 63) - 1) // 10**9 * 10**9


def _clamp_time(ns: int) -> int:
    return min(max(ns, -_TIME_NS_MAX), _TIME_NS_MAX)


# Inodes and names the kernel may keep for longer than the attribute timeout (while the
# caches are coherent): at most this many of each are tracked, so that they can be taken
# back; past it the kernel is given the attribute timeout.
MAX_LONG = 200_000

# Handlers without a request context act as the process that opened the handle.
_FILE_HANDLE_OPS = frozenset({"read", "write", "flush", "fsync", "release"})
_DIR_HANDLE_OPS = frozenset({"readdir", "releasedir"})


def _set_acting(method_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    ctx: Any = kwargs.get("ctx", args[-1] if args else None)
    if hasattr(ctx, "uid") and hasattr(ctx, "pid"):
        acting.ACTING.set(acting.of_request(ctx.uid, ctx.gid, ctx.pid))
    elif method_name in _FILE_HANDLE_OPS and len(args) > 1:
        acting.ACTING.set(args[0].handle_acting.get(args[1]))
    elif method_name in _DIR_HANDLE_OPS and len(args) > 1:
        acting.ACTING.set(args[0].dir_acting.get(args[1]))
    else:
        acting.ACTING.set(None)


def _errno_mapped(method: F) -> F:
    @functools.wraps(method)
    async def handler(*args: Any, **kwargs: Any) -> Any:
        _set_acting(method.__name__, args, kwargs)
        try:
            return await method(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except errors.MosafsError as exc:
            log.debug("%s: %s", method.__name__, exc)
            raise pyfuse3.FUSEError(exc.errno) from None
        except Exception:
            log.exception("bug in FUSE handler %s", method.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return handler  # type: ignore[return-value]


def _decode(name: bytes) -> str:
    try:
        return os.fsdecode(name)
    except UnicodeDecodeError:
        raise errors.InvalidArgument("file names must be valid UTF-8") from None


class Operations(pyfuse3.Operations):
    supports_dot_lookup = False
    # Off by default: with the kernel's writeback cache the kernel trusts its own size and
    # mtime of a regular file for good, so a file another mount changed would keep its old
    # size here (no close-to-open across clients). `mosafs mount --writeback-cache` turns it
    # on for a mount that is the only writer of its files: small writes get much faster.
    enable_writeback_cache = False

    def __init__(self, fs: FileSystem, *, attr_timeout: float = 1.0,
                 writeback_cache: bool = False) -> None:
        super().__init__()
        self.enable_writeback_cache = writeback_cache
        self.fs = fs
        self.attr_timeout = attr_timeout
        self._dirs: dict[int, tuple[int, Listing]] = {}  # fh -> (inode, entries)
        self._next_dir = 1
        # inode -> the file version whose attributes the kernel was last given
        # (Plain dicts emptied when full, not LRU caches: set for every entry of every
        # listing, an LRU's ordering was a tenth of the mount's CPU of an `ls -l`; an
        # entry lost that way only forgoes an invalidation the kernel's attribute timeout
        # makes anyway.)
        self._told: TtlDict[int, int] = TtlDict(100_000, math.inf)
        # inode -> the version whose pages the kernel's page cache may hold: the version the
        # last open handed out (pages of an older one were dropped at that open).
        self._paged: TtlDict[int, int] = TtlDict(100_000, math.inf)
        # fh -> inode of every handle open for writing: what a stopping mount waits for
        # (their applications close them, and so commit them).
        self._writing: dict[int, int] = {}
        # fh -> the ids of the process that opened it: what read, write and release act as
        self.handle_acting: dict[int, acting.Acting | None] = {}
        self.dir_acting: dict[int, acting.Acting | None] = {}
        self.stopping = False  # set at SIGTERM: no new opens for writing
        # What the kernel was given for longer than the attribute timeout (coherent caches,
        # mosafs.client.files.coherence): taken back when another mount changes it, or
        # all of it when coherence is lost.
        # Each until when (time.monotonic) the kernel may keep it.
        self._long_inodes = _Held()
        self._long_names = _Held()
        # Invalidations in worker threads now, and the event set when the last one ends
        # once the mount is ending (end_invalidations).
        self._invalidating = 0
        self._quiet: trio.Event | None = None

    # -- coherent caches -----------------------------------------------------------------------

    def keep_coherent(self) -> None:
        """Keep the file system's caches coherent, and the kernel's with them."""
        coherence = self.fs.keep_coherent()
        if coherence is not None:
            coherence.on_changes = self._changed
            coherence.on_lost = self._lost

    async def _changed(self, inodes: Iterable[int],
                       names: Iterable[tuple[int, str]] = ()) -> None:
        """INODES and NAMES changed (other mounts or the manager did it, or this mount in a
        way the kernel does not see: a commit, an extended attribute's ctime): the kernel
        forgets what it holds of them for long (what it holds for the attribute timeout
        ends by itself)."""
        drop_inodes = [i for i in inodes if self._long_inodes.pop(i, None) is not None]
        drop_names = [n for n in names if self._long_names.pop(n, None) is not None]
        if drop_inodes or drop_names:
            await self._tell_kernel(_invalidate, drop_inodes, drop_names)

    async def _committed(self) -> None:
        """After a flush, fsync or release: the files it committed (size, times, version)."""
        await self._changed(self.fs.take_committed())

    async def _lost(self) -> None:
        """Coherence lost (or the manager's change list restarted): the kernel forgets
        everything it was given for long."""
        inodes, names = list(self._long_inodes), list(self._long_names)
        self._long_inodes.clear()
        self._long_names.clear()
        if inodes or names:
            await self._tell_kernel(_invalidate, inodes, names)

    async def _tell_kernel(self, invalidation: Callable[..., None], *args: Any) -> None:
        """INVALIDATION(*ARGS) in a worker thread (pyfuse3: it blocks until the requests it
        waits on are answered, which the event loop must stay free to do); nothing once the
        mount is ending (the unmount drops every cache anyway)."""
        if self._quiet is not None:
            return
        self._invalidating += 1
        try:
            await trio.to_thread.run_sync(invalidation, *args)
        finally:
            self._invalidating -= 1
            if self._quiet is not None and not self._invalidating:
                self._quiet.set()

    async def end_invalidations(self) -> None:
        """Before the FUSE loop ends: no invalidation starts any more, and those in flight
        end while the loop still answers requests. The kernel takes a directory's lock for
        an entry's invalidation, and an application's create in that directory holds it
        until its request is answered: had the loop ended first, that request would never
        be answered, the invalidation's thread would wait in the kernel for good, and with
        it the mount's process (it never exits) and the application."""
        self._quiet = trio.Event()
        if self._invalidating:
            log.info("stopping: waiting for %d cache invalidation(s) in flight",
                     self._invalidating)
            await self._quiet.wait()

    # -- stopping ------------------------------------------------------------------------------

    def open_for_writing(self) -> set[int]:
        """The inodes that some handle has open for writing."""
        return set(self._writing.values())

    def _admit(self, flags: int) -> None:
        """A stopping mount opens nothing new for writing: its wait for open files must
        end, and a file opened now would likely be cut off before it is closed. EROFS
        tells the application that writing is over here (reads go on)."""
        if self.stopping and flags & os.O_ACCMODE != os.O_RDONLY:
            log.info("open for writing refused: the mount is stopping")
            raise pyfuse3.FUSEError(errno.EROFS)

    def _opened(self, fh: int, inode: int, flags: int) -> None:
        self.handle_acting[fh] = acting.ACTING.get()
        if flags & os.O_ACCMODE != os.O_RDONLY:
            self._writing[fh] = inode

    def _entry(self, attr: mpb.Attr, parent: int = 0, name: str = "") -> pyfuse3.EntryAttributes:
        """Attributes for the kernel (found as NAME in PARENT, where given); remembers
        which version of the file it was told, and what it may keep for long."""
        entry = pyfuse3.EntryAttributes()
        kind = _KINDS.get(attr.kind, stat.S_IFREG)
        self._told[attr.inode] = attr.version
        entry.st_ino = attr.inode
        entry.st_mode = kind | (attr.mode & 0o7777)
        entry.st_nlink = attr.nlink
        entry.st_uid = attr.uid
        entry.st_gid = attr.gid
        entry.st_size = attr.size
        entry.st_rdev = attr.rdev
        # Python, stdio and cp size their buffers by st_blksize: 1 MiB, the largest FUSE
        # write request, makes them issue writes that large.
        entry.st_blksize = 1 << 20
        entry.st_blocks = (attr.size + BLOCK - 1) // BLOCK
        entry.st_atime_ns = attr.atime_ns
        entry.st_mtime_ns = attr.mtime_ns
        entry.st_ctime_ns = attr.ctime_ns
        entry.generation = 0
        timeout = self.fs.kernel_timeout(attr.inode)
        entry.entry_timeout = entry.attr_timeout = self.attr_timeout
        if timeout > self.attr_timeout:
            until = time.monotonic() + timeout
            if self._long_inodes.track(attr.inode, until):
                entry.attr_timeout = timeout
                if parent and self._long_names.track((parent, name), until):
                    entry.entry_timeout = timeout
        return entry

    # -- never raise ---------------------------------------------------------------------------

    def init(self) -> None:
        log.info("file system initialised")

    async def forget(self, inode_list: Any) -> None:
        # Only the `.versions` views keep lookup counts (real inodes are the manager's).
        try:
            for inode, count in inode_list:
                self.fs.forget(inode, count)
                self._long_inodes.pop(inode, None)
        except Exception:
            log.exception("bug in forget")

    # -- namespace -----------------------------------------------------------------------------

    @_errno_mapped
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        text = _decode(name)
        return self._entry(await self.fs.lookup(parent_inode, text), parent_inode, text)

    @_errno_mapped
    async def getattr(self, inode: int, ctx: Any) -> pyfuse3.EntryAttributes:
        return self._entry(await self.fs.getattr(inode))

    @_errno_mapped
    async def setattr(self, inode: int, attr: Any, fields: Any, fh: Any,
                      ctx: Any) -> pyfuse3.EntryAttributes:
        changes: dict[str, int] = {}
        if fields.update_mode:
            changes["mode"] = attr.st_mode & 0o7777
        if fields.update_uid:
            changes["uid"] = attr.st_uid
        if fields.update_gid:
            changes["gid"] = attr.st_gid
        if fields.update_atime:
            changes["atime_ns"] = _clamp_time(attr.st_atime_ns)
        if fields.update_mtime:
            changes["mtime_ns"] = _clamp_time(attr.st_mtime_ns)
        size = attr.st_size if fields.update_size else None
        return self._entry(await self.fs.setattr(inode, size, **changes))

    @_errno_mapped
    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: Any) -> pyfuse3.EntryAttributes:
        text = _decode(name)
        attr = await self.fs.mkdir(parent_inode, text, mode & 0o7777, ctx.uid, ctx.gid)
        return self._entry(attr, parent_inode, text)

    @_errno_mapped
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.unlink(parent_inode, _decode(name))

    @_errno_mapped
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.rmdir(parent_inode, _decode(name))

    @_errno_mapped
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int,
                     name_new: bytes, flags: int, ctx: Any) -> None:
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        await self.fs.rename(parent_inode_old, _decode(name_old), parent_inode_new,
                             _decode(name_new), bool(flags & pyfuse3.RENAME_NOREPLACE))

    @_errno_mapped
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        info = await self.fs.statfs()
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = 4096
        data.f_blocks = info.capacity_bytes // 4096
        data.f_bfree = data.f_bavail = info.free_bytes // 4096
        data.f_files = info.files + 1_000_000
        data.f_ffree = data.f_favail = 1_000_000
        data.f_namemax = 255
        return data

    # -- directories ---------------------------------------------------------------------------

    @_errno_mapped
    async def opendir(self, inode: int, ctx: Any) -> int:
        listing = await self.fs.readdir(inode)  # a snapshot for this handle's readdir calls
        fh = self._next_dir
        self._next_dir += 1
        self._dirs[fh] = (inode, listing)
        self.dir_acting[fh] = acting.ACTING.get()
        return fh

    @_errno_mapped
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        inode, listing = self._dirs.get(fh, (0, Listing()))
        index = start_id
        while (entry := await listing.entry(index)) is not None:
            if self.fs.listing_current(inode, listing):
                attr = self._entry(self.fs.listed(entry), inode, entry.name)
            else:
                # A name of the directory changed here since these entries were read:
                # the kernel must not keep this one as a name (it may be gone).
                attr = self._entry(self.fs.listed(entry))
                attr.entry_timeout = 0
            if not pyfuse3.readdir_reply(token, os.fsencode(entry.name), attr, index + 1):
                break
            self.fs.entry_handed(entry.attr.inode)  # readdirplus counts as a lookup
            index += 1

    @_errno_mapped
    async def releasedir(self, fh: int) -> None:
        inode, listing = self._dirs.pop(fh, (0, Listing()))
        listing.abandoned = True
        self.dir_acting.pop(fh, None)
        self.fs.release_listing(inode)

    # -- files -----------------------------------------------------------------------------

    @_errno_mapped
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: Any) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        self._admit(flags)
        text = _decode(name)
        fh, attr = await self.fs.create_file(parent_inode, text, mode & 0o7777, flags,
                                             ctx.uid, ctx.gid)
        self._opened(fh, attr.inode, flags)
        return (pyfuse3.FileInfo(fh=fh, keep_cache=False),
                self._entry(attr, parent_inode, text))

    @_errno_mapped
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        self._admit(flags)
        fh, version = await self.fs.open(inode, flags)
        self._opened(fh, inode, flags)
        told = self._told.get(inode)
        if told is not None and told != version:
            # Another mount committed since the kernel cached this file's attributes: make
            # it ask again before it trusts the old size (close-to-open across clients).
            await self._tell_kernel(pyfuse3.invalidate_inode, inode, True)
            self._told[inode] = version
        # Cached pages stay only if they are of the version this open hands out (a re-read
        # of an unchanged file comes from memory); otherwise the kernel drops them, so a
        # reader sees the newest committed version, whoever wrote it. Size and mtime alone
        # cannot tell (cp -p and rsync keep both), hence the version.
        # While a write session is open (this handle's own, or one whose last close failed
        # and whose release is still on its way), the cached pages may hold bytes that no
        # version has: none is kept, and none counts as the version's until it ends.
        if self.fs.has_session(inode):
            self._paged.pop(inode, None)
            return pyfuse3.FileInfo(fh=fh, keep_cache=False)
        keep = self._paged.get(inode) == version
        self._paged[inode] = version
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep)

    @_errno_mapped
    async def read(self, fh: int, off: int, size: int) -> bytes:
        return await self.fs.read(fh, off, size)

    @_errno_mapped
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return await self.fs.write(fh, off, buf)

    @_errno_mapped
    async def flush(self, fh: int) -> None:
        try:
            await self.fs.flush(fh)
        finally:
            await self._committed()

    @_errno_mapped
    async def fsync(self, fh: int, datasync: bool) -> None:
        try:
            await self.fs.flush(fh, fsync=True)
        finally:
            await self._committed()

    @_errno_mapped
    async def release(self, fh: int) -> None:
        try:
            await self.fs.release(fh)  # the last writer's release may commit
        finally:
            inode = self._writing.pop(fh, None)
            if inode is not None:
                # The kernel cached the pages this handle wrote. A commit gives the file a
                # new version, so the next open drops them anyway; a commit that failed
                # leaves the version as it was, and its pages must not be kept either.
                self._paged.pop(inode, None)
            self.handle_acting.pop(fh, None)
            await self._committed()

    # -- symlinks, special files, hard links ---------------------------------------------------

    @_errno_mapped
    async def symlink(self, parent_inode: int, name: bytes, target: bytes,
                      ctx: Any) -> pyfuse3.EntryAttributes:
        text = _decode(name)
        return self._entry(await self.fs.symlink(parent_inode, text, target, ctx.uid, ctx.gid),
                           parent_inode, text)

    @_errno_mapped
    async def readlink(self, inode: int, ctx: Any) -> bytes:
        return await self.fs.readlink(inode)

    @_errno_mapped
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,
                    ctx: Any) -> pyfuse3.EntryAttributes:
        # Device nodes too: root-run tools (tar, rsync, image unpacking) make them, and
        # the kernel checked CAP_MKNOD before asking; they are metadata here, opened by the
        # kernel on the machine that opens them.
        kind = _KIND_OF.get(stat.S_IFMT(mode))
        if kind is None:  # no such file type (the kernel refuses these itself)
            raise pyfuse3.FUSEError(errno.EINVAL)
        text = _decode(name)
        return self._entry(await self.fs.mknod(parent_inode, text, kind, mode & 0o7777,
                                               ctx.uid, ctx.gid, rdev), parent_inode, text)

    @_errno_mapped
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes,
                   ctx: Any) -> pyfuse3.EntryAttributes:
        text = _decode(new_name)
        return self._entry(await self.fs.link(inode, new_parent_inode, text),
                           new_parent_inode, text)

    # -- extended attributes -------------------------------------------------------------------

    @_errno_mapped
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        return await self.fs.getxattr(inode, _decode(name))

    @_errno_mapped
    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        return [os.fsencode(n) for n in await self.fs.listxattr(inode)]

    @_errno_mapped
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Any) -> None:
        await self.fs.setxattr(inode, _decode(name), value)
        await self._changed([inode])

    @_errno_mapped
    async def removexattr(self, inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.removexattr(inode, _decode(name))
        await self._changed([inode])


class _Held(dict[Any, float]):
    """What the kernel may keep for long, each with until when (time.monotonic)."""

    def __init__(self) -> None:
        super().__init__()
        self._prune_at = 0.0

    def track(self, key: Any, until: float) -> bool:
        """Note that the kernel may keep KEY until UNTIL; False where MAX_LONG are held
        already. Those past their time are let go first (the kernel let them go too), at
        most once a second: a full scan per entry handed out would cost more than the
        kernel's asking again."""
        if len(self) >= MAX_LONG and key not in self:
            now = time.monotonic()
            if now < self._prune_at:
                return False
            self._prune_at = now + 1.0
            for old in [k for k, t in self.items() if t <= now]:
                del self[old]
            if len(self) >= MAX_LONG:
                return False
        self[key] = max(until, self.get(key, 0.0))
        return True


def _invalidate(inodes: Sequence[int], names: Sequence[tuple[int, str]]) -> None:
    """In a worker thread (pyfuse3: the calls block until a related request has been
    answered, which the event loop must stay free to do): the kernel forgets the
    attributes of INODES and the entries NAMES. One it no longer holds is no error."""
    for inode in inodes:
        with contextlib.suppress(OSError):
            pyfuse3.invalidate_inode(inode, True)
    for parent, name in names:
        with contextlib.suppress(OSError):
            pyfuse3.invalidate_entry(parent, os.fsencode(name))


def _check_all_handlers_mapped() -> None:
    """Every async handler defined here goes through _errno_mapped (except forget; the
    private coroutines are the coherence's callbacks, and end_invalidations the stop's
    step, not handlers)."""
    for name, member in vars(Operations).items():
        if inspect.iscoroutinefunction(member) and \
                name not in ("forget", "end_invalidations") and not name.startswith("_"):
            assert hasattr(member, "__wrapped__"), f"{name} is not errno-mapped"


_check_all_handlers_mapped()
