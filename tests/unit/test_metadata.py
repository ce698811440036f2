"""The LMDB metadata store's namespace: names, directories, rename, on a real LMDB environment
in tmp_path."""

from __future__ import annotations

import stat

import pytest

from mosafs.errors import (
    AlreadyExists,
    DirectoryNotEmpty,
    InvalidArgument,
    IsADirectory,
    NameTooLong,
    NotADirectory,
    NotFound,
)
from mosafs.manager import metadata, pools
from mosafs.manager.core import Manager
from mosafs.manager.metadata import ROOT_INODE, MetadataStore
from tests.unit.managers import DIR, REG, cid, commit, new_file, refcount, register

# --- namespace ----------------------------------------------------------------------------

def test_root_directory_exists_on_first_open(store: MetadataStore) -> None:
    root = store.getattr(ROOT_INODE)
    assert (root.kind, root.mode, root.nlink, root.uid, root.gid) == (DIR, 0o755, 2, 0, 0)
    assert store.readdir(ROOT_INODE) == ([], False)
    assert store.inode_count() == 1
    assert store.pool("default") == pools.default_settings()


def test_create_then_lookup_and_getattr(store: MetadataStore) -> None:
    attr = store.create(ROOT_INODE, "ckpt.0", 0o640, uid=10, gid=20)
    assert (attr.kind, attr.mode, attr.nlink, attr.size, attr.version) == (REG, 0o640, 1, 0, 0)
    assert (attr.uid, attr.gid) == (10, 20)
    assert attr.inode > ROOT_INODE
    assert store.lookup(ROOT_INODE, "ckpt.0") == attr
    assert store.getattr(attr.inode) == attr


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "/", "a\0b"])
def test_invalid_names_are_refused(store: MetadataStore, name: str) -> None:
    for op in (lambda: store.create(ROOT_INODE, name, 0o644),
               lambda: store.mkdir(ROOT_INODE, name, 0o755),
               lambda: store.lookup(ROOT_INODE, name),
               lambda: store.unlink(ROOT_INODE, name)):
        with pytest.raises(InvalidArgument):
            op()


def test_name_length_is_counted_in_utf8_bytes(store: MetadataStore) -> None:
    store.create(ROOT_INODE, "x" * 255, 0o644)
    store.create(ROOT_INODE, "é" * 127, 0o644)  # 254 bytes
    with pytest.raises(NameTooLong):
        store.create(ROOT_INODE, "x" * 256, 0o644)
    with pytest.raises(NameTooLong):
        store.create(ROOT_INODE, "é" * 128, 0o644)  # 128 characters, 256 bytes
    with pytest.raises(InvalidArgument):
        store.create(ROOT_INODE, "\ud800", 0o644)  # a lone surrogate is not UTF-8


def test_lookup_errors(store: MetadataStore) -> None:
    f = new_file(store, "f")
    with pytest.raises(NotFound):
        store.lookup(ROOT_INODE, "missing")
    with pytest.raises(NotADirectory):
        store.lookup(f, "x")
    with pytest.raises(NotFound):
        store.lookup(999, "x")
    with pytest.raises(NotFound):
        store.getattr(0)
    with pytest.raises(NotFound):
        store.getattr(1 << 64)


def test_mkdir_counts_links_and_refuses_existing_names(store: MetadataStore) -> None:
    a = store.mkdir(ROOT_INODE, "a", 0o750)
    assert (a.kind, a.mode, a.nlink) == (DIR, 0o750, 2)
    store.mkdir(a.inode, "sub", 0o755)
    new_file(store, "file", a.inode)  # files do not count
    assert store.getattr(ROOT_INODE).nlink == 3
    assert store.getattr(a.inode).nlink == 3
    with pytest.raises(AlreadyExists):
        store.mkdir(ROOT_INODE, "a", 0o755)
    with pytest.raises(AlreadyExists):
        store.mkdir(a.inode, "file", 0o755)
    with pytest.raises(NotADirectory):
        store.mkdir(store.lookup(a.inode, "file").inode, "x", 0o755)


def test_create_existing_name(store: MetadataStore) -> None:
    f = store.create(ROOT_INODE, "f", 0o644)
    again = store.create(ROOT_INODE, "f", 0o600)  # open(O_CREAT) without O_EXCL
    assert again.inode == f.inode and again.mode == 0o644
    with pytest.raises(AlreadyExists):
        store.create(ROOT_INODE, "f", 0o644, exclusive=True)
    store.mkdir(ROOT_INODE, "d", 0o755)
    with pytest.raises(IsADirectory):
        store.create(ROOT_INODE, "d", 0o644)
    with pytest.raises(AlreadyExists):
        store.create(ROOT_INODE, "d", 0o644, exclusive=True)


