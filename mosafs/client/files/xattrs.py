"""Extended attributes as the mount serves them: user.* ones stored by the manager, and
the read-only user.mosafs.* ones the mount makes up (the manager's address, a file's
version and dedupe figures). A part of FileSystem (mosafs.client.files.filesystem), which
provides what is declared here."""

from __future__ import annotations

from typing import Any

from mosafs import errors
from mosafs._proto import manager_pb2 as mpb
from mosafs.client.files.attrcache import AttrCache
from mosafs.client.files.context import ClientContext
from mosafs.client.files.versions import is_virtual

USER_XATTR = "user."
MOSAFS_XATTR = "user.mosafs."
MANAGER_XATTR = MOSAFS_XATTR + "manager"


class ExtendedAttributes:
    """getxattr, listxattr, setxattr and removexattr of FileSystem."""

    ctx: ClientContext
    _cache: AttrCache

    @property
    def manager(self) -> Any:  # FileSystem's too: the client of the manager (client.rpc)
        return self.ctx.manager

    async def getattr(self, inode: int) -> mpb.Attr:
        raise NotImplementedError

    @staticmethod
    def _writable(*inodes: int) -> None:
        raise NotImplementedError

    async def getxattr(self, inode: int, name: str) -> bytes:
        if name == MANAGER_XATTR:
            # How a client that works beside this mount finds its cluster (mosafs.checkpoint,
            # the admin commands: mosafs.admin.common.resolve): it may make names in this
            # directory that this mount does not see made, so it is no longer known whole.
            self._cache.forget_whole(inode)
        if name.startswith(MOSAFS_XATTR) or is_virtual(inode):
            values = await self._mosafs_xattrs(inode)
            if name not in values:
                raise errors.NoAttribute(f"no attribute {name}")
            return values[name].encode()
        if not name.startswith(USER_XATTR):
            raise errors.NoAttribute(f"no attribute {name}")
        return await self.manager.getxattr(inode, name)

    async def listxattr(self, inode: int) -> list[str]:
        if is_virtual(inode):
            return list(await self._mosafs_xattrs(inode))
        stored = await self.manager.listxattr(inode)
        return [*stored, *await self._mosafs_xattrs(inode)]

    async def setxattr(self, inode: int, name: str, value: bytes) -> None:
        self._writable(inode)
        self._check_xattr_name(name)
        await self.manager.setxattr(inode, name, value)
        self._cache.drop(inode)  # ctime

    async def removexattr(self, inode: int, name: str) -> None:
        self._writable(inode)
        self._check_xattr_name(name)
        await self.manager.removexattr(inode, name)
        self._cache.drop(inode)

    @staticmethod
    def _check_xattr_name(name: str) -> None:
        if name.startswith(MOSAFS_XATTR):
            raise errors.NotPermitted(f"{name} is a read-only mosafs attribute")
        if not name.startswith(USER_XATTR):
            raise errors.NotSupported(f"only user.* extended attributes are stored, not {name}")

    async def _mosafs_xattrs(self, inode: int) -> dict[str, str]:
        """The read-only user.mosafs.* attributes: the manager, and for a regular file its
        newest version and dedupe figures (DESIGN §9 `mosafs stats`)."""
        values = {MANAGER_XATTR: self.manager.address}
        if self.ctx.config.tls_dir:  # where admin commands find this cluster's certificates
            values[MOSAFS_XATTR + "tls"] = self.ctx.config.tls_dir
        if is_virtual(inode):
            return values
        attr = await self.getattr(inode)
        if attr.kind == mpb.FILE_KIND_REGULAR:
            values[MOSAFS_XATTR + "version"] = str(attr.version)
            if attr.version:
                stats = await self.manager.version_stats(inode)
                values.update({
                    MOSAFS_XATTR + "chunks": str(stats.chunks),
                    MOSAFS_XATTR + "shared_chunks": str(stats.shared_chunks),
                    MOSAFS_XATTR + "new_bytes": str(stats.new_bytes),
                    MOSAFS_XATTR + "base_version": str(stats.base_version),
                })
        return values
