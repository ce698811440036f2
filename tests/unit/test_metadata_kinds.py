"""The metadata store's other kinds of inode: symbolic links, FIFOs, sockets and device
nodes, hard links, and setattr's times."""

from __future__ import annotations

import os
import stat
import struct
from functools import partial
from pathlib import Path

import lmdb
import pytest

from mosafs._proto import manager_pb2, metadata_pb2
from mosafs.errors import (
    AlreadyExists,
    InvalidArgument,
    IsADirectory,
    NameTooLong,
    NotADirectory,
    NotFound,
    NotPermitted,
)
from mosafs.manager.core import Manager
from mosafs.manager.fsck import fsck
from mosafs.manager.metadata import ROOT_INODE, MetadataStore
from tests.unit.managers import (
    BLK,
    CHR,
    DIR,
    FIFO,
    LNK,
    REG,
    SOCK,
    MiB,
    cid,
    commit,
    consistent,
    new_file,
    refcount,
    register,
)

# --- symbolic links -----------------------------------------------------------------------

def test_symlink_then_readlink_lookup_and_readdir(store: MetadataStore) -> None:
    before = store.getattr(ROOT_INODE)
    target = b"../data/\xff\xfe not utf-8/ckpt.7"
    attr = store.symlink(ROOT_INODE, "latest", target, uid=3, gid=4)
    assert (attr.kind, attr.mode, attr.nlink, attr.size, attr.version) == (
        LNK, 0o777, 1, len(target), 0)
    assert (attr.uid, attr.gid) == (3, 4)
    assert store.readlink(attr.inode) == target
    assert store.lookup(ROOT_INODE, "latest") == attr == store.getattr(attr.inode)
    assert store.readdir(ROOT_INODE) == ([("latest", attr)], False)
    root = store.getattr(ROOT_INODE)
    assert root.mtime_ns >= before.mtime_ns and root.nlink == 2  # a symlink is no subdir
    assert consistent(store)


def test_symlink_target_limits(store: MetadataStore) -> None:
    longest = store.symlink(ROOT_INODE, "long", b"t" * 4095)
    assert longest.size == 4095 and store.readlink(longest.inode) == b"t" * 4095
    with pytest.raises(NameTooLong, match="4095"):
        store.symlink(ROOT_INODE, "too-long", b"t" * 4096)
    with pytest.raises(InvalidArgument, match="empty"):
        store.symlink(ROOT_INODE, "empty", b"")
    with pytest.raises(InvalidArgument, match="NUL"):
        store.symlink(ROOT_INODE, "nul", b"a\0b")
    assert store.inode_count() == 2  # root and "long": the refusals created nothing


def test_symlink_refusals(store: MetadataStore) -> None:
    f = new_file(store, "f")
    store.mkdir(ROOT_INODE, "d", 0o755)
    with pytest.raises(AlreadyExists):
        store.symlink(ROOT_INODE, "f", b"x")
    with pytest.raises(AlreadyExists):
        store.symlink(ROOT_INODE, "d", b"x")
    with pytest.raises(NotADirectory):
        store.symlink(f, "x", b"x")
    with pytest.raises(NotFound):
        store.symlink(4242, "x", b"x")
    with pytest.raises(InvalidArgument):
        store.symlink(ROOT_INODE, "a/b", b"x")
    with pytest.raises(InvalidArgument):
        store.symlink(ROOT_INODE, "u", b"x", uid=1 << 32)
    assert store.inode_count() == 3


def test_readlink_of_anything_but_a_symlink(store: MetadataStore) -> None:
    f = new_file(store, "f")
    fifo = store.mknod(ROOT_INODE, "p", FIFO, 0o600).inode
    for ino in (f, fifo, ROOT_INODE):
        with pytest.raises(InvalidArgument, match="not a symbolic link"):
            store.readlink(ino)
    with pytest.raises(NotFound):
        store.readlink(999)


# --- FIFOs, sockets, device nodes, refused kinds ------------------------------------------

