"""The metadata store's extended attributes, and what a reopened store keeps of links,
symlinks and xattrs."""

from __future__ import annotations

import struct
from pathlib import Path

import lmdb
import pytest

from mosafs.errors import (
    AlreadyExists,
    InvalidArgument,
    NameTooLong,
    NoAttribute,
    NoSpace,
    NotFound,
    NotPermitted,
    NotSupported,
    ValueTooLarge,
)
from mosafs.manager.core import Manager
from mosafs.manager.metadata import ROOT_INODE, MetadataStore
from tests.unit.managers import FIFO, SOCK, MiB, consistent, new_file

# --- extended attributes ------------------------------------------------------------------

def test_xattr_set_get_list_remove(store: MetadataStore) -> None:
    f = store.create(ROOT_INODE, "f", 0o644)
    store.setxattr(f.inode, "user.b", b"\x00binary\xff")
    store.setxattr(f.inode, "user.a", b"")
    store.setxattr(f.inode, "user.é", b"x")
    assert store.getxattr(f.inode, "user.b") == b"\x00binary\xff"
    assert store.getxattr(f.inode, "user.a") == b""
    assert store.listxattr(f.inode) == ["user.a", "user.b", "user.é"]
    store.setxattr(f.inode, "user.b", b"new")
    assert store.getxattr(f.inode, "user.b") == b"new"
    store.removexattr(f.inode, "user.a")
    assert store.listxattr(f.inode) == ["user.b", "user.é"]
    with pytest.raises(NoAttribute):
        store.getxattr(f.inode, "user.a")
    with pytest.raises(NoAttribute):
        store.removexattr(f.inode, "user.a")
    # Another inode's attributes are its own.
    g = new_file(store, "g")
    assert store.listxattr(g) == []
    with pytest.raises(NoAttribute):
        store.getxattr(g, "user.b")
    assert store.getattr(f.inode).mtime_ns == f.mtime_ns  # xattrs change ctime only


def test_xattr_changes_update_ctime(store: MetadataStore) -> None:
    f = store.setattr(store.create(ROOT_INODE, "f", 0o644).inode, ctime_ns=1)
    store.setxattr(f.inode, "user.x", b"1")
    after_set = store.getattr(f.inode)
    assert after_set.ctime_ns > 1
    store.setattr(f.inode, ctime_ns=1)
    store.removexattr(f.inode, "user.x")
    assert store.getattr(f.inode).ctime_ns > 1
    store.setattr(f.inode, ctime_ns=1)
    with pytest.raises(NoAttribute):
        store.removexattr(f.inode, "user.x")
    assert store.getattr(f.inode).ctime_ns == 1  # a refusal changes nothing


def test_xattr_create_and_replace_flags(store: MetadataStore) -> None:
    f = new_file(store, "f")
    with pytest.raises(NoAttribute):
        store.setxattr(f, "user.k", b"v", replace=True)
    store.setxattr(f, "user.k", b"v1", create=True)
    with pytest.raises(AlreadyExists):
        store.setxattr(f, "user.k", b"v2", create=True)
    store.setxattr(f, "user.k", b"v3", replace=True)
    assert store.getxattr(f, "user.k") == b"v3"
    with pytest.raises(AlreadyExists):  # both flags: one of the two always fails (ext4)
        store.setxattr(f, "user.k", b"v4", create=True, replace=True)
    with pytest.raises(NoAttribute):
        store.setxattr(f, "user.other", b"v4", create=True, replace=True)
    assert store.listxattr(f) == ["user.k"]


@pytest.mark.parametrize("name, error", [
    ("", InvalidArgument),
    ("user.", InvalidArgument),
    ("user.a\0b", InvalidArgument),
    ("user.\ud800", InvalidArgument),
    ("user." + "x" * 251, NameTooLong),
    ("trusted.x", NotSupported),
    ("security.selinux", NotSupported),
    ("system.posix_acl_access", NotSupported),
    ("User.x", NotSupported),
    ("user.mosafs.version", NotPermitted),
])
def test_xattr_name_rules(store: MetadataStore, name: str, error: type[Exception]) -> None:
    f = new_file(store, "f")
    with pytest.raises(error):
        store.setxattr(f, name, b"v")
    with pytest.raises(error):
        store.removexattr(f, name)
    assert store.listxattr(f) == []


def test_xattr_reading_names(store: MetadataStore) -> None:
    f = new_file(store, "f")
    store.setxattr(f, "user." + "x" * 250, b"v")  # 255 bytes: the longest name
    assert store.getxattr(f, "user." + "x" * 250) == b"v"
    with pytest.raises(NoAttribute):  # the client's read-only names are never stored
        store.getxattr(f, "user.mosafs.version")
    with pytest.raises(NotSupported):
        store.getxattr(f, "trusted.x")
    with pytest.raises(NameTooLong):
        store.getxattr(f, "user." + "x" * 251)