def test_mode_keeps_permission_bits_only(store: MetadataStore) -> None:
    assert store.create(ROOT_INODE, "f", stat.S_IFREG | 0o4755).mode == 0o4755
    assert store.mkdir(ROOT_INODE, "d", stat.S_IFDIR | 0o1777).mode == 0o1777
    with pytest.raises(InvalidArgument):
        store.create(ROOT_INODE, "g", stat.S_IFDIR | 0o644)
    with pytest.raises(InvalidArgument):
        store.create(ROOT_INODE, "h", 0o200000)


def test_setattr_changes_only_given_fields(store: MetadataStore) -> None:
    f = store.create(ROOT_INODE, "f", 0o644, uid=1, gid=2)
    out = store.setattr(f.inode, mode=0o600, mtime_ns=123)
    assert (out.mode, out.uid, out.gid, out.mtime_ns, out.atime_ns) == (
        0o600, 1, 2, 123, f.atime_ns)
    assert out.ctime_ns >= f.ctime_ns
    out = store.setattr(f.inode, uid=7, gid=8, atime_ns=-5)
    assert (out.mode, out.uid, out.gid, out.atime_ns, out.mtime_ns) == (0o600, 7, 8, -5, 123)
    assert store.getattr(f.inode) == out
    with pytest.raises(InvalidArgument):
        store.setattr(f.inode, mode=0o170000)
    with pytest.raises(NotFound):
        store.setattr(12345, mode=0o600)


def test_readdir_pages_in_bytewise_order(store: MetadataStore) -> None:
    names = [f"n{i:02d}" for i in range(25)] + ["B", "a", "é"]
    for name in names:
        new_file(store, name)
    store.mkdir(ROOT_INODE, "dir", 0o755)
    expected = sorted([*names, "dir"], key=lambda n: n.encode())
    seen: list[str] = []
    after = ""
    pages = []
    while True:
        entries, more = store.readdir(ROOT_INODE, after, 10)
        pages.append(len(entries))
        seen.extend(name for name, _ in entries)
        if not more:
            break
        after = entries[-1][0]
    assert seen == expected
    assert pages == [10, 10, 9]
    entries, _ = store.readdir(ROOT_INODE, "dir", 1)
    assert entries[0][0] == "n00" and entries[0][1] == store.lookup(ROOT_INODE, "n00")
    # start_after need not exist: the page starts at the next name.
    assert store.readdir(ROOT_INODE, "n105", 2)[0][0][0] == "n11"
    assert store.readdir(ROOT_INODE, "é") == ([], False)
    with pytest.raises(NotADirectory):
        store.readdir(store.lookup(ROOT_INODE, "a").inode)
    with pytest.raises(InvalidArgument):
        store.readdir(ROOT_INODE, "x" * 256)


def test_readdir_limit_is_capped(store: MetadataStore) -> None:
    for i in range(metadata.READDIR_MAX + 5):
        new_file(store, f"f{i:06d}")
    entries, more = store.readdir(ROOT_INODE, "", 10**9)
    assert len(entries) == metadata.READDIR_MAX and more
    entries, more = store.readdir(ROOT_INODE)  # 0: the default page
    assert len(entries) == metadata.READDIR_DEFAULT and more


def test_unlink(store: MetadataStore) -> None:
    f = new_file(store, "f")
    store.mkdir(ROOT_INODE, "d", 0o755)
    before = store.getattr(ROOT_INODE)
    with pytest.raises(NotFound):
        store.unlink(ROOT_INODE, "missing")
    with pytest.raises(IsADirectory):
        store.unlink(ROOT_INODE, "d")
    store.unlink(ROOT_INODE, "f")
    with pytest.raises(NotFound):
        store.getattr(f)
    with pytest.raises(NotFound):
        store.lookup(ROOT_INODE, "f")
    assert store.getattr(ROOT_INODE).mtime_ns >= before.mtime_ns
    assert store.inode_count() == 2  # root and d


def test_rmdir(store: MetadataStore) -> None:
    d = store.mkdir(ROOT_INODE, "d", 0o755).inode
    new_file(store, "f")
    new_file(store, "inner", d)
    assert store.getattr(ROOT_INODE).nlink == 3
    with pytest.raises(NotADirectory):
        store.rmdir(ROOT_INODE, "f")
    with pytest.raises(DirectoryNotEmpty):
        store.rmdir(ROOT_INODE, "d")
    with pytest.raises(NotFound):
        store.rmdir(ROOT_INODE, "missing")
    store.unlink(d, "inner")
    store.rmdir(ROOT_INODE, "d")
    assert store.getattr(ROOT_INODE).nlink == 2
    with pytest.raises(NotFound):
        store.getattr(d)