@pytest.mark.parametrize("kind, type_bits", [(FIFO, stat.S_IFIFO), (SOCK, stat.S_IFSOCK)])
def test_mknod_fifo_and_socket(store: MetadataStore, kind: int, type_bits: int) -> None:
    attr = store.mknod(ROOT_INODE, "n", kind, 0o640, uid=5, gid=6)  # type: ignore[arg-type]
    assert (attr.kind, attr.mode, attr.nlink, attr.size, attr.uid, attr.gid) == (
        kind, 0o640, 1, 0, 5, 6)
    assert store.lookup(ROOT_INODE, "n") == attr
    # The kind's own file-type bits are tolerated (FUSE passes them); others are not.
    typed = store.mknod(ROOT_INODE, "typed", kind, type_bits | 0o1755)  # type: ignore[arg-type]
    assert typed.mode == 0o1755
    with pytest.raises(InvalidArgument, match="permission bits"):
        store.mknod(ROOT_INODE, "x", kind, stat.S_IFREG | 0o644)  # type: ignore[arg-type]
    with pytest.raises(AlreadyExists):
        store.mknod(ROOT_INODE, "n", kind, 0o640)  # type: ignore[arg-type]
    assert [a.kind for _, a in store.readdir(ROOT_INODE)[0]] == [kind, kind]
    assert consistent(store)


@pytest.mark.parametrize("kind, type_bits, rdev", [
    (BLK, stat.S_IFBLK, os.makedev(8, 1)), (CHR, stat.S_IFCHR, os.makedev(1, 3)),
    (CHR, stat.S_IFCHR, 0),  # 0/0: overlayfs's whiteout
    (BLK, stat.S_IFBLK, os.makedev(4095, 1048575)),  # the largest FUSE carries
])
def test_mknod_device_nodes_keep_their_number(tmp_path: Path, kind: int, type_bits: int,
                                              rdev: int) -> None:
    path = tmp_path / "metadata.lmdb"
    with MetadataStore(path, map_size=64 * MiB) as store:
        attr = store.mknod(ROOT_INODE, "dev", kind, type_bits | 0o660,  # type: ignore[arg-type]
                           uid=0, gid=6, rdev=rdev)
        assert (attr.kind, attr.mode, attr.nlink, attr.size, attr.rdev, attr.gid) == (
            kind, 0o660, 1, 0, rdev, 6)
        assert store.lookup(ROOT_INODE, "dev") == attr
        with pytest.raises(InvalidArgument, match="permission bits"):
            store.mknod(ROOT_INODE, "x", kind, stat.S_IFIFO | 0o600,  # type: ignore[arg-type]
                        rdev=rdev)
        store.link(attr.inode, ROOT_INODE, "again")
    with MetadataStore(path, map_size=64 * MiB) as store:  # kept across a restart
        assert store.getattr(attr.inode).rdev == rdev
        assert [(n, a.kind, a.rdev) for n, a in store.readdir(ROOT_INODE)[0]] == [
            ("again", kind, rdev), ("dev", kind, rdev)]
        assert fsck(store).findings == []
        store.unlink(ROOT_INODE, "dev")
        store.unlink(ROOT_INODE, "again")
        with pytest.raises(NotFound):
            store.getattr(attr.inode)
        assert consistent(store)


def test_mknod_rdev_is_for_device_nodes_only(store: MetadataStore) -> None:
    for kind in (FIFO, SOCK):
        with pytest.raises(InvalidArgument, match="has no device number"):
            store.mknod(ROOT_INODE, "n", kind, 0o600, rdev=os.makedev(1, 3))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="unsigned 64-bit"):
        store.mknod(ROOT_INODE, "n", BLK, 0o600, rdev=1 << 64)  # type: ignore[arg-type]
    assert store.readdir(ROOT_INODE) == ([], False)


