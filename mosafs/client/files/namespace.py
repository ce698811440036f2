"""The namespace half of the file system as the FUSE layer sees it: attributes, lookups,
listings, and the calls that make, link, remove and rename names. A part of FileSystem
(mosafs.client.files.filesystem), which provides what is declared here; knows nothing of
pyfuse3, raises mosafs.errors classes."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from mosafs import errors
from mosafs._proto import manager_pb2 as mpb
from mosafs.capability import X, posix_allows
from mosafs.client import acting
from mosafs.client.files.attrcache import AttrCache
from mosafs.client.files.context import ClientContext
from mosafs.client.files.listing import Listing
from mosafs.client.files.statahead import StatAhead
from mosafs.client.files.versions import VERSIONS, VersionView, is_virtual

if TYPE_CHECKING:
    from mosafs.client.files.writer import WriteSession

T = TypeVar("T")

Attr = mpb.Attr
DirEntry = mpb.DirEntry
StatFs = mpb.StatFsResponse


class Namespace:
    """Names and attributes of FileSystem (attributes set by FileSystem.__init__)."""

    ctx: ClientContext
    _sessions: dict[int, WriteSession]
    _cache: AttrCache
    _ahead: StatAhead
    versions: VersionView
    manager: Any  # the client of the manager (client.rpc): ExtendedAttributes' property

    def _used(self) -> None:
        raise NotImplementedError

    async def truncate(self, inode: int, size: int) -> None:
        raise NotImplementedError

    def _overlay(self, attr: Attr) -> Attr:
        """Attributes as this mount sees them: uncommitted writes change size and mtime."""
        session = self._sessions.get(attr.inode)
        if session is not None and session.dirty:
            attr = Attr(**{f.name: getattr(attr, f.name) for f in Attr.DESCRIPTOR.fields})
            attr.size = session.size
            attr.mtime_ns = attr.ctime_ns = session.mtime_ns
        return attr

    @staticmethod
    def _writable(*inodes: int) -> None:
        """Changes inside a `.versions` view are refused (EROFS)."""
        if any(is_virtual(i) for i in inodes):
            raise errors.ReadOnly(f"{VERSIONS} shows older versions read-only; restore one "
                                  f"with `mosafs restore`")

    async def lookup(self, parent: int, name: str) -> Attr:
        if is_virtual(parent):
            return await self.versions.lookup(parent, name)
        if name == VERSIONS:
            return await self.versions.lookup_root(await self.getattr(parent))
        self._used()
        inode = self._cache.child(parent, name)
        attr = self._cache.attr(inode) if inode is not None else None
        if attr is None:
            if inode is None and self._cache.absent(parent, name) and \
                    _may_search(self._cache.attr(parent), acting.ACTING.get()):
                raise errors.NotFound(f"no {name!r} in directory {parent}")
            found, since = await self._asked(self.manager.lookup(parent, name))
            attr = self._cache.put_entry(parent, name, found, since)
            self._ahead.found(parent)
        return self._overlay(attr)

    async def getattr(self, inode: int) -> Attr:
        if is_virtual(inode):
            return await self.versions.attr(inode)
        self._used()
        attr = self._cache.attr(inode)
        if attr is None:
            try:
                attr = self._cache.put(*await self._asked(self.manager.getattr(inode)))
            except errors.NotFound:
                attr = self._orphan_attr(inode)
        return self._overlay(attr)

    def _orphan_attr(self, inode: int) -> Attr:
        """Attributes of an open file whose last name is gone (unlinked or renamed over):
        it stays usable through its handles until the last close, with nlink 0 (POSIX)."""
        last = self._cache.last(inode)
        if last is None:
            raise errors.NotFound(f"inode {inode} does not exist")
        orphan = Attr()
        orphan.CopyFrom(last)
        orphan.nlink = 0
        return orphan

    async def setattr(self, inode: int, size: int | None, **fields: int) -> Attr:
        self._writable(inode)
        if size is not None:
            await self.truncate(inode, size)
        session = self._sessions.get(inode)
        if session is not None and "mtime_ns" in fields:
            # utime after writing (cp -p, tar, rsync): the commit at close keeps this mtime.
            session.mtime_ns = fields["mtime_ns"]
        if fields:
            try:
                self._cache.put(*await self._asked(self.manager.setattr(inode, **fields)))
            except errors.NotFound:
                # Unlinked while open: the change lives as long as the handles do.
                orphan = self._orphan_attr(inode)
                for name, value in fields.items():
                    setattr(orphan, name, value)
                return self._overlay(self._cache.put(orphan))
        return await self.getattr(inode)

    async def readdir(self, inode: int) -> Listing:
        """The entries of a directory, the first page at once and the rest as it comes
        (mosafs.client.files.listing); release_listing(inode) when its handle goes."""
        if is_virtual(inode):
            return Listing(await self.versions.listing(inode))
        self._used()
        cached = self._cache.listing(inode)
        if cached is not None:
            return Listing(cached, edits=self._cache.edits)
        mark = self._cache.mark()
        pages = self.manager.readdir_pages(inode)
        first = await anext(pages)  # errors (not a directory, refused) come at opendir
        listing = Listing(first, done=False, edits=mark.edits)
        self.ctx.spawn(listing.fill, pages,
                       lambda entries: self._cache.put_listing(inode, entries, mark))
        return listing

    def listing_current(self, inode: int, listing: Listing) -> bool:
        """Whether no name of directory INODE changed here since LISTING was read: its
        entries may then be kept by the kernel (else one could be a name renamed or
        removed since, docs/client.md "Directory listings")."""
        return is_virtual(inode) or not self._cache.edited_since(inode, listing.edits)

    def listed(self, entry: DirEntry) -> Attr:
        """ENTRY's attributes to hand the kernel: the attribute cache may hold a newer state
        than the listing (a setattr since), and never the older one is given."""
        return self._overlay(self._cache.attr(entry.attr.inode) or entry.attr)

    def release_listing(self, inode: int) -> None:
        if is_virtual(inode):
            self.versions.listing_closed()

    def entry_handed(self, inode: int) -> None:
        """The kernel took a listed entry: one more reference to a view inode."""
        if is_virtual(inode):
            self.versions.nodes.looked_up(inode)

    def forget(self, inode: int, count: int) -> None:
        if is_virtual(inode):
            self.versions.nodes.forget(inode, count)

    async def mkdir(self, parent: int, name: str, mode: int, uid: int, gid: int) -> Attr:
        self._writable(parent)
        return await self._make(parent, name, self.manager.mkdir(parent, name, mode, uid, gid))

    async def symlink(self, parent: int, name: str, target: bytes, uid: int,
                      gid: int) -> Attr:
        self._writable(parent)
        return await self._make(parent, name,
                                self.manager.symlink(parent, name, target, uid, gid))

    async def readlink(self, inode: int) -> bytes:
        if is_virtual(inode):
            raise errors.InvalidArgument("not a symbolic link")
        return await self.manager.readlink(inode)

    async def mknod(self, parent: int, name: str, kind: int, mode: int, uid: int,
                    gid: int, rdev: int = 0) -> Attr:
        """A FIFO, socket or device node (RDEV: its device number), or an empty regular
        file (mknod(2) may make one)."""
        self._writable(parent)
        made = (self.manager.create(parent, name, mode, uid, gid, exclusive=True)
                if kind == mpb.FILE_KIND_REGULAR
                else self.manager.mknod(parent, name, kind, mode, uid, gid, rdev))
        return await self._make(parent, name, made)

    async def link(self, inode: int, new_parent: int, new_name: str) -> Attr:
        self._writable(inode, new_parent)
        return self._overlay(await self._make(
            new_parent, new_name, self.manager.link(inode, new_parent, new_name)))

    async def _asked(self, call: Coroutine[Any, Any, T]) -> tuple[T, int]:
        """CALL's answer, and the cache generation it was asked at (read before CALL, a
        coroutine, starts): an answer is kept long only if no change list taken since
        names what it is about (AttrCache.life)."""
        since = self._cache.generation
        return await call, since

    async def _make(self, parent: int, name: str, call: Coroutine[Any, Any, Attr]) -> Attr:
        """CALL makes (or links) NAME in PARENT: its answer, cached. The manager gave
        PARENT the new entry's ctime as its mtime and ctime, in the same transaction. A
        call that failed may have made the name all the same (its answer lost on the
        way): what the cache knew of PARENT's names is dropped."""
        try:
            attr, since = await self._asked(call)
        except BaseException:
            self._cache.drop_entry(parent, name)
            raise
        return self._cache.entry_made(parent, name, attr, since=since,
                                      subdir=attr.kind == mpb.FILE_KIND_DIRECTORY)

    async def unlink(self, parent: int, name: str) -> None:
        self._writable(parent)
        self._not_the_view(name)
        self._cache.drop_entry(parent, name)
        await self.manager.unlink(parent, name)
        self._cache.drop_entry(parent, name)  # a lookup may have refilled it meanwhile

    async def rmdir(self, parent: int, name: str) -> None:
        self._writable(parent)
        self._not_the_view(name)
        self._cache.drop_entry(parent, name)
        await self.manager.rmdir(parent, name)
        self._cache.drop_entry(parent, name)

    @staticmethod
    def _not_the_view(name: str) -> None:
        if name == VERSIONS:
            raise errors.ReadOnly(f"{VERSIONS} is the view of older versions: it cannot be "
                                  f"removed or renamed")

    async def rename(self, old_parent: int, old_name: str, new_parent: int, new_name: str,
                     no_replace: bool) -> None:
        self._writable(old_parent, new_parent)
        self._not_the_view(old_name)
        moved = self._cache.child(old_parent, old_name)
        try:
            await self.manager.rename(old_parent, old_name, new_parent, new_name, no_replace)
        finally:
            self._cache.drop_entry(old_parent, old_name)
            self._cache.drop_entry(new_parent, new_name)
            if moved is not None:
                self._cache.drop(moved)

    async def statfs(self) -> StatFs:
        return await self.manager.statfs()


def _may_search(directory: Attr | None, who: acting.Acting | None) -> bool:
    """Whether WHO (None: the mount itself) may look up names in DIRECTORY by its cached
    attributes: a missing name is answered here only to whom the manager would answer
    it, not to a process it would refuse (EACCES)."""
    if who is None or who[0] == 0:
        return True
    uid, gids = who
    return directory is not None and posix_allows(
        uid, gids, directory.uid, directory.gid, directory.mode, X, directory=True)