def test_inode_numbers_are_never_reused(store: MetadataStore) -> None:
    a = new_file(store, "a")
    store.unlink(ROOT_INODE, "a")
    assert new_file(store, "a") > a


# --- rename -------------------------------------------------------------------------------

def test_rename_within_a_directory(store: MetadataStore) -> None:
    f = new_file(store, "old")
    store.rename(ROOT_INODE, "old", ROOT_INODE, "new")
    assert store.lookup(ROOT_INODE, "new").inode == f
    with pytest.raises(NotFound):
        store.lookup(ROOT_INODE, "old")
    with pytest.raises(NotFound):
        store.rename(ROOT_INODE, "old", ROOT_INODE, "x")
    store.rename(ROOT_INODE, "new", ROOT_INODE, "new")  # same entry: nothing happens
    assert store.readdir(ROOT_INODE)[0][0][0] == "new"


def test_rename_directory_across_parents_fixes_links_and_parent(store: MetadataStore) -> None:
    a = store.mkdir(ROOT_INODE, "a", 0o755).inode
    b = store.mkdir(ROOT_INODE, "b", 0o755).inode
    d = store.mkdir(a, "d", 0o755).inode
    store.rename(a, "d", b, "d2")
    assert store.getattr(a).nlink == 2
    assert store.getattr(b).nlink == 3
    assert store.getattr(ROOT_INODE).nlink == 4
    assert store.lookup(b, "d2").inode == d
    # d's parent pointer now says b: moving b under d is moving b into its own subtree.
    with pytest.raises(InvalidArgument):
        store.rename(ROOT_INODE, "b", d, "loop")
    store.rename(ROOT_INODE, "a", d, "a")  # a is not above d: allowed
    assert store.getattr(d).nlink == 3
    assert store.getattr(ROOT_INODE).nlink == 3


def test_rename_refusals(store: MetadataStore) -> None:
    d = store.mkdir(ROOT_INODE, "d", 0o755).inode
    store.mkdir(ROOT_INODE, "full", 0o755)
    new_file(store, "x", store.lookup(ROOT_INODE, "full").inode)
    new_file(store, "f")
    new_file(store, "g")
    with pytest.raises(AlreadyExists):
        store.rename(ROOT_INODE, "f", ROOT_INODE, "g", no_replace=True)
    with pytest.raises(IsADirectory):
        store.rename(ROOT_INODE, "f", ROOT_INODE, "d")
    with pytest.raises(NotADirectory):
        store.rename(ROOT_INODE, "d", ROOT_INODE, "f")
    with pytest.raises(DirectoryNotEmpty):
        store.rename(ROOT_INODE, "d", ROOT_INODE, "full")
    with pytest.raises(InvalidArgument):
        store.rename(ROOT_INODE, "d", d, "inside")
    with pytest.raises(NotADirectory):
        store.rename(ROOT_INODE, "f", store.lookup(ROOT_INODE, "g").inode, "x")
    with pytest.raises(InvalidArgument):
        store.rename(ROOT_INODE, "f", ROOT_INODE, "a/b")
    # Nothing changed.
    names = [n for n, _ in store.readdir(ROOT_INODE)[0]]
    assert names == ["d", "f", "full", "g"]
    assert store.getattr(ROOT_INODE).nlink == 4


def test_rename_directory_over_empty_directory(store: MetadataStore) -> None:
    src = store.mkdir(ROOT_INODE, "src", 0o755).inode
    other = store.mkdir(ROOT_INODE, "other", 0o755).inode
    empty = store.mkdir(other, "empty", 0o755).inode
    store.rename(ROOT_INODE, "src", other, "empty")
    assert store.lookup(other, "empty").inode == src
    with pytest.raises(NotFound):
        store.getattr(empty)
    assert store.getattr(other).nlink == 3
    assert store.getattr(ROOT_INODE).nlink == 3


def test_rename_file_over_file_unlinks_the_target(mgr: Manager) -> None:
    store = mgr.store
    register(mgr, "b1")
    src, dst = new_file(store, "src"), new_file(store, "dst")
    commit(mgr, src, [(cid(1), 100), (cid(2), 100)])
    commit(mgr, dst, [(cid(2), 100), (cid(3), 100)])
    commit(mgr, dst, [(cid(3), 100)])
    assert (refcount(store, cid(2)), refcount(store, cid(3))) == (2, 2)
    store.rename(ROOT_INODE, "src", ROOT_INODE, "dst")
    assert store.lookup(ROOT_INODE, "dst").inode == src
    with pytest.raises(NotFound):
        store.getattr(dst)
    assert [refcount(store, cid(n)) for n in (1, 2, 3)] == [1, 1, 0]
    assert store.chunk(cid(3)) is not None  # refcount 0 stays until GC
    assert store.refcount_mismatches() == {}