def test_fsck_checks_kinds_and_device_numbers(store: MetadataStore) -> None:
    fifo = store.mknod(ROOT_INODE, "p", FIFO, 0o600).inode
    odd = store.mknod(ROOT_INODE, "c", CHR, 0o600, rdev=5).inode
    with store.transaction(write=True) as tx:  # damage: a FIFO with a number, a bad kind
        rec = tx.inode(fifo)
        rec.rdev = 7
        tx.put_inode(fifo, rec)
        rec = tx.inode(odd)
        rec.kind = 99  # type: ignore[assignment]
        tx.put_inode(odd, rec)
    found = fsck(store).findings
    assert sorted((f.kind, f.repairable) for f in found) == [("bad_kind", False),
                                                           ("rdev", True)]
    assert fsck(store, repair=True).findings == found
    assert store.getattr(fifo).rdev == 0
    assert [f.kind for f in fsck(store).findings] == ["bad_kind"]


@pytest.mark.parametrize("kind, match", [
    (manager_pb2.FILE_KIND_UNSPECIFIED, "device nodes"),
    (99, "device nodes"),
    (REG, "Create"),
    (DIR, "Mkdir"),
    (LNK, "Symlink"),
])
def test_mknod_refuses_every_other_kind(store: MetadataStore, kind: int, match: str) -> None:
    with pytest.raises(NotPermitted, match=match):
        store.mknod(ROOT_INODE, "dev", kind, 0o600)  # type: ignore[arg-type]
    assert store.inode_count() == 1
    assert store.readdir(ROOT_INODE) == ([], False)


def test_special_inodes_have_no_data(mgr: Manager) -> None:
    register(mgr, "b1")
    store = mgr.store
    specials = [store.symlink(ROOT_INODE, "l", b"t").inode,
                store.mknod(ROOT_INODE, "p", FIFO, 0o600).inode,
                store.mknod(ROOT_INODE, "s", SOCK, 0o600).inode]
    f = new_file(store, "f")
    commit(mgr, f, [(cid(1), 10)])
    for ino in specials:
        for op in (partial(mgr.open_write, ino, "c"), partial(mgr.block_map, ino),
                   partial(store.version_stats, ino), partial(store.versions, ino),
                   partial(store.write_base, ino),
                   partial(store.commit_version, ino, [(cid(1), 10)])):
            with pytest.raises(InvalidArgument, match="not a regular file"):
                op()
    assert len(mgr.leases) == 0  # no lease was handed out for a special inode
    assert refcount(store, cid(1)) == 1
    assert mgr.statfs().files == 5  # root, three special inodes, f


def test_every_kind_renames_unlinks_and_setattrs(mgr: Manager) -> None:
    register(mgr, "b1")
    store = mgr.store
    d = store.mkdir(ROOT_INODE, "d", 0o755).inode
    link = store.symlink(ROOT_INODE, "l", b"target").inode
    fifo = store.mknod(ROOT_INODE, "p", FIFO, 0o600).inode
    sock = store.mknod(d, "s", SOCK, 0o600).inode
    f = new_file(store, "f")
    commit(mgr, f, [(cid(1), 10), (cid(2), 10)])
    out = store.setattr(link, uid=9, mtime_ns=5)
    assert (out.kind, out.uid, out.mtime_ns, out.size) == (LNK, 9, 5, 6)
    assert store.setattr(fifo, mode=0o644).mode == 0o644
    # A symlink replaces a regular file: the file's last link goes with its chunks.
    store.rename(ROOT_INODE, "l", ROOT_INODE, "f")
    assert store.lookup(ROOT_INODE, "f").inode == link
    assert store.readlink(link) == b"target"
    with pytest.raises(NotFound):
        store.getattr(f)
    assert [refcount(store, cid(n)) for n in (1, 2)] == [0, 0]
    # A socket moves across directories; a FIFO replaces it.
    store.rename(d, "s", ROOT_INODE, "s")
    store.rename(ROOT_INODE, "p", ROOT_INODE, "s")
    with pytest.raises(NotFound):
        store.getattr(sock)
    assert store.lookup(ROOT_INODE, "s").kind == FIFO
    with pytest.raises(NotADirectory):
        store.rename(ROOT_INODE, "d", ROOT_INODE, "s")
    with pytest.raises(IsADirectory):
        store.rename(ROOT_INODE, "f", ROOT_INODE, "d")
    with pytest.raises(NotADirectory):
        store.rmdir(ROOT_INODE, "f")
    with pytest.raises(NotADirectory):
        store.readdir(link)
    store.unlink(ROOT_INODE, "f")
    store.unlink(ROOT_INODE, "s")
    store.rmdir(ROOT_INODE, "d")
    assert store.readdir(ROOT_INODE) == ([], False)
    assert mgr.statfs().files == 1
    assert consistent(store)


