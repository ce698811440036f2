"""The manager's domain: the LMDB metadata store, leases, the benefactor registry and the
write protocol (core.Manager), on a real LMDB environment in tmp_path. Time for leases and
liveness comes from a test clock so expiry is exact and instant."""

from __future__ import annotations

import os
import stat
import struct
from functools import partial
from pathlib import Path

import lmdb
import pytest

from mosafs._proto import benefactor_pb2, manager_pb2, metadata_pb2
from mosafs.errors import (
    AlreadyExists,
    ConfigError,
    DirectoryNotEmpty,
    FailedPrecondition,
    InvalidArgument,
    IsADirectory,
    LeaseExpired,
    NameTooLong,
    NoAttribute,
    NoSpace,
    NotADirectory,
    NotFound,
    NotPermitted,
    NotSupported,
    Unavailable,
    ValueTooLarge,
)
from mosafs.manager import metadata, pools
from mosafs.manager.core import MAX_FIND_CHUNKS, Manager, ManagerConfig
from mosafs.manager.fsck import fsck
from mosafs.manager.metadata import ROOT_INODE, MetadataStore
from tests.unit.managers import Clock, cid, commit, consistent, new_file, refcount, register

DIR = manager_pb2.FILE_KIND_DIRECTORY
REG = manager_pb2.FILE_KIND_REGULAR
LNK = manager_pb2.FILE_KIND_SYMLINK
FIFO = manager_pb2.FILE_KIND_FIFO
SOCK = manager_pb2.FILE_KIND_SOCKET
BLK = manager_pb2.FILE_KIND_BLOCK_DEVICE
CHR = manager_pb2.FILE_KIND_CHAR_DEVICE
MiB = 1 << 20


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


# --- versions, block-maps, refcounts ------------------------------------------------------

def test_block_map_encoding_round_trip() -> None:
    chunks = [(cid(1), 1), (cid(2), 64 * MiB), (cid(1), 12345)]
    packed = metadata.pack_blockmap(chunks)
    assert len(packed) == 40 * len(chunks)
    assert packed[:32] == cid(1)
    assert struct.unpack("<Q", packed[72:80]) == (64 * MiB,)
    assert metadata.unpack_blockmap(packed) == chunks
    assert metadata.unpack_blockmap(memoryview(packed)) == chunks
    assert metadata.unpack_blockmap(b"") == []
    with pytest.raises(RuntimeError):
        metadata.unpack_blockmap(packed[:-1])


def test_commit_then_block_map(mgr: Manager) -> None:
    store = mgr.store
    register(mgr, "b1", port=7001)
    register(mgr, "b2", port=7002)
    f = new_file(store, "f")
    lease = mgr.open_write(f, "client-1")
    assert lease.base_version == 0 and not lease.base_chunks
    chunks = [(cid(1), 1000), (cid(2), 2000), (cid(1), 1000)]
    version, attr = mgr.commit_version(
        lease.lease_id, f, chunks, [(cid(1), ["b1"]), (cid(2), ["b2"]), (cid(2), ["b1"])],
        mtime_ns=42, new_bytes=3000)
    assert version == 1
    assert (attr.version, attr.size, attr.mtime_ns) == (1, 4000, 42)
    assert store.getattr(f) == attr
    bm = mgr.block_map(f)
    assert (bm.inode, bm.version, bm.size) == (f, 1, 4000)
    assert [(c.id, c.length) for c in bm.chunks] == chunks
    assert {loc.id: list(loc.benefactor_ids) for loc in bm.locations} == {
        cid(1): ["b1"], cid(2): ["b2", "b1"]}
    assert len(bm.locations) == 2
    assert {(b.id, b.address) for b in bm.benefactors} == {
        ("b1", "127.0.0.1:7001"), ("b2", "127.0.0.1:7002")}
    assert mgr.block_map(f, 1) == bm
    stats = store.version_stats(f)
    assert (stats.version, stats.size, stats.chunks, stats.new_bytes, stats.mtime_ns) == (
        1, 4000, 3, 3000, 42)
    assert stats.base_version == 0 and stats.commit_time_ns > 0
    assert refcount(store, cid(1)) == 2 and refcount(store, cid(2)) == 1


