"""Erasure-coded pools at the manager (docs/erasure_pools.md): the redundancy setting, the
chunk records and fragment index a commit writes, garbage collection and reconciliation
of fragment blobs, the redundancy figures, and fsck of the fragment index."""

from __future__ import annotations

import argparse
import time

import pytest

from mosafs.argtypes import redundancy_arg
from mosafs.errors import ConfigError, FailedPrecondition, InvalidArgument, NoSpace
from mosafs.ids import chunk_id
from mosafs.manager import pools
from mosafs.manager.core import Manager, ManagerConfig
from mosafs.manager.fsck import fsck
from mosafs.manager.metadata import Fragments, MetadataStore
from mosafs.manager.redundancy_view import Redundancy
from tests.unit.managers import Clock, cid, consistent, new_file, register

# --- the redundancy setting ---------------------------------------------------------------


@pytest.mark.parametrize(("text", "k", "m", "replicas"), [
    ("ec:4+2", 4, 2, 3), ("ec:1+1", 1, 1, 2), ("ec:16+4", 16, 4, 5), ("EC:8+2 ", 8, 2, 3),
    ("replicas:1", 0, 0, 1), ("replicas:3", 0, 0, 3), ("replicas:16", 0, 0, 16),
])
def test_parse_redundancy_accepts(text: str, k: int, m: int, replicas: int) -> None:
    scheme = pools.parse_redundancy(text)
    assert (scheme.k, scheme.m, scheme.replicas) == (k, m, replicas)
    assert scheme.width == (k + m if k else replicas)
    assert pools.parse_redundancy(str(scheme)) == scheme


