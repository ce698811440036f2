"""The manager's replication on a real metadata store: events, not periodic scans, make the
copies; dead, full and unreachable benefactors are neither sources nor targets from the
moment they are known to be so; no blind period after a start; honest figures.

The copy function stands for the benefactor-to-benefactor push (the RPC): it records what
was asked and answers as a benefactor would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from mosafs import metrics
from mosafs.manager.core import Manager, ManagerConfig
from mosafs.manager.metadata import ROOT_INODE, MetadataStore
from tests.unit.managers import Clock, cid, commit, new_file, register

MiB = 1 << 20
PORTS = {"b1": 7001, "b2": 7002, "b3": 7003}
ADDRESS = {f"127.0.0.1:{p}": b for b, p in PORTS.items()}


class Copies:
    """Records every copy asked for; TARGET_PROBLEM[b] makes copies to b fail so."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, int]] = []
        self.target_problem: dict[str, str] = {}

    def __call__(self, source: str, target: str, ids: Sequence[bytes],
                 timeout: float) -> tuple[list[bool], str]:
        assert timeout >= 10, "every copy request has a deadline"
        self.asked.append((ADDRESS[source], ADDRESS[target], len(ids)))
        problem = self.target_problem.get(ADDRESS[target], "")
        return [not problem] * len(ids), problem

    def targets(self) -> set[str]:
        return {t for _, t, _ in self.asked}


def manager(store: MetadataStore, clock: Clock, copies: Copies) -> Manager:
    store.update_pool("default", replication=2, write_semantics="optimistic")
    return Manager(store, ManagerConfig(benefactor_lease_s=5), clock=clock, copy=copies)


def settle(mgr: Manager, rounds: int = 500) -> None:
    """Steps until nothing is queued or in flight (the background loop's work, now)."""
    assert mgr.replicator is not None
    for _ in range(rounds):
        mgr.replicator.step()
        if not mgr.replicator.busy():
            return
        time.sleep(0.01)  # copies run in the replicator's threads
    raise AssertionError("replication did not settle")


def redundant_observations() -> float:
    family = metrics.MANAGER_REDUNDANT_SECONDS.collect()[0]
    return next(s.value for s in family.samples if s.name.endswith("_count"))


def join(mgr: Manager, *bids: str, free: int = 10**12) -> None:
    for bid in bids:
        register(mgr, bid, port=PORTS[bid], free=free)


def test_unit_a_commit_short_of_copies_is_copied_at_once(
        store: MetadataStore, clock: Clock) -> None:
    copies = Copies()
    mgr = manager(store, clock, copies)
    join(mgr, "b1", "b2", "b3")
    commit(mgr, new_file(store, "f"), [(cid(1), MiB), (cid(2), MiB)], place_on="b1")
    assert mgr.replicator is not None
    before = redundant_observations()
    settle(mgr)  # no pass interval, no lease to wait for: the commit is the event
    assert copies.asked and {s for s, _, _ in copies.asked} == {"b1"}
    for c in (cid(1), cid(2)):
        assert len(store.chunk(c).benefactor_ids) == 2  # type: ignore[union-attr]
    figures, rate = mgr.replicator.figures()
    assert (figures.under_replicated_chunks, figures.lost_chunks) == (0, 0)
    assert rate > 0 and mgr.replicator.time_to_full_redundancy() == 0
    # The commit's close-to-redundant time went into the histogram, once.
    assert redundant_observations() == before + 1


def test_unit_no_blind_period_after_a_start_and_presumed_copies_count(
        tmp_path: Path, clock: Clock) -> None:
    copies = Copies()
    path = tmp_path / "m.lmdb"
    with MetadataStore(path, map_size=64 * MiB) as store:
        first = manager(store, clock, copies)
        join(first, "b1", "b2", "b3")
        commit(first, new_file(store, "f"), [(cid(1), MiB)], place_on="b1")
        settle(first)
        assert sorted(store.chunk(cid(1)).benefactor_ids) in (  # type: ignore[union-attr]
            ["b1", "b2"], ["b1", "b3"])
    holders = None
    with MetadataStore(path, map_size=64 * MiB) as store:
        copies.asked.clear()
        clock.now += 1  # a restart: nobody has sent a heartbeat yet
        mgr = manager(store, clock, copies)
        holders = list(store.chunk(cid(1)).benefactor_ids)  # type: ignore[union-attr]
        silent = next(b for b in holders if b != "b1")
        talking = sorted({"b1", "b2", "b3"} - {silent})
        join(mgr, *talking)
        # A commit right after the start is examined at once.
        commit(mgr, new_file(store, "g"), [(cid(2), MiB)], place_on="b1")
        settle(mgr)
        assert copies.asked, "nothing copied during the first lease after a start"
        assert len(store.chunk(cid(2)).benefactor_ids) == 2  # type: ignore[union-attr]
        # The silent holder is presumed alive for one lease: its copy counts, nothing is
        # copied for cid(1) meanwhile.
        assert all(n == 1 for *_, n in copies.asked)
        assert mgr.registry.presumed() == {silent}
        copies.asked.clear()
        clock.now += 6  # the lease ran out without a word from it: dead, copied at once
        join(mgr, *talking)
        settle(mgr)
        assert copies.asked and copies.targets() <= set(talking)
        rec = store.chunk(cid(1))
        assert rec is not None and len([b for b in rec.benefactor_ids if b != silent]) == 2