def _place(store: MetadataStore, ino: int) -> tuple[int, bytes]:
    with store.transaction() as tx:
        rec = tx.inode(ino)
        return rec.parent, bytes(rec.name)


@pytest.mark.parametrize("kind", [LNK, FIFO, SOCK, CHR])
def test_every_non_directory_keeps_its_entry(store: MetadataStore, kind: int) -> None:
    """InodeRecord.parent/.name of every non-directory (not only of regular files) name
    one of its entries, or nothing: where the access checks of a client restricted to a
    subtree place it (mosafs.manager.permissions)."""
    a = store.mkdir(ROOT_INODE, "a", 0o755).inode
    b = store.mkdir(ROOT_INODE, "b", 0o755).inode
    if kind == LNK:
        ino = store.symlink(a, "x", b"target").inode
    else:
        ino = store.mknod(a, "x", kind, 0o600, rdev=5 if kind == CHR else 0).inode
    assert _place(store, ino) == (a, b"x")
    store.rename(a, "x", b, "y")  # the recorded entry follows its name
    assert _place(store, ino) == (b, b"y")
    store.link(ino, a, "z")  # another name: the recorded one stays
    assert _place(store, ino) == (b, b"y")
    store.unlink(b, "y")  # the recorded name goes, another remains: no known place
    assert _place(store, ino) == (0, b"")
    store.link(ino, b, "w")  # a link gives it one again
    assert _place(store, ino) == (b, b"w")
    store.unlink(b, "w")
    store.rename(a, "z", a, "v")  # and so does a rename of an inode without one
    assert _place(store, ino) == (a, b"v")
    assert consistent(store) and fsck(store).findings == []
    with store.transaction(write=True) as tx:  # damage: an entry that names another inode
        rec = tx.inode(ino)
        rec.parent, rec.name = b, b"nothing"
        tx.put_inode(ino, rec)
    assert [f.kind for f in fsck(store, repair=True).findings] == ["file_folder"]
    assert _place(store, ino) == (0, b"")


# --- hard links ---------------------------------------------------------------------------

def test_link_adds_a_name(store: MetadataStore) -> None:
    d = store.mkdir(ROOT_INODE, "d", 0o755).inode
    f = store.create(ROOT_INODE, "f", 0o644)
    dir_before = store.getattr(d)
    attr = store.link(f.inode, d, "f2")
    assert (attr.inode, attr.kind, attr.nlink) == (f.inode, REG, 2)
    assert attr.ctime_ns >= f.ctime_ns
    assert store.lookup(d, "f2") == attr == store.lookup(ROOT_INODE, "f")
    assert store.getattr(d).mtime_ns >= dir_before.mtime_ns
    assert store.getattr(d).nlink == 2  # a file's name is no subdirectory
    assert store.link(f.inode, ROOT_INODE, "f3").nlink == 3
    assert store.nlink_mismatches() == {}
    # Symlinks, FIFOs and sockets link too.
    link = store.symlink(ROOT_INODE, "l", b"t").inode
    for ino in (link, store.mknod(ROOT_INODE, "p", FIFO, 0o600).inode,
                store.mknod(ROOT_INODE, "s", SOCK, 0o600).inode):
        assert store.link(ino, d, f"link-{ino}").nlink == 2
    store.unlink(ROOT_INODE, "l")
    assert store.lookup(d, f"link-{link}").nlink == 1
    assert store.readlink(link) == b"t"
    assert consistent(store)