def test_versions_accumulate_and_dedupe_against_the_newest(mgr: Manager) -> None:
    store = mgr.store
    register(mgr, "b1")
    f = new_file(store, "f")
    v1 = [(cid(1), 10), (cid(2), 20), (cid(3), 30)]
    assert commit(mgr, f, v1) == 1
    lease = mgr.open_write(f, "c")
    assert (lease.base_inode, lease.base_version, lease.base_size) == (f, 1, 60)
    assert [(c.id, c.length) for c in lease.base_chunks] == v1
    v2 = [(cid(1), 10), (cid(4), 40), (cid(3), 30)]
    version, attr = mgr.commit_version(lease.lease_id, f, v2, [(cid(4), ["b1"])])
    assert version == 2 and attr.size == 80 and attr.version == 2
    stats = store.version_stats(f)
    assert (stats.shared_chunks, stats.base_inode, stats.base_version) == (2, f, 1)
    old = store.version_stats(f, 1)
    assert (old.shared_chunks, old.base_version, old.size) == (0, 0, 60)
    assert [(c.id, c.length) for c in mgr.block_map(f, 1).chunks] == v1
    assert store.versions(f) == [1, 2]
    assert [refcount(store, cid(n)) for n in (1, 2, 3, 4)] == [2, 1, 2, 1]
    assert store.refcount_mismatches() == {}


def test_refcounts_match_block_maps_through_commits_and_unlinks(mgr: Manager) -> None:
    store = mgr.store
    register(mgr, "b1")
    a, b = new_file(store, "a"), new_file(store, "b")
    commit(mgr, a, [(cid(1), 5), (cid(1), 5), (cid(2), 5)])
    commit(mgr, a, [(cid(2), 5), (cid(3), 5)])
    commit(mgr, b, [(cid(1), 5), (cid(3), 5), (cid(3), 5)])
    assert store.refcount_mismatches() == {}
    assert [refcount(store, cid(n)) for n in (1, 2, 3)] == [3, 2, 3]
    store.unlink(ROOT_INODE, "a")
    assert store.refcount_mismatches() == {}
    assert [refcount(store, cid(n)) for n in (1, 2, 3)] == [1, 0, 2]
    with pytest.raises(NotFound):
        store.version_stats(a, 1)
    store.unlink(ROOT_INODE, "b")
    assert [refcount(store, cid(n)) for n in (1, 2, 3)] == [0, 0, 0]
    assert store.refcount_mismatches() == {}


def test_empty_file_version(mgr: Manager) -> None:
    register(mgr, "b1")
    f = new_file(mgr.store, "empty")
    assert commit(mgr, f, []) == 1
    bm = mgr.block_map(f)
    assert (bm.version, bm.size, len(bm.chunks)) == (1, 0, 0)


def test_unplaced_new_chunk_fails_precondition_and_commits_nothing(mgr: Manager) -> None:
    store = mgr.store
    register(mgr, "b1")
    f = new_file(store, "f")
    lease = mgr.open_write(f, "c")
    with pytest.raises(FailedPrecondition, match=cid(2).hex()) as info:
        mgr.commit_version(lease.lease_id, f, [(cid(1), 10), (cid(2), 10)],
                           [(cid(1), ["b1"])])
    assert "neither stored nor placed" in str(info.value)
    assert store.getattr(f).version == 0
    assert store.chunk(cid(1)) is None  # the transaction was rolled back
    # The lease survives a refused commit: the client stores the chunk and retries.
    version, _ = mgr.commit_version(lease.lease_id, f, [(cid(1), 10), (cid(2), 10)],
                                    [(cid(1), ["b1"]), (cid(2), ["b1"])])
    assert version == 1


