"""Garbage collection against the interleavings that could delete what a write in flight or
the index still counts on (docs/durability.md, "Garbage collection"):

- a chunk referenced again and left again: its first sighting or its place in the queue
  from the earlier spell must not date this one (ChunkRecord.unreferenced_ns);
- the same through an erasure-coded chunk's fragments, whose blobs have ids of their own;
- an inventory page that left before the collector deleted a copy must not count it again;
- a paced round reports each page as the store holds it when the page leaves;
- a copy that ends, or is reported, after its benefactor was removed names no one.

Real MetadataStore (LMDB in tmp_path), the real Manager and GarbageCollector; the
collector's wall clock is moved by hand where grace periods must pass.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import blake3
import pytest

from mosafs._proto import benefactor_pb2
from mosafs.benefactor import garbage as benefactor_garbage
from mosafs.benefactor.chunkstore import FileChunkStore
from mosafs.benefactor.store import InventoryItem
from mosafs.errors import FailedPrecondition
from mosafs.ids import chunk_id
from mosafs.manager.core import Manager, ManagerConfig
from mosafs.manager.garbage import GarbageCollector
from mosafs.manager.metadata import ROOT_INODE, Fragments, MetadataStore
from tests.unit.managers import Clock, Wall, cid, commit, new_file, register, two_benefactors

GRACE_S = 5.0


@pytest.fixture
def mgr(store: MetadataStore) -> Manager:
    return two_benefactors(store, gc_grace_s=GRACE_S)


def collector_of(mgr: Manager, wall: Wall) -> GarbageCollector:
    gc = GarbageCollector(mgr.store, mgr.leases, grace_s=GRACE_S, wall_ns=wall)
    mgr.store.on_unreferenced = gc.unreferenced
    return gc


def store_on(mgr: Manager, name: str, c: bytes, bid: str = "b1") -> int:
    """A file NAME whose one chunk C was put on BID and committed."""
    inode = new_file(mgr.store, name)
    lease = mgr.open_write(inode, "writer")
    mgr.commit_version(lease.lease_id, inode, [(c, 10)], [(c, [bid])])
    return inode


def test_a_sighting_from_an_earlier_spell_does_not_date_the_next(mgr: Manager) -> None:
    store, c = mgr.store, cid(1)
    wall = Wall()
    gc = collector_of(mgr, wall)
    # An aborted upload left C on b1: seen, and released once its grace period passed.
    orphan_put = wall.ns - 50 * 10**9
    assert gc.review("b1", [(c, orphan_put)]) == ([], 1)
    wall.advance(GRACE_S + 1)
    assert gc.review("b1", [(c, orphan_put)])[0] == [c]
    # C is put on b1 again and committed; then writer W opens and dedupes it.
    wall.advance(1)
    put_again = time.time_ns()
    store_on(mgr, "f", c)
    g = new_file(store, "g")
    w = mgr.open_write(g, "w")
    assert mgr.find_chunks([c]) == [True]
    # F goes: C became garbage after W opened, so W's commit may reference it.
    store.unlink(ROOT_INODE, "f")
    wall.advance(GRACE_S + 1)
    released, waiting = gc.review("b1", [(c, put_again)])
    assert (released, waiting) == ([], 1)
    mgr.commit_version(w.lease_id, g, [(c, 10)], [])
    rec = store.chunk(c)
    assert rec is not None and rec.refcount == 1 and list(rec.benefactor_ids) == ["b1"]
    assert rec.unreferenced_ns == 0, "a referenced record carries no garbage time"


def test_a_chunk_queued_earlier_and_left_again_after_a_write_opened_stays(
        mgr: Manager) -> None:
    store, c = mgr.store, cid(3)
    wall = Wall()
    gc = collector_of(mgr, wall)
    store_on(mgr, "a", c)
    store.unlink(ROOT_INODE, "a")  # garbage at S1: queued with S1
    store_on(mgr, "b", c)  # referenced again
    g = new_file(store, "g")
    w = mgr.open_write(g, "w")  # W dedupes C
    wall.advance(GRACE_S + 1)
    # "b" goes (S2, after W opened) between the collector taking its due ids off the
    # queue (S1 is due) and reading their records: the interleaving, forced.
    real = store.chunk_records

    def records(ids: Sequence[bytes]) -> list:  # type: ignore[type-arg]
        store.chunk_records = real  # type: ignore[method-assign]
        store.unlink(ROOT_INODE, "b")
        return real(ids)

    store.chunk_records = records  # type: ignore[method-assign]
    asked: list[bytes] = []
    gc.collect({"b1": "a1"}, lambda _a, ids, _p: (asked.extend(ids), (len(ids), 0))[1])
    assert asked == [] and store.chunk(c) is not None
    mgr.commit_version(w.lease_id, g, [(c, 10)], [])
    # Once W has committed and its version goes, C is collected as usual.
    store.unlink(ROOT_INODE, "g")
    wall.advance(GRACE_S + 1)
    gc.collect({"b1": "a1"}, lambda _a, ids, _p: (asked.extend(ids), (len(ids), 0))[1])
    assert asked == [c] and store.chunk(c) is None


def test_fragments_of_a_chunk_left_after_a_write_opened_stay(store: MetadataStore,
                                                              clock: Clock) -> None:
    mgr = Manager(store, ManagerConfig(gc_grace_s=0.0), clock=clock)
    store.update_pool("default", redundancy="ec:2+1")
    for i in range(3):
        register(mgr, f"b{i}", port=7000 + i)
    x = cid(9)
    frag_ids = tuple(chunk_id(f"fragment 9.{i}".encode()) for i in range(3))
    layout = Fragments(2, 1, frag_ids, ("b0", "b1", "b2"))
    old = time.time_ns() - 10 * 10**9
    # The fragment's blob was an orphan on b0 first: seen and released (grace 0).
    assert mgr.report_inventory("b0", [(frag_ids[0], old)])[0] == [frag_ids[0]]
    f = new_file(store, "f")
    lease = mgr.open_write(f, "writer")
    mgr.commit_version(lease.lease_id, f, [(x, 1 << 20)], [], fragments=[(x, layout)])
    g = new_file(store, "g")
    w = mgr.open_write(g, "w")  # W dedupes X
    store.unlink(ROOT_INODE, "f")  # X became garbage after W opened
    released, _ = mgr.report_inventory("b0", [(frag_ids[0], old)])
    assert released == [], "a fragment of a chunk a write in flight may reference"
    mgr.commit_version(w.lease_id, g, [(x, 1 << 20)], [])
    rec = store.chunk(x)
    assert rec is not None and list(rec.fragment_holders) == ["b0", "b1", "b2"]


def test_a_page_listed_before_a_deletion_does_not_count_the_deleted_copy(
        mgr: Manager) -> None:
    store, c = mgr.store, cid(7)
    wall = Wall()
    gc = collector_of(mgr, wall)
    store_on(mgr, "f", c, "b1")
    listed = [(c, time.time_ns())]  # b1's round lists C; the page leaves later
    store.unlink(ROOT_INODE, "f")
    wall.advance(GRACE_S + 1)
    deleted: list[bytes] = []
    gc.collect({"b1": "a1"}, lambda _a, ids, _p: (deleted.extend(ids), (len(ids), 0))[1])
    assert deleted == [c] and store.chunk(c) is None
    store_on(mgr, "g", c, "b2")  # stored anew, on b2 only
    gc.review("b1", listed)
    rec = store.chunk(c)
    assert rec is not None and list(rec.benefactor_ids) == ["b2"]
    # A copy put on b1 after the deletion is a copy: counted.
    wall.advance(5)
    gc.review("b1", [(c, wall.ns + 2 * 10**9)])
    rec = store.chunk(c)
    assert rec is not None and list(rec.benefactor_ids) == ["b2", "b1"]


def test_a_paced_round_reports_each_page_as_it_stands_when_it_leaves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [blake3.blake3(f"page{i}".encode()).digest(length=300 + i) for i in range(3)]
    ids = sorted(chunk_id(d) for d in chunks)
    store = FileChunkStore(tmp_path / "b")
    try:
        for data in chunks:
            store.put(chunk_id(data), data)
        monkeypatch.setattr(benefactor_garbage, "PAGE", 1)
        monkeypatch.setattr(benefactor_garbage, "STALE_S", 0.0)  # every page looked up again
        order = [item.id for item in store.inventory()]
        reported: list[bytes] = []

        def review(page: Sequence[InventoryItem]) -> tuple[list[bytes], int]:
            reported.extend(item.id for item in page)
            if len(reported) == 1:  # the manager deletes the last one meanwhile
                store.delete(order[-1], touched_ns=time.time_ns())
            return [], 0

        benefactor_garbage.GarbageRounds(store, review).run()
        assert reported == order[:2], "a chunk deleted after the listing is not reported"
        assert sorted(order) == ids
    finally:
        store.close()


def test_a_copy_ending_after_its_target_was_removed_names_no_one(
        store: MetadataStore, clock: Clock) -> None:
    store.update_pool("default", replication=2, write_semantics="optimistic")
    mgr: Manager | None = None

    def copy(source: str, target: str, ids: Sequence[bytes],
             timeout: float) -> tuple[list[bool], str]:
        # The target took the copies and died; the operator removes it before they land.
        assert mgr is not None
        clock.now += 10
        mgr.registry.heartbeat(benefactor_pb2.BenefactorInfo(
            id="b1", address="127.0.0.1:7000", capacity_bytes=2 * 10**12,
            free_bytes=10**12))
        mgr.remove_benefactor("b2", force=True)
        return [True] * len(ids), ""

    mgr = Manager(store, ManagerConfig(benefactor_lease_s=5), clock=clock, copy=copy)
    register(mgr, "b1")
    register(mgr, "b2", port=7001)
    c = cid(1)
    commit(mgr, new_file(store, "f"), [(c, 1 << 20)], place_on="b1")
    assert mgr.replicator is not None
    for _ in range(100):
        mgr.replicator.step()
        if not mgr.replicator.busy():
            break
        time.sleep(0.01)
    mgr.replicator.close()
    rec = store.chunk(c)
    assert rec is not None and list(rec.benefactor_ids) == ["b1"]
    assert store.chunks_on("b2", fragments=True) == []
    # Nor does a reconciliation name a benefactor that is not registered.
    assert store.add_chunk_locations([(c, "b9")]) == 0
    assert store.add_fragment_holders([(c, "b9")]) == 0


def test_a_commit_without_the_chunk_after_its_collection_is_refused(mgr: Manager) -> None:
    """What the rules above protect: a write that deduped a chunk collected meanwhile
    fails at commit (EIO for its close), never commits a version of a lost chunk."""
    store, c = mgr.store, cid(11)
    wall = Wall()
    gc = collector_of(mgr, wall)
    store_on(mgr, "f", c)
    store.unlink(ROOT_INODE, "f")
    wall.advance(GRACE_S + 1)
    gc.collect({"b1": "a1"}, lambda _a, ids, _p: (len(ids), 0))
    g = new_file(store, "g")
    w = mgr.open_write(g, "w")
    with pytest.raises(FailedPrecondition, match="neither stored nor placed"):
        mgr.commit_version(w.lease_id, g, [(c, 10)], [])