def test_unit_full_and_unreachable_targets_are_not_chosen(
        store: MetadataStore, clock: Clock) -> None:
    copies = Copies()
    mgr = manager(store, clock, copies)
    join(mgr, "b1", "b3")
    join(mgr, "b2", free=8 * MiB)  # reported itself full: no target, from that heartbeat
    commit(mgr, new_file(store, "f"), [(cid(n), MiB) for n in range(5)], place_on="b1")
    settle(mgr)
    assert copies.targets() == {"b3"}

    # A target found full by a copy is marked full at once, one found unreachable avoided.
    copies.asked.clear()
    join(mgr, "b2")  # room again
    copies.target_problem = {"b2": "full"}
    commit(mgr, new_file(store, "g"), [(cid(10), MiB), (cid(11), MiB)], place_on="b3")
    settle(mgr)
    assert not mgr.registry.takes("b2")
    assert copies.asked.count(("b3", "b2", 2)) <= 1  # tried once, then never again
    assert ("b3", "b1", 2) in copies.asked or ("b3", "b1", 1) in copies.asked
    copies.asked.clear()
    copies.target_problem = {"b1": "unreachable"}
    join(mgr, "b2")
    commit(mgr, new_file(store, "h"), [(cid(20), MiB)], place_on="b3")
    settle(mgr)
    tried = [t for _, t, _ in copies.asked]
    assert tried.count("b1") <= 1 and tried[-1] == "b2"


def test_unit_status_names_a_pool_that_cannot_reach_r(
        store: MetadataStore, clock: Clock) -> None:
    copies = Copies()
    mgr = manager(store, clock, copies)
    join(mgr, "b1", "b2")
    store.update_pool("other", create=True, replication=1)
    mgr.move_benefactor("b2", "other")  # the default pool (R=2) keeps one benefactor
    commit(mgr, new_file(store, "f"), [(cid(1), MiB)], place_on="b1")
    settle(mgr)
    status = mgr.cluster_status()
    assert status.under_replicated_chunks == 1
    assert list(status.redundancy_unreachable) == [
        "pool default: R=2 needs 2 live benefactors with space, 1 alive"]
    assert status.time_to_full_redundancy_s == -1  # no ETA that cannot come true
    assert 0 <= status.scanned_age_ms < 1000
    by_id = {b.info.id: b for b in status.benefactors}
    assert not by_id["b1"].full
    stats = mgr.version_stats(store.lookup(ROOT_INODE, "f").inode)
    assert (stats.fully_redundant, stats.short_chunks, stats.lost_chunks) == (False, 1, 0)


