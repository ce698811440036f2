"""Collection of what became garbage (mosafs.manager.garbage, docs/durability.md "Garbage
collection"): what committed transactions leave unreferenced is queued, the safety-net
scan queues older garbage, and the collector keeps the grace period and its rule for
writes in flight. The deletion function stands for the benefactors' DeleteChunks."""

from __future__ import annotations

import pytest

from mosafs.errors import NotFound
from mosafs.manager.core import Manager
from mosafs.manager.fsck import fsck
from mosafs.manager.garbage import CLOCK_SKEW_NS, GarbageCollector
from mosafs.manager.metadata import ROOT_INODE, MetadataStore
from tests.unit.managers import Wall, cid, commit, new_file, two_benefactors

MiB = 1 << 20
GRACE_S = 5.0


@pytest.fixture
def mgr(store: MetadataStore) -> Manager:
    return two_benefactors(store, gc_grace_s=GRACE_S)


def two_copies(mgr: Manager, name: str, chunks: list[bytes]) -> int:
    f = new_file(mgr.store, name)
    commit(mgr, f, [(c, 10) for c in chunks])
    mgr.store.add_chunk_locations([(c, "b2") for c in chunks])
    return f


class Deletions:
    """Stands in for the benefactors' DeleteChunks: what was asked of whom."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, list[bytes], int]] = []

    def __call__(self, address: str, ids: list[bytes], put_before_ns: int) -> tuple[int, int]:
        self.asked.append((address, sorted(ids), put_before_ns))
        return len(ids), 10 * len(ids)

    def by_address(self) -> dict[str, list[bytes]]:
        return {address: ids for address, ids, _ in self.asked}


def collector_of(mgr: Manager, wall: Wall) -> GarbageCollector:
    """A collector on MGR's store and leases with WALL for its clock, told what commits
    leave unreferenced as the manager's own is."""
    collector = GarbageCollector(mgr.store, mgr.leases, grace_s=GRACE_S, wall_ns=wall)
    mgr.store.on_unreferenced = collector.unreferenced
    return collector


def test_committed_transactions_queue_what_they_leave_unreferenced(mgr: Manager) -> None:
    store = mgr.store
    wall = Wall()
    collector = collector_of(mgr, wall)
    ids = [cid(i) for i in range(4)]
    two_copies(mgr, "f", ids)
    assert collector.waiting() == 0
    store.unlink(ROOT_INODE, "f")
    assert collector.waiting() == 4
    # Referenced again before its grace period ended: not collected.
    commit(mgr, new_file(store, "g"), [(ids[0], 10)])
    wall.advance(GRACE_S + 1)
    deletions = Deletions()
    collector.collect({"b1": "a1", "b2": "a2"}, deletions)
    assert deletions.by_address() == {"a1": sorted(ids[1:]), "a2": sorted(ids[1:])}
    assert store.chunk(ids[0]) is not None and all(store.chunk(c) is None for c in ids[1:])
    assert collector.waiting() == 0
    # A failed operation leaves nothing queued.
    with pytest.raises(NotFound):
        store.unlink(ROOT_INODE, "nothing")
    assert collector.waiting() == 0


def test_the_safety_net_scan_queues_older_garbage(mgr: Manager) -> None:
    """The queue is soft state: records left unreferenced before a restart are queued
    when the scan comes across them, with the time they are found."""
    store = mgr.store
    ids = [cid(i) for i in range(3)]
    two_copies(mgr, "f", ids)
    store.unlink(ROOT_INODE, "f")  # told to the manager's collector, not to the new one
    wall = Wall()
    collector = collector_of(mgr, wall)
    assert collector.waiting() == 0
    collector.found([c for c, rec in store.chunk_page(b"", 100) if not rec.refcount])
    collector.found(ids)  # queued once
    assert collector.waiting() == 3
    deletions = Deletions()
    collector.collect({"b1": "a1"}, deletions)
    assert deletions.asked == []  # found now: its grace period starts now
    wall.advance(GRACE_S + 1)
    collector.collect({"b1": "a1"}, deletions)
    assert deletions.by_address() == {"a1": sorted(ids)}


def test_collector_waits_for_the_grace_period_and_for_older_writes(mgr: Manager) -> None:
    store = mgr.store
    ids = [cid(i) for i in range(3)]
    kept = [cid(10)]
    two_copies(mgr, "f", ids)
    two_copies(mgr, "k", kept)
    other = new_file(store, "other")
    older_write = mgr.open_write(other, "test")  # opened before the chunks became garbage
    wall = Wall()
    collector = collector_of(mgr, wall)
    store.unlink(ROOT_INODE, "f")
    live = {"b1": "127.0.0.1:7000", "b2": "127.0.0.1:7001"}
    deletions = Deletions()

    assert collector.collect(live, deletions) > 0  # in their grace period
    wall.advance(GRACE_S + 1)
    collector.collect(live, deletions)  # a write opened before may still reference them
    assert deletions.asked == [] and collector.waiting() == 3

    mgr.abort_write(older_write.lease_id)
    collector.collect(live, deletions)
    assert deletions.by_address() == {"127.0.0.1:7000": sorted(ids),
                                      "127.0.0.1:7001": sorted(ids)}
    # No write open: blobs put since the moment of the decision (less the skew) stay.
    assert {put_before for _, _, put_before in deletions.asked} == {wall.ns - CLOCK_SKEW_NS}
    assert all(store.chunk(c) is None for c in ids)
    assert collector.waiting() == 0
    assert store.chunk(kept[0]) is not None
    assert collector.collected.records == 3 and collector.collected.deleted_chunks == 6
    assert fsck(store).findings == []


def removed_file(mgr: Manager) -> tuple[list[bytes], Wall, GarbageCollector]:
    """A file of two chunks (two copies each) removed in front of a fresh collector."""
    ids = [cid(i) for i in range(2)]
    two_copies(mgr, "f", ids)
    wall = Wall()
    collector = collector_of(mgr, wall)
    mgr.store.unlink(ROOT_INODE, "f")
    return ids, wall, collector


def test_collector_spares_a_write_opened_later_through_the_benefactors(
        mgr: Manager) -> None:
    """A write opened after the chunks became garbage does not hold them up, but blobs
    it put again (mtime after its lease opened) must stay: put_before is its opening."""
    store = mgr.store
    ids, wall, collector = removed_file(mgr)
    later = mgr.open_write(new_file(store, "later"), "test")
    wall.advance(GRACE_S + 1)
    deletions = Deletions()
    collector.collect({"b1": "a1"}, deletions)  # b2 is down: released, asked of nobody
    opened = mgr.leases.oldest_opened_ns()
    assert opened is not None
    assert deletions.asked == [("a1", sorted(ids), opened - CLOCK_SKEW_NS)]
    assert all(store.chunk(c) is None for c in ids)
    mgr.abort_write(later.lease_id)


def test_a_failed_deletion_leaves_orphans_and_the_walk_goes_on(mgr: Manager) -> None:
    from mosafs.errors import Unavailable

    store = mgr.store
    ids, wall, collector = removed_file(mgr)
    wall.advance(GRACE_S + 1)

    def down(address: str, blobs: list[bytes], put_before: int) -> tuple[int, int]:
        raise Unavailable(f"{address} is down")

    collector.collect({"b1": "a1", "b2": "a2"}, down)
    assert all(store.chunk(c) is None for c in ids)  # the inventory rounds find the blobs
    assert collector.collected.deleted_chunks == 0
