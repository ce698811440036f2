"""The metadata store's versions, block-maps and chunk index (refcounts, the holdings
index), through the write protocol (core.Manager) on a real LMDB environment in
tmp_path."""

from __future__ import annotations

import struct
from pathlib import Path

import lmdb
import pytest

from mosafs._proto import metadata_pb2
from mosafs.errors import (
    ConfigError,
    FailedPrecondition,
    InvalidArgument,
    IsADirectory,
    NoSpace,
    NotFound,
)
from mosafs.manager import metadata
from mosafs.manager.core import Manager
from mosafs.manager.fsck import fsck
from mosafs.manager.metadata import ROOT_INODE, MetadataStore
from tests.unit.managers import Clock, MiB, cid, commit, new_file, refcount, register

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


def test_holdings_index_follows_commits_that_reference_stored_chunks(tmp_path: Path) -> None:
    """A commit that only counts a reference to a stored chunk leaves its holdings alone
    (Tx.put_chunk, `holders_same`); one that names a new holder of it, or one in the same
    commit that does, still updates them."""
    bids = ["b1", "b2", "b3"]
    with MetadataStore(tmp_path / "m.lmdb", map_size=64 * MiB) as store:
        for i, bid in enumerate(bids):
            store.register_benefactor(bid, f"127.0.0.1:{7000 + i}", "", 10**12, 10**11, 0)
        ids = [cid(i) for i in range(12)]
        f1, f2 = new_file(store, "f1"), new_file(store, "f2")
        store.commit_version(f1, [(c, 10) for c in ids[:8]], [(c, ["b1"]) for c in ids[:8]])
        # ids[:4] gain b2, ids[4:8] only gain a reference, ids[8:] are new on b3; ids[0]
        # twice in the block-map
        store.commit_version(f2, [(c, 10) for c in [ids[0], *ids]],
                             [*[(c, ["b2"]) for c in ids[:4]], *[(c, ["b3"]) for c in ids[8:]]])
        assert _holdings_by_index(store, bids) == _holdings_by_scan(store)
        assert store.chunks_on("b2") == sorted(ids[:4])
        assert [refcount(store, c) for c in ids] == [3, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1]
        store.commit_version(f2, [(c, 10) for c in ids[4:]], [])  # references only
        store.unlink(ROOT_INODE, "f1")  # releases: refcounts only
        assert _holdings_by_index(store, bids) == _holdings_by_scan(store)
        assert [refcount(store, c) for c in ids[4:]] == [2, 2, 2, 2, 2, 2, 2, 2]
        assert fsck(store).findings == []


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