def test_unit_a_dead_benefactors_chunks_are_walked_a_page_at_a_time(
        store: MetadataStore, clock: Clock) -> None:
    """What a dead benefactor held comes from the holdings index a page at a time: the
    first copies leave at the first step after the death, the queue never holds all of
    it, and every chunk gets its second copy in the end."""
    from mosafs.manager import replication

    copies = Copies()
    mgr = manager(store, clock, copies)
    join(mgr, "b1", "b2", "b3")
    chunks = 3 * replication.WALK_PAGE + 5
    ino = new_file(store, "big")
    lease = mgr.open_write(ino, "test")
    ids = [cid(i) for i in range(chunks)]
    mgr.commit_version(lease.lease_id, ino, [(c, 1024) for c in ids],
                       [(c, ["b1", "b2"]) for c in ids])
    settle(mgr)
    assert not copies.asked
    assert mgr.replicator is not None
    clock.now += 6  # b2's lease runs out: dead
    join(mgr, "b1", "b3")
    mgr.replicator.step()
    assert copies.asked or mgr.replicator.busy(), "nothing started at the first step"
    assert len(mgr.replicator._queue) <= replication.WALK_BELOW
    settle(mgr, rounds=5000)  # 12,000 copies: a loaded machine needs more steps
    assert sum(n for *_, n in copies.asked) == chunks
    assert {t for _, t, _ in copies.asked} == {"b3"}
    assert all(sorted(store.chunk(c).benefactor_ids) in (["b1", "b2", "b3"], ["b1", "b3"])
               for c in ids[:: replication.WALK_PAGE // 2])  # type: ignore[union-attr]


def test_unit_the_step_after_a_lease_lapses_is_not_a_tick_late(
        store: MetadataStore, clock: Clock) -> None:
    """The loop sleeps until the first running lease would lapse: a death is acted on
    milliseconds after the lease ends, not up to a tick (0.2 s) later."""
    from mosafs.manager import replication

    copies = Copies()
    mgr = manager(store, clock, copies)
    join(mgr, "b1", "b2", "b3")
    ino = new_file(store, "f")
    lease = mgr.open_write(ino, "test")
    mgr.commit_version(lease.lease_id, ino, [(cid(1), 1024)], [(cid(1), ["b1", "b2"])])
    settle(mgr)
    assert mgr.replicator is not None
    assert mgr.replicator.step() == replication.TICK_S  # every lease 5 s from its end
    clock.now += 4.95  # b1 and b3 heartbeat; b2 falls silent 0.05 s before its lapse
    join(mgr, "b1", "b3")
    wait = mgr.replicator.step()
    assert wait == pytest.approx(0.05 + replication.LAPSE_SLACK_S)
    clock.now += wait
    mgr.replicator.step()
    settle(mgr)
    assert copies.asked == [("b1", "b3", 1)], "b2's copy was not replaced after its lapse"


def test_unit_lost_chunks_are_examined_with_backoff_and_at_once_on_a_return(
        store: MetadataStore, clock: Clock) -> None:
    """A chunk with no live copy is examined again after 2 s, then twice as long at each
    try up to a minute (not every 2 s: a store with many lost chunks re-read them all),
    and at once when a benefactor comes back (which can make it whole)."""
    from mosafs.manager import replication

    copies = Copies()
    mgr = manager(store, clock, copies)
    join(mgr, "b1", "b2")
    lost = cid(1)
    commit(mgr, new_file(store, "f"), [(lost, MiB)], place_on="b1")
    copies.target_problem["b2"] = "unreachable"  # the one copy is never made
    settle(mgr)
    clock.now += 6  # b1's lease runs out: its copy is the only one
    join(mgr, "b2")
    settle(mgr)
    assert mgr.cluster_status().lost_chunks == 1
    read: list[bytes] = []
    real = store.chunk_records

    def counting(ids: Sequence[bytes]) -> list:  # type: ignore[type-arg]
        read.extend(ids)
        return real(ids)

    store.chunk_records = counting  # type: ignore[method-assign]
    for _ in range(120):  # four minutes, a step every 2 s
        clock.now += 2
        join(mgr, "b2")
        settle(mgr)
    examined = read.count(lost)
    assert 4 <= examined <= 240 / replication.RETRY_MAX_S + 6, examined
    copies.target_problem.clear()
    clock.now += 1
    join(mgr, "b1", "b2")  # back: the chunk is examined and copied at once
    settle(mgr)
    # examined at once, copied, and examined once more when the copy ended
    assert examined < read.count(lost) <= examined + 2
    assert ("b1", "b2", 1) in copies.asked
    assert mgr.cluster_status().lost_chunks == 0


class HeldCopies(Copies):
    """Copies that wait for `release` before they answer (a copy in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.started = threading.Event()

    def __call__(self, source: str, target: str, ids: Sequence[bytes],
                 timeout: float) -> tuple[list[bool], str]:
        self.started.set()
        assert self.release.wait(30), "the test never released the copy"
        return super().__call__(source, target, ids, timeout)


def test_unit_a_chunk_queued_again_while_it_is_copied_is_copied_once(
        store: MetadataStore, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk queued again while its copy runs (a commit that names it, say) is examined
    with a record read before that copy ended; the copy ending between that read and the
    plan must not make it plan a second copy from the stale record."""
    copies = HeldCopies()
    mgr = manager(store, clock, copies)
    join(mgr, "b1", "b2", "b3")
    ino = new_file(store, "f")
    lease = mgr.open_write(ino, "test")
    c = cid(7)
    mgr.commit_version(lease.lease_id, ino, [(c, 1024)], [(c, ["b1"])])  # one copy short
    replicator = mgr.replicator
    assert replicator is not None
    for _ in range(100):
        replicator.step()
        if copies.started.wait(0.05):
            break
    assert copies.started.is_set(), "the copy did not start"
    replicator.enqueue([c])  # queued again while its copy runs

    read = store.chunk_records

    def read_then_let_the_copy_end(ids: list[bytes]) -> list[object]:
        records = read(ids)  # as the chunk was: one copy
        copies.release.set()
        deadline = time.monotonic() + 30
        while replicator.busy() and c not in replicator._queue:
            assert time.monotonic() < deadline, "the copy did not end"
            time.sleep(0.01)
        return records

    monkeypatch.setattr(store, "chunk_records", read_then_let_the_copy_end)
    replicator.step()
    monkeypatch.setattr(store, "chunk_records", read)
    settle(mgr)
    assert len(copies.asked) == 1, copies.asked
    assert len(store.chunk(c).benefactor_ids) == 2  # type: ignore[union-attr]