@pytest.mark.parametrize(("text", "says"), [
    ("ec:0+2", "K (data fragments) must be 1..16, got 0"),
    ("ec:4+0", "ec:4+0 survives no failure"),
    ("ec:40+9", "K (data fragments) must be 1..16, got 40"),
    ("ec:4+9", "M (parity fragments) must be 1..4, got 9"),
    ("replicas:0", "R (copies) must be 1..16, got 0"),
    ("replicas:17", "R (copies) must be 1..16, got 17"),
    ("garbage", "use replicas:R"),
    ("ec:4", "use replicas:R"),
    ("ec:-1+2", "use replicas:R"),
    ("replicas:", "use replicas:R"),
    ("ec:4+2+1", "use replicas:R"),
    ("", "use replicas:R"),
])
def test_parse_redundancy_refuses_with_one_line(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        pools.parse_redundancy(text)
    assert says in refused.value.message
    assert "\n" not in refused.value.message
    assert f"bad redundancy {text[:40]!r}" in refused.value.message
    with pytest.raises(argparse.ArgumentTypeError, match="bad redundancy"):
        redundancy_arg(text)


def test_pool_settings_take_redundancy_and_replication() -> None:
    base = pools.default_settings("p")
    ec = pools.with_overrides(base, redundancy="ec:4+2")
    assert (ec.ec_k, ec.ec_m, ec.replication) == (4, 2, 3)
    assert str(pools.scheme(ec)) == "ec:4+2"
    assert pools.ec_min_chunk(ec) == pools.DEFAULT_EC_MIN_CHUNK  # absent: the default
    back = pools.with_overrides(ec, replication=2)  # the short form of replicas:2
    assert (back.ec_k, back.ec_m, back.replication) == (0, 0, 2)
    assert str(pools.scheme(back)) == "replicas:2"
    assert pools.with_overrides(base, replication=3, redundancy="replicas:3").replication == 3
    with pytest.raises(ConfigError, match="disagree"):
        pools.with_overrides(base, replication=3, redundancy="ec:4+2")
    small = pools.with_overrides(ec, ec_min_chunk=0)
    assert pools.ec_min_chunk(small) == 0
    with pytest.raises(ConfigError, match="threshold"):
        pools.with_overrides(ec, ec_min_chunk=1 << 40)
    broken = pools.with_overrides(ec)
    broken.replication = 5
    with pytest.raises(ConfigError, match="small chunks as 3 copies"):
        pools.check_settings(broken)


def test_store_keeps_the_redundancy(store: MetadataStore) -> None:
    created = store.update_pool("cold", create=True, redundancy="ec:8+2",
                                ec_min_chunk=256 << 10)
    assert str(pools.scheme(created)) == "ec:8+2" and created.replication == 3
    assert store.pool("cold") == created
    with pytest.raises(ConfigError, match="K \\(data fragments\\)"):
        store.update_pool("cold", redundancy="ec:0+2")
    assert store.pool("cold") == created  # a refused change changes nothing


def test_fragment_size_is_designs() -> None:
    assert pools.fragment_size(1, 4) == 64
    assert pools.fragment_size(256, 4) == 64
    assert pools.fragment_size(257, 4) == 128
    assert pools.fragment_size(1 << 20, 4) == 1 << 18


# --- commits, records and the fragment index ----------------------------------------------

def _fragments(n: int, k: int = 4, m: int = 2, holders: tuple[str, ...] | None = None
               ) -> tuple[bytes, Fragments]:
    """A chunk id and a fragment layout for it (fragment ids made up: the manager never
    sees fragment bytes)."""
    ids = tuple(chunk_id(f"fragment {n}.{i}".encode()) for i in range(k + m))
    holders = holders or tuple(f"b{i}" for i in range(k + m))
    return cid(n), Fragments(k, m, ids, holders)


@pytest.fixture
def ec_mgr(store: MetadataStore, clock: Clock) -> Manager:
    config = ManagerConfig(heartbeat_interval_s=1, benefactor_lease_s=5, write_lease_s=60,
                           gc_grace_s=0.0)
    mgr = Manager(store, config, clock=clock)
    store.update_pool("default", redundancy="ec:4+2")
    for i in range(7):
        register(mgr, f"b{i}", port=7000 + i)
    return mgr


def _commit(mgr: Manager, inode: int, chunks: list[tuple[bytes, int]],
            coded: list[tuple[bytes, Fragments]],
            placements: list[tuple[bytes, list[str]]] | None = None) -> int:
    lease = mgr.open_write(inode, "test")
    version, _ = mgr.commit_version(lease.lease_id, inode, chunks, placements or [],
                                    fragments=coded)
    return version


def test_commit_records_fragments_and_indexes_them(ec_mgr: Manager) -> None:
    store = ec_mgr.store
    c, frag = _fragments(1)
    small = cid(2)
    ino = new_file(store, "f")
    _commit(ec_mgr, ino, [(c, 1 << 20), (small, 1000)], [(c, frag)],
            [(small, ["b0", "b1", "b2"])])
    rec = store.chunk(c)
    assert rec is not None and (rec.ec_k, rec.ec_m) == (4, 2)
    assert list(rec.fragment_ids) == list(frag.ids)
    assert list(rec.fragment_holders) == list(frag.holders)
    assert not rec.benefactor_ids
    with store.transaction() as tx:
        for fid in frag.ids:
            assert tx.fragment_owners(fid) == [c]
            assert tx.blob_referenced(fid)
        assert not tx.blob_referenced(chunk_id(b"nothing"))
    assert fsck(store).findings == []
    assert consistent(store)

    # The block-map names the fragments, their holders and whether they are alive.
    bm = ec_mgr.block_map(ino)
    loc = next(loc for loc in bm.locations if loc.id == c)
    assert (loc.ec_k, loc.ec_m, loc.length) == (4, 2, 1 << 20)
    assert list(loc.fragment_holders) == list(frag.holders)
    assert list(loc.fragment_live) == [True] * 6
    assert {b.id for b in bm.benefactors} >= set(frag.holders)
    located = ec_mgr.locate_chunks([c, small])
    assert next(loc for loc in located.locations if loc.id == c).fragment_ids == list(frag.ids)
    assert ec_mgr.find_chunks([c, small]) == [True, True]

    stats = ec_mgr.version_stats(ino)
    assert {(r.redundancy, r.chunks) for r in stats.redundancy} == {("ec:4+2", 1),
                                                                   ("replicas:3", 1)}
    assert stats.fully_redundant


@pytest.mark.parametrize(("change", "why"), [
    (lambda f: Fragments(f.k, f.m, f.ids[:-1], f.holders), "needs 6 fragment ids"),
    (lambda f: Fragments(f.k, f.m, f.ids, ("b0",) * 6), "two of its fragments"),
    (lambda f: Fragments(f.k, f.m, f.ids, ("b0", "b1", "b2", "", "", "")),
     "at least 4 are needed"),
    (lambda f: Fragments(0, 2, f.ids[:2], f.holders[:2]), "outside"),
    (lambda f: Fragments(f.k, f.m, (b"x", *f.ids[1:]), f.holders), "32 bytes"),
    (lambda f: Fragments(f.k, f.m, f.ids, ("nope", *f.holders[1:])), "unknown benefactor"),
])
def test_commit_refuses_bad_fragment_placements(ec_mgr: Manager, change, why: str) -> None:
    c, frag = _fragments(1)
    ino = new_file(ec_mgr.store, "f")
    with pytest.raises(InvalidArgument, match=why):
        _commit(ec_mgr, ino, [(c, 1 << 20)], [(c, change(frag))])
    assert ec_mgr.store.chunk(c) is None
    assert fsck(ec_mgr.store).findings == []


def test_an_ec_chunk_needs_its_fragments_or_a_copy(ec_mgr: Manager) -> None:
    ino = new_file(ec_mgr.store, "f")
    with pytest.raises(FailedPrecondition, match="neither stored nor placed"):
        _commit(ec_mgr, ino, [(cid(9), 1 << 20)], [])


def test_open_write_refuses_an_ec_pool_narrower_than_k_plus_m(store: MetadataStore,
                                                               clock: Clock) -> None:
    mgr = Manager(store, clock=clock)
    store.update_pool("default", redundancy="ec:4+2")
    for i in range(5):
        register(mgr, f"b{i}", port=7000 + i)
    ino = new_file(store, "f")
    with pytest.raises(NoSpace, match="ec:4\\+2: every chunk needs 6 distinct benefactors "
                                      "and the pool has 5"):
        mgr.open_write(ino, "test")
    register(mgr, "b5", port=7005)
    lease = mgr.open_write(ino, "test")
    assert len({t.id for t in lease.targets}) == 6  # K+M distinct targets at least
    assert (lease.pool.ec_k, lease.pool.ec_m) == (4, 2)


# --- garbage collection and reconciliation ------------------------------------------------

def test_gc_keeps_fragments_of_referenced_chunks_and_releases_dropped_ones(
        ec_mgr: Manager) -> None:
    store = ec_mgr.store
    kept, kept_frag = _fragments(1)
    gone, gone_frag = _fragments(2)
    ino_kept, ino_gone = new_file(store, "kept"), new_file(store, "gone")
    _commit(ec_mgr, ino_kept, [(kept, 1 << 20)], [(kept, kept_frag)])
    _commit(ec_mgr, ino_gone, [(gone, 1 << 20)], [(gone, gone_frag)])
    old = time.time_ns() - 10**10  # put long before: no grace, no lease spares them
    for i in range(6):
        inventory = [(kept_frag.ids[i], old), (gone_frag.ids[i], old)]
        release, _ = ec_mgr.report_inventory(f"b{i}", inventory)
        assert release == [], "referenced fragments are never released"
    store.unlink(1, "gone")
    assert store.chunk(gone) is not None  # refcount 0: waits for its fragments to go
    for i in range(6):
        inventory = [(kept_frag.ids[i], old), (gone_frag.ids[i], old)]
        release, _ = ec_mgr.report_inventory(f"b{i}", inventory)
        assert release == [gone_frag.ids[i]]
    assert store.chunk(gone) is None, "the record goes with its last fragment"
    with store.transaction() as tx:
        assert all(tx.fragment_owners(f) == [] for f in gone_frag.ids)
        assert all(tx.fragment_owners(f) == [kept] for f in kept_frag.ids)
    rec = store.chunk(kept)
    assert rec is not None and list(rec.fragment_holders) == list(kept_frag.holders)
    assert fsck(store).findings == []


def test_a_blob_that_is_both_a_fragment_and_a_chunk_stays_while_either_is_needed(
        ec_mgr: Manager) -> None:
    store = ec_mgr.store
    c, frag = _fragments(1)
    twin = frag.ids[0]  # a whole chunk whose bytes equal fragment 0 of C
    a, b = new_file(store, "a"), new_file(store, "b")
    _commit(ec_mgr, a, [(c, 1 << 20)], [(c, frag)])
    _commit(ec_mgr, b, [(twin, 1 << 18)], [], [(twin, ["b0", "b6"])])
    old = time.time_ns() - 10**10
    store.unlink(1, "b")  # the whole chunk is garbage; the fragment is not
    # b0 holds it as fragment 0 of C: needed. b6 held only the whole copy, which nothing
    # needs now (fragment 0's slot is b0's): released.
    assert ec_mgr.report_inventory("b0", [(twin, old)])[0] == []
    assert ec_mgr.report_inventory("b6", [(twin, old)])[0] == [twin]
    store.unlink(1, "a")
    assert ec_mgr.report_inventory("b0", [(twin, old)])[0] == [twin]
    assert store.chunk(twin) is None
    rec = store.chunk(c)
    assert rec is not None and rec.fragment_holders[0] == ""
    assert fsck(store).findings == []


def test_reconciliation_fills_an_empty_fragment_slot(ec_mgr: Manager) -> None:
    store = ec_mgr.store
    c, frag = _fragments(1)
    ino = new_file(store, "f")
    _commit(ec_mgr, ino, [(c, 1 << 20)], [(c, frag)])
    # Scrub found fragment 5 missing on b5: its slot empties.
    assert store.remove_chunk_locations("b5", [frag.ids[5]]) == 1
    rec = store.chunk(c)
    assert rec is not None and rec.fragment_holders[5] == ""
    view = Redundancy(store, ec_mgr.registry)
    assert view.missing(rec) == 1 and not view.lost(rec)
    now = time.time_ns()
    # b0 already holds fragment 0: it is never recorded for a second fragment.
    ec_mgr.report_inventory("b0", [(frag.ids[5], now)])
    assert store.chunk(c).fragment_holders[5] == ""  # type: ignore[union-attr]
    ec_mgr.report_inventory("b6", [(frag.ids[5], now)])
    assert store.chunk(c).fragment_holders[5] == "b6"  # type: ignore[union-attr]
    assert fsck(store).findings == []


# --- redundancy figures, removal, fsck ----------------------------------------------------

def test_fragment_counts_make_a_chunk_short_or_lost(ec_mgr: Manager, clock: Clock) -> None:
    store = ec_mgr.store
    c, frag = _fragments(1)
    ino = new_file(store, "f")
    _commit(ec_mgr, ino, [(c, 1 << 20)], [(c, frag)])
    clock.now += 3
    for i in (0, 1, 2, 3, 6):  # b4 and b5 fall silent
        register(ec_mgr, f"b{i}", port=7000 + i)
    clock.now += 3
    rec = store.chunk(c)
    assert rec is not None
    view = Redundancy(store, ec_mgr.registry)
    assert view.missing(rec) == 2 and not view.lost(rec)
    assert view.label(rec) == "ec:4+2"
    stats = ec_mgr.version_stats(ino)
    assert (stats.short_chunks, stats.lost_chunks, stats.fully_redundant) == (1, 0, False)
    assert ec_mgr.find_chunks([c]) == [True]  # 4 live fragments: readable
    clock.now += 3
    for i in (0, 1, 2, 6):  # b3 too: 3 of 4 needed
        register(ec_mgr, f"b{i}", port=7000 + i)
    clock.now += 3
    view = Redundancy(store, ec_mgr.registry)
    assert view.lost(rec)
    assert ec_mgr.find_chunks([c]) == [False]  # the next writer stores it again
    bm = ec_mgr.block_map(ino)
    assert list(bm.locations[0].fragment_live) == [True, True, True, False, False, False]


def test_removing_a_benefactor_empties_its_fragment_slots(ec_mgr: Manager,
                                                          clock: Clock) -> None:
    store = ec_mgr.store
    c, frag = _fragments(1)
    ino = new_file(store, "f")
    _commit(ec_mgr, ino, [(c, 1 << 20)], [(c, frag)])
    clock.now += 10  # every benefactor silent: dead
    with pytest.raises(FailedPrecondition, match="fewer than R copies elsewhere"):
        ec_mgr.remove_benefactor("b2")
    assert ec_mgr.remove_benefactor("b2", force=True) == 1
    rec = store.chunk(c)
    assert rec is not None and rec.fragment_holders[2] == ""
    assert fsck(store).findings == []


def test_fsck_finds_and_repairs_the_fragment_index(ec_mgr: Manager) -> None:
    store = ec_mgr.store
    c, frag = _fragments(1)
    ino = new_file(store, "f")
    _commit(ec_mgr, ino, [(c, 1 << 20)], [(c, frag)])
    stray = chunk_id(b"stray") + chunk_id(b"no such chunk")
    with store.transaction(write=True) as tx:
        tx.txn.delete(frag.ids[3] + c, db=tx.db.fragments)
        tx.txn.put(stray, b"", db=tx.db.fragments)
        rec = tx.chunk(c)
        assert rec is not None
        rec.fragment_holders[4] = "b1"  # b1 holds fragment 1 already
        tx.put_chunk(c, rec)
    kinds = sorted(f.kind for f in fsck(store).findings)
    assert kinds == ["fragment_holder", "fragment_index", "fragment_index"]
    fsck(store, repair=True)
    assert fsck(store).findings == []
    with store.transaction() as tx:
        assert tx.fragment_owners(frag.ids[3]) == [c]
        assert tx.fragment_owners(stray[:32]) == []
    assert store.chunk(c).fragment_holders[4] == ""  # type: ignore[union-attr]


def test_scrub_drops_a_missing_fragment_and_reports_it_unrepaired(store: MetadataStore,
                                                                  clock: Clock) -> None:
    from mosafs._proto import benefactor_pb2

    c, frag = _fragments(1)

    def scrub(address: str):  # type: ignore[no-untyped-def]
        yield benefactor_pb2.ScrubProgress(done=True)

    def has(address: str, ids: list[bytes]) -> list[bool]:
        # b3 (port 7003) lost its fragment; every other blob is where the index says.
        return [not (address.endswith(":7003") and i == frag.ids[3]) for i in ids]

    mgr = Manager(store, ManagerConfig(gc_grace_s=0.0), clock=clock, scrub=scrub, has=has,
                  copy=lambda *a: ([], ""))
    store.update_pool("default", redundancy="ec:4+2")
    for i in range(7):
        register(mgr, f"b{i}", port=7000 + i)
    ino = new_file(store, "f")
    _commit(mgr, ino, [(c, 1 << 20)], [(c, frag)])
    try:
        done = list(mgr.scrub())[-1]
    finally:
        assert mgr.replicator is not None
        mgr.replicator.close()
    assert done.done
    by_id = {r.id: r for r in done.results}
    assert by_id["b3"].missing_chunks == 1 and by_id["b3"].unrepaired_chunks == 1
    assert sum(r.missing_chunks for r in done.results) == 1
    assert list(done.unrepaired_ids) == [c]  # no recode function here: it stays short
    rec = store.chunk(c)
    assert rec is not None and rec.fragment_holders[3] == ""
    assert fsck(store).findings == []