def test_link_refusals(store: MetadataStore) -> None:
    d = store.mkdir(ROOT_INODE, "d", 0o755).inode
    f = new_file(store, "f")
    new_file(store, "g")
    with pytest.raises(NotPermitted, match="directory"):
        store.link(d, ROOT_INODE, "d2")
    with pytest.raises(NotPermitted):
        store.link(ROOT_INODE, d, "root")
    with pytest.raises(AlreadyExists):
        store.link(f, ROOT_INODE, "g")
    with pytest.raises(AlreadyExists):
        store.link(f, ROOT_INODE, "d")
    with pytest.raises(AlreadyExists):
        store.link(f, ROOT_INODE, "f")
    with pytest.raises(NotFound):
        store.link(4242, ROOT_INODE, "x")
    with pytest.raises(NotFound):
        store.link(f, 4242, "x")
    with pytest.raises(NotADirectory):
        store.link(f, f, "x")
    with pytest.raises(InvalidArgument):
        store.link(f, ROOT_INODE, "..")
    assert store.getattr(f).nlink == 1
    assert [n for n, _ in store.readdir(ROOT_INODE)[0]] == ["d", "f", "g"]
    assert consistent(store)


def test_hard_link_keeps_data_until_the_last_name_goes(mgr: Manager) -> None:
    store = mgr.store
    register(mgr, "b1")
    d = store.mkdir(ROOT_INODE, "d", 0o755).inode
    f = new_file(store, "ckpt")
    commit(mgr, f, [(cid(1), 10), (cid(2), 10)])
    commit(mgr, f, [(cid(2), 10), (cid(3), 10)])
    store.setxattr(f, "user.step", b"7")
    store.link(f, d, "ckpt.bak")
    store.unlink(ROOT_INODE, "ckpt")
    attr = store.lookup(d, "ckpt.bak")
    assert (attr.inode, attr.nlink, attr.version, attr.size) == (f, 1, 2, 20)
    assert store.versions(f) == [1, 2]
    assert [(c.id, c.length) for c in mgr.block_map(f, 1).chunks] == [(cid(1), 10),
                                                                       (cid(2), 10)]
    assert [refcount(store, cid(n)) for n in (1, 2, 3)] == [1, 2, 1]
    assert store.getxattr(f, "user.step") == b"7"
    assert consistent(store)
    # A write through the remaining name still works and dedupes against version 2.
    lease = mgr.open_write(f, "c")
    assert lease.base_version == 2
    store.unlink(d, "ckpt.bak")
    with pytest.raises(NotFound):
        store.getattr(f)
    with pytest.raises(NotFound):
        store.getxattr(f, "user.step")
    assert [refcount(store, cid(n)) for n in (1, 2, 3)] == [0, 0, 0]
    assert consistent(store)
    with pytest.raises(NotFound):  # the write in flight finds its file gone
        mgr.commit_version(lease.lease_id, f, [(cid(1), 10)], [])


def test_commit_through_one_name_is_seen_through_the_other(mgr: Manager) -> None:
    store = mgr.store
    register(mgr, "b1")
    f = new_file(store, "a")
    store.link(f, ROOT_INODE, "b")
    commit(mgr, f, [(cid(1), 10)])
    assert store.lookup(ROOT_INODE, "b") == store.lookup(ROOT_INODE, "a")
    assert store.lookup(ROOT_INODE, "b").version == 1