@pytest.mark.parametrize("chunks, placements, match", [
    ([(b"../x", 10)], [], "32 bytes"),
    ([(cid(1)[:31], 10)], [], "32 bytes"),
    ([(cid(1), 0)], [(cid(1), ["b1"])], "length 0"),
    ([(cid(1), 64 * MiB + 1)], [(cid(1), ["b1"])], "outside"),
    ([(cid(1), 10), (cid(1), 11)], [(cid(1), ["b1"])], "lengths"),
    ([(cid(1), 10)], [(cid(1), ["nobody"])], "unknown benefactor"),
    ([(cid(1), 10)], [(cid(1), ["bad/id"])], "benefactor id"),
    ([(cid(1), 10)], [(cid(1), [])], "names no benefactor"),
    ([(cid(1), 10)], [(b"short", ["b1"])], "32 bytes"),
])
def test_commit_validates_its_input(mgr: Manager, chunks: list[tuple[bytes, int]],
                                    placements: list[tuple[bytes, list[str]]],
                                    match: str) -> None:
    register(mgr, "b1")
    f = new_file(mgr.store, "f")
    lease = mgr.open_write(f, "c")
    with pytest.raises(InvalidArgument, match=match):
        mgr.commit_version(lease.lease_id, f, chunks, placements)
    assert mgr.store.getattr(f).version == 0


def test_commit_length_must_match_the_index(mgr: Manager) -> None:
    register(mgr, "b1")
    f = new_file(mgr.store, "f")
    commit(mgr, f, [(cid(1), 10)])
    lease = mgr.open_write(f, "c")
    with pytest.raises(InvalidArgument, match="length 10 in the index"):
        mgr.commit_version(lease.lease_id, f, [(cid(1), 11)], [])


def test_commit_adds_new_locations_of_known_chunks(mgr: Manager) -> None:
    register(mgr, "b1", port=1)
    register(mgr, "b2", port=2)
    f = new_file(mgr.store, "f")
    commit(mgr, f, [(cid(1), 10)], place_on="b1")
    lease = mgr.open_write(f, "c")
    mgr.commit_version(lease.lease_id, f, [(cid(1), 10)], [(cid(1), ["b2", "b1"])])
    rec = mgr.store.chunk(cid(1))
    assert rec is not None and list(rec.benefactor_ids) == ["b1", "b2"]


def test_commit_to_an_unlinked_file_is_not_found(mgr: Manager) -> None:
    register(mgr, "b1")
    f = new_file(mgr.store, "f")
    lease = mgr.open_write(f, "c")
    mgr.store.unlink(ROOT_INODE, "f")
    with pytest.raises(NotFound):
        mgr.commit_version(lease.lease_id, f, [(cid(1), 10)], [(cid(1), ["b1"])])
    assert mgr.store.chunk(cid(1)) is None


def test_block_map_and_stats_of_unknown_versions(mgr: Manager) -> None:
    store = mgr.store
    f = new_file(store, "f")
    bm = mgr.block_map(f)
    assert (bm.version, bm.size, len(bm.chunks)) == (0, 0, 0)
    with pytest.raises(NotFound):
        mgr.block_map(f, 1)
    with pytest.raises(NotFound):
        store.version_stats(f)
    with pytest.raises(NotFound):
        mgr.block_map(777)
    with pytest.raises(IsADirectory):
        mgr.block_map(ROOT_INODE)


