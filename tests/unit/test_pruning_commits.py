"""One close() makes at most one version, whatever the timing (issue 15, point 4).

A CommitVersion whose reply the client never got (a deadline, a dropped connection) may
have been stored; the client sends it again with the same lease, and the manager must
answer with the version the first one stored instead of storing a second, identical
version (which pruning would then count as a step of its own). On a real LMDB store; a
"busy metadata store" is a write transaction held by another thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from mosafs.errors import FailedPrecondition, LeaseExpired, Unavailable
from mosafs.manager.core import Manager
from mosafs.manager.metadata import ROOT_INODE, MetadataStore
from mosafs.manager.pruning import Policy
from tests.unit.managers import Clock, cid, consistent, new_file, refcount, register

CHUNKS = [(cid(1), 100), (cid(2), 50)]
PLACED = [(cid(1), ["b1"]), (cid(2), ["b1"])]


def versions(store: MetadataStore, inode: int) -> list[int]:
    return [v.version for v in store.list_versions(inode)]


def test_unit_a_repeated_commit_returns_the_stored_version(mgr: Manager) -> None:
    register(mgr, "b1")
    f = new_file(mgr.store, "app.n0.1")
    lease = mgr.open_write(f, "c").lease_id
    first = mgr.commit_version(lease, f, CHUNKS, PLACED)
    again = mgr.commit_version(lease, f, CHUNKS, PLACED)  # the reply of the first was lost
    assert again == first and first[0] == 1
    assert versions(mgr.store, f) == [1]
    assert refcount(mgr.store, cid(1)) == 1  # referenced once: nothing stored twice
    assert consistent(mgr.store)


def test_unit_a_used_lease_refuses_other_content(mgr: Manager) -> None:
    register(mgr, "b1")
    f, g = new_file(mgr.store, "f"), new_file(mgr.store, "g")
    lease = mgr.open_write(f, "c").lease_id
    mgr.commit_version(lease, f, CHUNKS, PLACED)
    with pytest.raises(LeaseExpired, match=r"committed already \(version 1\) with other content"):
        mgr.commit_version(lease, f, CHUNKS[:1], [])
    with pytest.raises(LeaseExpired, match=f"is for inode {f}"):
        mgr.commit_version(lease, g, CHUNKS, PLACED)
    assert versions(mgr.store, f) == [1]


def test_unit_the_commit_record_lives_one_lease_ttl(mgr: Manager, clock: Clock) -> None:
    register(mgr, "b1")
    f = new_file(mgr.store, "f")
    lease = mgr.open_write(f, "c").lease_id
    mgr.commit_version(lease, f, CHUNKS, PLACED)
    clock.now += 61
    register(mgr, "b1")
    mgr.open_write(f, "c")  # opens sweep the table
    with pytest.raises(LeaseExpired, match="unknown"):
        mgr.commit_version(lease, f, CHUNKS, PLACED)
    assert versions(mgr.store, f) == [1]


@contextmanager
def busy_store(store: MetadataStore) -> Iterator[Callable[[], None]]:
    """A write transaction held by another thread: commits wait for it. Yields release()."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.transaction(write=True):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    try:
        yield release.set
    finally:
        release.set()
        holder.join()


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = call()
        except Exception as exc:  # handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_unit_a_repeat_during_the_first_commit_waits_for_it(mgr: Manager) -> None:
    register(mgr, "b1")
    f = new_file(mgr.store, "f")
    lease = mgr.open_write(f, "c").lease_id
    with busy_store(mgr.store) as release:
        first, first_out = in_thread(lambda: mgr.commit_version(lease, f, CHUNKS, PLACED))
        time.sleep(0.2)  # the first is stuck in its transaction, its lease claimed
        repeat, repeat_out = in_thread(lambda: mgr.commit_version(lease, f, CHUNKS, PLACED))
        time.sleep(0.2)
        assert repeat.is_alive()  # waiting for the first, not refused, not stored again
        release()
        first.join(10)
        repeat.join(10)
    assert first_out == repeat_out and first_out["result"][0] == 1
    assert versions(mgr.store, f) == [1]


def test_unit_a_repeat_that_waits_too_long_is_told_to_ask_again(mgr: Manager) -> None:
    register(mgr, "b1")
    f = new_file(mgr.store, "f")
    lease = mgr.open_write(f, "c").lease_id
    with busy_store(mgr.store) as release:
        first, out = in_thread(lambda: mgr.commit_version(lease, f, CHUNKS, PLACED))
        time.sleep(0.2)
        with pytest.raises(Unavailable, match="being committed by an earlier request"):
            mgr.leases.claim(lease, f, b"", wait_s=0.1)
        # The client went away meanwhile: its abort must not hide the lease from garbage
        # collection while the commit still runs (its chunks are not referenced yet).
        mgr.abort_write(lease)
        assert mgr.leases.oldest_opened_ns() is not None
        release()
        first.join(10)
    assert out["result"][0] == 1
    assert mgr.leases.oldest_opened_ns() is None
    assert mgr.commit_version(lease, f, CHUNKS, PLACED)[0] == 1  # still answered


def test_unit_a_failed_commit_leaves_the_lease_usable(mgr: Manager) -> None:
    register(mgr, "b1")
    f = new_file(mgr.store, "f")
    lease = mgr.open_write(f, "c").lease_id
    with pytest.raises(FailedPrecondition, match="neither stored nor placed"):
        mgr.commit_version(lease, f, CHUNKS, [])  # chunks placed nowhere: refused
    assert mgr.commit_version(lease, f, CHUNKS, PLACED)[0] == 1
    assert versions(mgr.store, f) == [1]


def test_unit_repeated_commits_never_make_pruning_lose_a_kept_step(mgr: Manager) -> None:
    """The bug report: keep-last 2 over app.n0.1..6 where commits were repeated (a client
    that missed replies): steps 5 and 6 stay, each with one version."""
    register(mgr, "b1")
    d = mgr.store.mkdir(ROOT_INODE, "ckpt", 0o755).inode
    mgr.set_folder(d, pool=None, series_pattern=None, policy=Policy(keep_last=2),
                   clear_policy=False)
    files = {}
    for step in range(1, 7):
        files[step] = f = new_file(mgr.store, f"app.n0.{step}", d)
        lease = mgr.open_write(f, "c").lease_id
        chunks = [(cid(step), 10)]
        for _ in range(3):  # the same commit, sent three times
            mgr.commit_version(lease, f, chunks, [(cid(step), ["b1"])])
    assert [n for n, _ in mgr.store.readdir(d)[0]] == ["app.n0.5", "app.n0.6"]
    assert versions(mgr.store, files[5]) == [1] and versions(mgr.store, files[6]) == [1]
    assert consistent(mgr.store)