def test_rename_between_names_of_one_file_does_nothing(store: MetadataStore) -> None:
    d = store.mkdir(ROOT_INODE, "d", 0o755).inode
    f = new_file(store, "a")
    store.link(f, ROOT_INODE, "b")
    store.link(f, d, "c")
    before = (store.getattr(f), store.getattr(ROOT_INODE), store.getattr(d))
    store.rename(ROOT_INODE, "a", ROOT_INODE, "b")
    store.rename(d, "c", ROOT_INODE, "a")
    after = (store.getattr(f), store.getattr(ROOT_INODE), store.getattr(d))
    assert after == before  # not even a ctime changed
    assert [n for n, _ in store.readdir(ROOT_INODE)[0]] == ["a", "b", "d"]
    assert store.lookup(d, "c").inode == f and after[0].nlink == 3
    with pytest.raises(AlreadyExists):  # RENAME_NOREPLACE refuses an existing target
        store.rename(ROOT_INODE, "a", ROOT_INODE, "b", no_replace=True)
    with pytest.raises(AlreadyExists):
        store.rename(ROOT_INODE, "a", ROOT_INODE, "a", no_replace=True)
    assert consistent(store)


def test_rename_over_one_name_of_a_linked_file_drops_one_link(mgr: Manager) -> None:
    store = mgr.store
    register(mgr, "b1")
    f = new_file(store, "f")
    store.link(f, ROOT_INODE, "f2")
    commit(mgr, f, [(cid(1), 10)])
    g = new_file(store, "g")
    store.rename(ROOT_INODE, "g", ROOT_INODE, "f2")
    assert store.lookup(ROOT_INODE, "f2").inode == g
    attr = store.getattr(f)
    assert (attr.nlink, attr.version) == (1, 1)
    assert refcount(store, cid(1)) == 1
    store.rename(ROOT_INODE, "f2", ROOT_INODE, "f")  # the last name of f goes
    with pytest.raises(NotFound):
        store.getattr(f)
    assert refcount(store, cid(1)) == 0
    assert consistent(store)


def test_nlink_mismatches_finds_damage(tmp_path: Path) -> None:
    path = tmp_path / "metadata.lmdb"
    with MetadataStore(path, map_size=64 * MiB) as store:
        f = new_file(store, "f")
        store.link(f, ROOT_INODE, "g")
        d = store.mkdir(ROOT_INODE, "d", 0o755).inode
        assert store.nlink_mismatches() == {}
    env = lmdb.open(str(path), max_dbs=16)
    inodes = env.open_db(b"inodes")
    dirents = env.open_db(b"dirents")
    with env.begin(write=True) as txn:
        for ino, nlink in ((f, 1), (d, 5)):
            raw = txn.get(struct.pack(">Q", ino), db=inodes)
            assert raw is not None
            rec = metadata_pb2.InodeRecord.FromString(raw)
            rec.nlink = nlink
            txn.put(struct.pack(">Q", ino), rec.SerializeToString(), db=inodes)
        txn.put(struct.pack(">Q", ROOT_INODE) + b"ghost", struct.pack(">Q", 777), db=dirents)
    env.close()
    with MetadataStore(path, map_size=64 * MiB) as store:
        assert store.nlink_mismatches() == {f: (1, 2), d: (5, 2), 777: (0, 1)}


# --- setattr times ------------------------------------------------------------------------

def test_setattr_ctime_is_given_or_now(store: MetadataStore) -> None:
    f = store.create(ROOT_INODE, "f", 0o644)
    out = store.setattr(f.inode, atime_ns=11, mtime_ns=22, ctime_ns=33)
    assert (out.atime_ns, out.mtime_ns, out.ctime_ns) == (11, 22, 33)
    out = store.setattr(f.inode, ctime_ns=-44)
    assert (out.atime_ns, out.mtime_ns, out.ctime_ns) == (11, 22, -44)
    out = store.setattr(f.inode, mode=0o600)
    assert (out.atime_ns, out.mtime_ns) == (11, 22) and out.ctime_ns > f.ctime_ns
    for kwargs in ({"ctime_ns": 1 << 63}, {"atime_ns": -(1 << 63) - 1}, {"uid": -1},
                   {"gid": 1 << 32}, {"mode": -1}):
        with pytest.raises(InvalidArgument):
            store.setattr(f.inode, **kwargs)  # type: ignore[arg-type]
    assert store.getattr(f.inode) == out
