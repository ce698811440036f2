"""fsck of the manager's metadata (mosafs.manager.fsck): a healthy store has no findings;
each kind of damage, made directly in LMDB through the store's transaction, is found by a
check that changes nothing, fixed by a repair, and gone on the next check."""

from __future__ import annotations

import struct

import pytest

from mosafs._proto import metadata_pb2
from mosafs.manager.core import Manager, ManagerConfig
from mosafs.manager.fsck import fsck
from mosafs.manager.metadata import DB_NAMES, ROOT_INODE, MetadataStore
from tests.unit.managers import Clock, cid, commit, new_file, register

U64 = struct.Struct(">Q")
VKEY = struct.Struct(">QQ")


@pytest.fixture
def mgr(store: MetadataStore) -> Manager:
    m = Manager(store, ManagerConfig(), clock=Clock())
    register(m, "b1")
    register(m, "b2", port=7001)
    return m


def populated(mgr: Manager) -> dict[str, int]:
    """Two files (one with two versions sharing a chunk), a directory, an attribute."""
    store = mgr.store
    d = store.mkdir(ROOT_INODE, "dir", 0o755).inode
    f = new_file(store, "f")
    g = new_file(store, "g", parent=d)
    commit(mgr, f, [(cid(1), 10), (cid(2), 20), (cid(1), 10)])
    commit(mgr, f, [(cid(1), 10), (cid(3), 30)])
    commit(mgr, g, [(cid(3), 30), (cid(4), 40)], place_on="b2")
    store.setxattr(g, "user.tag", b"x")
    return {"dir": d, "f": f, "g": g}


def kinds(result: object) -> list[str]:
    return sorted(f.kind for f in result.findings)  # type: ignore[attr-defined]


def raw(store: MetadataStore) -> dict[str, dict[bytes, bytes]]:
    """Every key and value of every sub-database (to show a check changes nothing)."""
    with store.transaction() as tx:
        return {name: {bytes(k): bytes(v) for k, v in tx.txn.cursor(db=getattr(tx.db, name))}
                for name in (db.decode() for db in DB_NAMES)}


def test_unit_fsck_healthy_store_has_no_findings(mgr: Manager) -> None:
    populated(mgr)
    result = fsck(mgr.store)
    assert result.findings == []
    assert (result.inodes, result.dirents, result.versions, result.chunks) == (4, 3, 3, 4)
    assert mgr.fsck(repair=True).findings == []


def test_unit_fsck_finds_and_repairs_chunk_index_damage(mgr: Manager) -> None:
    populated(mgr)
    store = mgr.store
    with store.transaction(write=True) as tx:
        rec = tx.chunk(cid(1))
        rec.refcount = 7  # really 3
        rec.benefactor_ids.extend(["ghost", "b1"])  # unknown, duplicate
        tx.put_chunk(cid(1), rec)
        tx.txn.delete(cid(4), db=tx.db.chunks)  # referenced, no record; its holdings stay
        tx.put_chunk(cid(9), metadata_pb2.ChunkRecord(length=5, refcount=2,
                                                      benefactor_ids=["b2"]))  # unreferenced
    before = raw(store)
    result = fsck(store)
    assert kinds(result) == ["duplicate_location", "holdings_index", "missing_chunk_record",
                             "refcount", "refcount", "unknown_benefactor"]
    assert all(f.repairable for f in result.findings)
    assert raw(store) == before, "a check must change nothing"
    assert store.refcount_mismatches()

    repaired = fsck(store, repair=True)
    assert repaired.repaired and kinds(repaired) == kinds(result)
    assert fsck(store).findings == []
    assert store.refcount_mismatches() == {}
    one = store.chunk(cid(1))
    assert one is not None and one.refcount == 3 and list(one.benefactor_ids) == ["b1"]
    four = store.chunk(cid(4))  # recreated; inventory rounds will name its holders
    assert four is not None and (four.length, four.refcount) == (40, 1)
    assert list(four.benefactor_ids) == []
    nine = store.chunk(cid(9))
    assert nine is not None and nine.refcount == 0  # garbage, left to collection


def test_unit_fsck_finds_and_repairs_namespace_damage(mgr: Manager) -> None:
    ino = populated(mgr)
    store = mgr.store
    f, g, d = ino["f"], ino["g"], ino["dir"]
    with store.transaction(write=True) as tx:
        tx.link(ROOT_INODE, b"dangling", 999)  # names no inode
        tx.txn.delete(VKEY.pack(f, 1), db=tx.db.blockmaps)  # version 1 without block-map
        tx.txn.put(VKEY.pack(g, 5), b"", db=tx.db.blockmaps)  # block-map without version
        tx.txn.put(VKEY.pack(777, 1), metadata_pb2.VersionRecord(size=1).SerializeToString(),
                   db=tx.db.versions)  # version of a missing inode
        tx.txn.put(U64.pack(888) + b"user.x", b"v", db=tx.db.xattrs)  # orphan attribute
        grec = tx.inode(g)
        grec.nlink = 3
        grec.size = 1
        tx.put_inode(g, grec)
        drec = tx.inode(d)
        drec.parent = 42
        tx.put_inode(d, drec)
        orphan = tx.allocate_inode()  # a file no dirent names
        tx.put_inode(orphan, metadata_pb2.InodeRecord(kind=2, mode=0o644, nlink=1))
        tx.txn.put(b"next_inode", U64.pack(2), db=tx.db.meta)
    result = fsck(store)
    assert kinds(result) == ["dangling_blockmap", "dangling_dirent", "dangling_version",
                             "dangling_version", "directory_parent", "next_inode", "nlink",
                             "orphan_inode", "orphan_xattr", "refcount", "refcount", "size"]
    # the two refcounts: the dropped version 1 named chunk 1 twice and chunk 2 once
    fsck(store, repair=True)
    assert fsck(store).findings == []
    assert store.nlink_mismatches() == {} and store.xattr_orphans() == []
    assert store.refcount_mismatches() == {}
    assert store.versions(f) == [2]  # version 1 lost its block-map: dropped
    one = store.chunk(cid(2))
    assert one is not None and one.refcount == 0  # only version 1 named it
    assert store.getattr(g).size == 70 and store.getattr(g).nlink == 1
    assert store.getattr(d).nlink == 2
    new = store.create(ROOT_INODE, "after", 0o644).inode
    assert new > orphan  # the counter was raised past every inode


def test_unit_fsck_missing_newest_version_and_unrepairable_findings(mgr: Manager) -> None:
    ino = populated(mgr)
    store = mgr.store
    f = ino["f"]
    with store.transaction(write=True) as tx:
        tx.txn.delete(VKEY.pack(f, 2), db=tx.db.versions)
        tx.txn.put(VKEY.pack(f, 1), b"x" * 41, db=tx.db.blockmaps)  # not 40*N bytes
        rec = tx.chunk(cid(3))
        rec.length = 31  # block-maps say 30
        tx.put_chunk(cid(3), rec)
    result = fsck(store, repair=True)
    unfixable = sorted(x.kind for x in result.findings if not x.repairable)
    assert unfixable == ["bad_blockmap", "chunk_length"]
    assert "newest_version" in kinds(result) and "dangling_blockmap" in kinds(result)
    after = fsck(store)
    assert sorted(x.kind for x in after.findings) == ["bad_blockmap", "chunk_length"]
    assert store.getattr(f).version == 1