def test_reopen_keeps_everything(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "metadata.lmdb"
    with MetadataStore(path, map_size=64 * MiB) as store:
        mgr = Manager(store, clock=clock)
        register(mgr, "b1")
        d = store.mkdir(ROOT_INODE, "d", 0o755).inode
        f = new_file(store, "f", d)
        commit(mgr, f, [(cid(1), 10), (cid(2), 20)])
        commit(mgr, f, [(cid(2), 20)])
        store.update_pool("default", stripe_width=5)
        before = (store.getattr(f), mgr.block_map(f, 1), mgr.block_map(f, 2),
                  store.version_stats(f), store.inode_count())
    with MetadataStore(path, map_size=64 * MiB) as store:
        mgr = Manager(store, clock=clock)
        after = (store.getattr(f), mgr.block_map(f, 1), mgr.block_map(f, 2),
                 store.version_stats(f), store.inode_count())
        assert after == before
        assert store.lookup(d, "f").inode == f
        assert store.pool("default").stripe_width == 5
        assert store.refcount_mismatches() == {}
        assert new_file(store, "g") > f
        # Registrations persist; liveness does not.
        assert [(s.info.id, s.alive) for s in mgr.registry.statuses()] == [("b1", False)]


def test_schema_mismatch_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "metadata.lmdb"
    MetadataStore(path, map_size=64 * MiB).close()
    env = lmdb.open(str(path), max_dbs=16)
    with env.begin(write=True, db=env.open_db(b"meta")) as txn:
        txn.put(b"schema", b"99")
    env.close()
    with pytest.raises(ConfigError, match="schema"):
        MetadataStore(path, map_size=64 * MiB)


def test_full_map_is_no_space(tmp_path: Path, clock: Clock) -> None:
    with MetadataStore(tmp_path / "small.lmdb", map_size=1 * MiB) as store:
        mgr = Manager(store, clock=clock)
        register(mgr, "b1")
        f = new_file(store, "f")
        chunks = [(cid(i), 10) for i in range(30_000)]  # 1.2 MB of block-map alone
        lease = mgr.open_write(f, "c")
        with pytest.raises(NoSpace, match="map-size"):
            mgr.commit_version(lease.lease_id, f, chunks, [(c, ["b1"]) for c, _ in chunks])
        assert store.getattr(f).version == 0  # and the store still works


# --- leases -------------------------------------------------------------------------------

def test_write_lease_expires_unless_renewed(mgr: Manager, clock: Clock) -> None:
    register(mgr, "b1")
    f = new_file(mgr.store, "f")
    lease = mgr.open_write(f, "c")
    assert lease.lease_ttl_ms == 60_000
    clock.now += 50
    assert mgr.renew_lease(lease.lease_id) == 60_000
    clock.now += 50  # 100 s after opening, 50 s after renewing
    register(mgr, "b1")  # keep the benefactor alive
    mgr.commit_version(lease.lease_id, f, [(cid(1), 1)], [(cid(1), ["b1"])])
    lease = mgr.open_write(f, "c")
    clock.now += 61
    with pytest.raises(LeaseExpired, match="expired"):
        mgr.renew_lease(lease.lease_id)
    with pytest.raises(LeaseExpired):
        mgr.commit_version(lease.lease_id, f, [(cid(1), 1)], [])
    assert mgr.store.getattr(f).version == 1


def test_lease_is_consumed_and_bound_to_its_inode(mgr: Manager) -> None:
    register(mgr, "b1")
    f, g = new_file(mgr.store, "f"), new_file(mgr.store, "g")
    lease = mgr.open_write(f, "c")
    with pytest.raises(LeaseExpired, match=f"inode {f}"):
        mgr.commit_version(lease.lease_id, g, [], [])
    mgr.commit_version(lease.lease_id, f, [], [])
    # A repeat of the same commit is answered with its version (tests/unit/test_pruning_
    # commits.py); other content on a used lease is refused.
    assert mgr.commit_version(lease.lease_id, f, [], [])[0] == 1
    with pytest.raises(LeaseExpired, match="committed already"):
        mgr.commit_version(lease.lease_id, f, [(cid(1), 1)], [(cid(1), ["b1"])])
    with pytest.raises(LeaseExpired):
        mgr.renew_lease(12345)
    lease = mgr.open_write(f, "c")
    mgr.abort_write(lease.lease_id)
    mgr.abort_write(lease.lease_id)  # idempotent
    mgr.abort_write(999)
    with pytest.raises(LeaseExpired):
        mgr.commit_version(lease.lease_id, f, [], [])
    assert mgr.store.getattr(f).version == 1


def test_expired_leases_are_forgotten(mgr: Manager, clock: Clock) -> None:
    register(mgr, "b1")
    f = new_file(mgr.store, "f")
    for _ in range(5):
        mgr.open_write(f, "c")
    assert len(mgr.leases) == 5
    clock.now += 120
    register(mgr, "b1")
    mgr.open_write(f, "c")
    assert len(mgr.leases) == 1


# --- open-write placement and the registry ------------------------------------------------

def test_open_write_errors(mgr: Manager, clock: Clock) -> None:
    f = new_file(mgr.store, "f")
    with pytest.raises(Unavailable, match="no live benefactor"):
        mgr.open_write(f, "c")
    register(mgr, "full", free=0)
    with pytest.raises(NoSpace):
        mgr.open_write(f, "c")
    register(mgr, "b1")
    with pytest.raises(IsADirectory):
        mgr.open_write(ROOT_INODE, "c")
    with pytest.raises(NotFound):
        mgr.open_write(4242, "c")
    assert [t.id for t in mgr.open_write(f, "c").targets] == ["b1"]
    clock.now += 5.1  # every benefactor lease runs out: nobody live (retryable)
    with pytest.raises(Unavailable):
        mgr.open_write(f, "c")
    assert len(mgr.leases) == 1


def test_placement_round_robin(mgr: Manager) -> None:
    for i in range(4):
        register(mgr, f"b{i}", port=7000 + i)
    f = new_file(mgr.store, "f")
    firsts = []
    for _ in range(5):
        reply = mgr.open_write(f, "c")
        ids = [t.id for t in reply.targets]
        assert len(ids) == 3 == len(set(ids))
        firsts.append(ids[0])
        start = int(ids[0][1:])
        assert ids == [f"b{(start + k) % 4}" for k in range(3)]
        assert reply.targets[0].address == f"127.0.0.1:{7000 + start}"
        assert reply.pool == mgr.store.pool("default")
    assert firsts == ["b0", "b1", "b2", "b3", "b0"]


def test_stripe_width_is_capped_by_available_benefactors(mgr: Manager) -> None:
    mgr.store.update_pool("default", stripe_width=8)
    register(mgr, "b1")
    register(mgr, "b2")
    register(mgr, "b3", free=0)
    reply = mgr.open_write(new_file(mgr.store, "f"), "c")
    assert sorted(t.id for t in reply.targets) == ["b1", "b2"]


def test_register_validates_identity(mgr: Manager) -> None:
    bad = [("", "h:1"), ("a b", "h:1"), ("x" * 129, "h:1"), ("ok", "nohostport"),
           ("ok", "h:0"), ("ok", "h:65536"), ("ok", ":80"), ("ok", "h:http")]
    for bid, address in bad:
        with pytest.raises(InvalidArgument):
            mgr.registry.register(benefactor_pb2.BenefactorInfo(id=bid, address=address))
    with pytest.raises(InvalidArgument, match="pool"):
        mgr.registry.register(benefactor_pb2.BenefactorInfo(
            id="ok", address="h:1", pool="nope"))
    mgr.registry.register(benefactor_pb2.BenefactorInfo(id="A-z_0.9", address="[::1]:70"))
    assert mgr.store.benefactors().keys() == {"A-z_0.9"}


def test_heartbeats_and_liveness(mgr: Manager, store: MetadataStore, clock: Clock) -> None:
    info = benefactor_pb2.BenefactorInfo(id="b1", address="h:1", capacity_bytes=100,
                                         free_bytes=60, chunks=3)
    with pytest.raises(NotFound, match="register"):
        mgr.registry.heartbeat(info)
    mgr.registry.register(info)
    clock.now += 4
    info.free_bytes = 50
    mgr.registry.heartbeat(info)
    clock.now += 4
    [status] = mgr.registry.statuses()
    assert status.alive and status.last_heartbeat_age_ms == 4000
    assert status.info.free_bytes == 50 and status.info.pool == "default"
    assert mgr.statfs() == manager_pb2.StatFsResponse(capacity_bytes=100, free_bytes=50,
                                                      files=1)
    moved = benefactor_pb2.BenefactorInfo(id="b1", address="h:2")
    with pytest.raises(NotFound, match="register again"):
        mgr.registry.heartbeat(moved)
    clock.now += 2
    assert not mgr.registry.is_alive("b1")
    assert mgr.statfs().capacity_bytes == 0
    # A restarted manager knows the registration but not the liveness, until a heartbeat.
    restarted = Manager(store, ManagerConfig(benefactor_lease_s=5), clock=clock)
    [status] = restarted.registry.statuses()
    assert not status.alive and status.last_heartbeat_age_ms == -1
    restarted.registry.heartbeat(info)
    assert restarted.registry.is_alive("b1")


def test_find_and_locate_chunks(mgr: Manager, clock: Clock) -> None:
    register(mgr, "b1", port=1)
    register(mgr, "b2", port=2)
    f = new_file(mgr.store, "f")
    commit(mgr, f, [(cid(1), 10)], place_on="b1")
    commit(mgr, f, [(cid(1), 10), (cid(2), 10)], place_on="b2")
    assert mgr.find_chunks([cid(1), cid(2), cid(3), cid(1)]) == [True, True, False, True]
    reply = mgr.locate_chunks([cid(2), cid(3), cid(2)])
    assert [(loc.id, list(loc.benefactor_ids)) for loc in reply.locations] == [(cid(2), ["b2"])]
    assert [(b.id, b.address) for b in reply.benefactors] == [("b2", "127.0.0.1:2")]
    clock.now += 3
    register(mgr, "b2", port=2)  # only b2 keeps its lease
    clock.now += 3
    assert mgr.find_chunks([cid(1), cid(2)]) == [False, True]
    with pytest.raises(InvalidArgument, match="32 bytes"):
        mgr.find_chunks([cid(1), b"../x"])
    with pytest.raises(InvalidArgument, match="at most"):
        mgr.find_chunks([cid(1)] * (MAX_FIND_CHUNKS + 1))
    with pytest.raises(InvalidArgument):
        mgr.locate_chunks([b""])


def test_block_map_lists_live_replicas_first(mgr: Manager, clock: Clock) -> None:
    register(mgr, "b1", port=1)
    register(mgr, "b2", port=2)
    f = new_file(mgr.store, "f")
    lease = mgr.open_write(f, "c")
    mgr.commit_version(lease.lease_id, f, [(cid(1), 10)], [(cid(1), ["b1", "b2"])])
    assert list(mgr.block_map(f).locations[0].benefactor_ids) == ["b1", "b2"]
    clock.now += 4
    register(mgr, "b2", port=2)
    clock.now += 4
    assert list(mgr.block_map(f).locations[0].benefactor_ids) == ["b2", "b1"]


# --- pools --------------------------------------------------------------------------------

def test_update_pool_validates_and_keeps_what_is_not_given(store: MetadataStore) -> None:
    out = store.update_pool("default", replication=2, chunker="fixed:65536")
    assert (out.replication, out.stripe_width, out.chunker) == (2, 3, "fixed:65536")
    assert store.update_pool("default") == out
    for kwargs in ({"chunker": "cdc:1:3:8"}, {"chunker": "fixed:x"}, {"chunker": "rabin:4"},
                   {"chunker": "fixed:0"}, {"chunker": f"fixed:{64 * MiB + 1}"},
                   {"replication": 0}, {"stripe_width": -1}, {"write_semantics": "eventual"},
                   {"hash_backend": "tpu"}):
        with pytest.raises(ConfigError):
            store.update_pool("default", **kwargs)  # type: ignore[arg-type]
    assert store.pool("default") == out
    with pytest.raises(NotFound):
        store.update_pool("nope", replication=1)


def test_concurrent_operations_from_threads(mgr: Manager) -> None:
    """The gRPC worker threads share one store: writers serialise, readers see snapshots,
    and no update is lost."""
    from concurrent.futures import ThreadPoolExecutor

    store = mgr.store
    register(mgr, "b1")
    d = store.mkdir(ROOT_INODE, "d", 0o755).inode

    def work(i: int) -> int:
        f = new_file(store, f"f{i}", d)
        commit(mgr, f, [(cid(i % 7), 10), (cid(100), 10)])
        store.readdir(d)
        store.mkdir(d, f"sub{i}", 0o755)
        return f

    with ThreadPoolExecutor(16) as pool:
        inodes = list(pool.map(work, range(64)))
    assert len(set(inodes)) == 64
    assert store.getattr(d).nlink == 2 + 64
    assert refcount(store, cid(100)) == 64
    assert store.refcount_mismatches() == {}


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


def _holdings_by_scan(store: MetadataStore) -> dict[str, set[bytes]]:
    """Benefactor -> the chunk ids whose records name it, by reading every record."""
    out: dict[str, set[bytes]] = {}
    with store.transaction() as tx:
        for key, raw in tx.txn.cursor(db=tx.db.chunks):
            rec = metadata_pb2.ChunkRecord.FromString(raw)
            for bid in {*rec.benefactor_ids, *(h for h in rec.fragment_holders if h)}:
                out.setdefault(bid, set()).add(bytes(key))
    return out


def _holdings_by_index(store: MetadataStore, bids: list[str]) -> dict[str, set[bytes]]:
    found = {bid: set(store.chunks_on(bid, fragments=True)) for bid in bids}
    return {bid: ids for bid, ids in found.items() if ids}


def test_holdings_index_follows_every_change_of_the_chunk_index(tmp_path: Path) -> None:
    bids = ["b1", "b2", "b3", "b4"]
    with MetadataStore(tmp_path / "m.lmdb", map_size=64 * MiB) as store:
        for i, bid in enumerate(bids):
            store.register_benefactor(bid, f"127.0.0.1:{7000 + i}", "", 10**12, 10**11, 0)
        f = new_file(store, "f")
        ids = [cid(i) for i in range(20)]
        store.commit_version(f, [(c, 10) for c in ids], [(c, ["b1", "b2"]) for c in ids])
        assert _holdings_by_index(store, bids) == _holdings_by_scan(store)
        assert store.add_chunk_locations([(ids[0], "b3"), (ids[1], "b4")]) == 2
        assert store.chunks_on("b3") == [ids[0]]
        store.remove_benefactor("b2")
        assert store.chunks_on("b2", fragments=True) == []
        assert _holdings_by_index(store, bids) == _holdings_by_scan(store)
        store.unlink(ROOT_INODE, "f")  # refcount 0: the records stay until collected
        assert _holdings_by_index(store, bids) == _holdings_by_scan(store)
        assert fsck(store).findings == []
        # A page at a time, in chunk id order, and the end said.
        page = store.held_by("b1", b"", 7)
        assert len(page.ids) == 7 and not page.end and page.ids == sorted(page.ids)
        rest = store.held_by("b1", page.last, 100)
        assert rest.end and set(page.ids) | set(rest.ids) == set(ids)
        assert not set(page.ids) & set(rest.ids)


def test_schema_1_store_gains_the_holdings_index_at_open(tmp_path: Path) -> None:
    """A store of schema 1 (no holdings index) is indexed at its first open, also after an
    upgrade cut short (a partial index, the schema still 1)."""
    path = tmp_path / "metadata.lmdb"
    with MetadataStore(path, map_size=64 * MiB) as store:
        store.register_benefactor("b1", "127.0.0.1:7000", "", 10**12, 10**11, 0)
        store.register_benefactor("b2", "127.0.0.1:7001", "", 10**12, 10**11, 0)
        f = new_file(store, "f")
        ids = [cid(i) for i in range(5)]
        store.commit_version(f, [(c, 10) for c in ids], [(c, ["b1", "b2"]) for c in ids])
    for leftover in (False, True):
        env = lmdb.open(str(path), max_dbs=16)
        with env.begin(write=True) as txn:
            holdings = env.open_db(b"holdings", txn=txn)
            txn.drop(holdings, delete=False)
            if leftover:  # a half-built index, and a stale entry
                txn.put(b"b1\0" + ids[0], b"", db=holdings)
                txn.put(b"b9\0" + ids[1], b"", db=holdings)
            txn.put(b"schema", b"1", db=env.open_db(b"meta", txn=txn))
        env.close()
        with MetadataStore(path, map_size=64 * MiB) as store:
            assert sorted(store.chunks_on("b2")) == sorted(ids)
            assert store.chunks_on("b9") == []
            assert fsck(store).findings == []
            with store.transaction() as tx:
                assert tx.txn.get(b"schema", db=tx.db.meta) == b"2"