def test_xattr_value_and_per_inode_limits(store: MetadataStore) -> None:
    f = new_file(store, "f")
    store.setxattr(f, "user.max", b"v" * 65536)
    with pytest.raises(ValueTooLarge, match="65536"):
        store.setxattr(f, "user.big", b"v" * 65537)
    # 1 MiB of names and values per inode: 15 more values of 64 KiB fit under it at first...
    for i in range(15):
        store.setxattr(f, f"user.v{i:02d}", b"v" * (65536 - 100))
    with pytest.raises(NoSpace, match="1048576"):
        store.setxattr(f, "user.one-more", b"v" * 2000)
    # ...a replaced value counts once, with its new size.
    store.setxattr(f, "user.max", b"v" * 65536)
    store.setxattr(f, "user.max", b"small")
    store.setxattr(f, "user.one-more", b"v" * 2000)
    assert len(store.listxattr(f)) == 17


def test_xattr_name_list_limit(store: MetadataStore) -> None:
    f = new_file(store, "f")
    # listxattr(2) returns at most 64 KiB of names, each with its NUL: 256 names of 255.
    for i in range(256):
        store.setxattr(f, f"user.{i:03d}" + "n" * 247, b"")
    with pytest.raises(NoSpace, match="names"):
        store.setxattr(f, "user.999" + "n" * 247, b"")
    assert len(store.listxattr(f)) == 256


def test_xattrs_on_every_kind(store: MetadataStore) -> None:
    inodes = [ROOT_INODE, store.mkdir(ROOT_INODE, "d", 0o755).inode, new_file(store, "f"),
              store.symlink(ROOT_INODE, "l", b"f").inode,
              store.mknod(ROOT_INODE, "p", FIFO, 0o600).inode,
              store.mknod(ROOT_INODE, "s", SOCK, 0o600).inode]
    for ino in inodes:
        store.setxattr(ino, "user.ino", str(ino).encode())
    for ino in inodes:
        assert store.listxattr(ino) == ["user.ino"]
        assert store.getxattr(ino, "user.ino") == str(ino).encode()
    for op in (lambda: store.setxattr(4242, "user.x", b""),
               lambda: store.getxattr(4242, "user.x"), lambda: store.listxattr(4242),
               lambda: store.removexattr(4242, "user.x"), lambda: store.listxattr(0)):
        with pytest.raises(NotFound):
            op()


def test_xattrs_go_away_with_their_inode(mgr: Manager) -> None:
    store = mgr.store
    d = store.mkdir(ROOT_INODE, "d", 0o755).inode
    e = store.mkdir(ROOT_INODE, "e", 0o755).inode
    f, g = new_file(store, "f"), new_file(store, "g")
    link = store.symlink(ROOT_INODE, "l", b"t").inode
    for ino in (d, e, f, g, link):
        store.setxattr(ino, "user.a", b"1")
        store.setxattr(ino, "user.b", b"2")
    store.unlink(ROOT_INODE, "f")  # a file's last link
    store.rmdir(ROOT_INODE, "d")
    store.rename(ROOT_INODE, "l", ROOT_INODE, "g")  # a file replaced by a rename
    store.mkdir(ROOT_INODE, "x", 0o755)
    store.rename(ROOT_INODE, "x", ROOT_INODE, "e")  # a directory replaced by a rename
    assert store.xattr_orphans() == []
    assert store.listxattr(link) == ["user.a", "user.b"]
    for ino in (d, e, f, g):
        with pytest.raises(NotFound):
            store.listxattr(ino)
    assert consistent(store)


def test_xattr_orphans_finds_damage(tmp_path: Path) -> None:
    path = tmp_path / "metadata.lmdb"
    with MetadataStore(path, map_size=64 * MiB) as store:
        f = new_file(store, "f")
        store.setxattr(f, "user.a", b"1")
        store.setxattr(f, "user.b", b"1")
    env = lmdb.open(str(path), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.delete(struct.pack(">Q", f), db=env.open_db(b"inodes", txn=txn))
    env.close()
    with MetadataStore(path, map_size=64 * MiB) as store:
        assert store.xattr_orphans() == [f]


def test_reopen_keeps_links_symlinks_and_xattrs(tmp_path: Path) -> None:
    path = tmp_path / "metadata.lmdb"
    with MetadataStore(path, map_size=64 * MiB) as store:
        f = new_file(store, "f")
        store.link(f, ROOT_INODE, "g")
        link = store.symlink(ROOT_INODE, "l", b"f").inode
        sock = store.mknod(ROOT_INODE, "s", SOCK, 0o600).inode
        store.setxattr(link, "user.k", b"v")
        before = store.readdir(ROOT_INODE)
    with MetadataStore(path, map_size=64 * MiB) as store:
        assert store.readdir(ROOT_INODE) == before
        assert store.readlink(link) == b"f"
        assert store.getxattr(link, "user.k") == b"v"
        assert store.getattr(f).nlink == 2 and store.getattr(sock).kind == SOCK
        assert consistent(store)


def test_store_written_before_xattrs_opens(tmp_path: Path) -> None:
    """A schema-1 store without the xattrs sub-database (as written before it existed)
    opens, keeps its files, and gains the sub-database."""
    path = tmp_path / "metadata.lmdb"
    with MetadataStore(path, map_size=64 * MiB) as store:
        f = new_file(store, "f")
    env = lmdb.open(str(path), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"xattrs", txn=txn), delete=True)
    with env.begin() as txn:
        assert txn.get(b"xattrs") is None  # the main database names the sub-databases
    env.close()
    with MetadataStore(path, map_size=64 * MiB) as store:
        assert store.lookup(ROOT_INODE, "f").inode == f
        store.setxattr(f, "user.k", b"v")
        assert store.listxattr(f) == ["user.k"]
