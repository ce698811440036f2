"""Group commit (mosafs.manager.groupcommit) on a real LMDB environment: bodies queued
together share one transaction and one commit; each body's result or error reaches its
own caller only after that commit; a body that raises is rolled back alone; what was
acknowledged is on disk when the environment is opened again."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import lmdb
import pytest

from mosafs.manager.groupcommit import GroupCommitter


@pytest.fixture
def env(tmp_path: Path) -> Iterator[lmdb.Environment]:
    e = lmdb.open(str(tmp_path / "db"), map_size=1 << 24, sync=True, metasync=True)
    yield e
    e.close()


def put(key: bytes, value: bytes = b"v") -> Callable[[lmdb.Transaction], bytes]:
    def body(txn: lmdb.Transaction) -> bytes:
        txn.put(key, value)
        return key
    return body


def test_bodies_queued_together_share_one_commit(env: lmdb.Environment) -> None:
    committer = GroupCommitter(env)
    release = threading.Event()
    started = threading.Event()

    def blocker(txn: lmdb.Transaction) -> str:
        started.set()
        assert release.wait(10)
        txn.put(b"first", b"1")
        return "first"

    with ThreadPoolExecutor(12) as pool:
        first = pool.submit(committer.run, blocker)
        assert started.wait(10)
        rest = [pool.submit(committer.run, put(b"k%02d" % i)) for i in range(10)]
        # The ten wait behind the first group's transaction, none acknowledged yet.
        assert not any(f.done() for f in rest)
        while committer._queue.qsize() < 10:  # all ten queued before the first commits
            threading.Event().wait(0.01)
        release.set()
        assert first.result(10) == "first"
        assert sorted(f.result(10) for f in rest) == [b"k%02d" % i for i in range(10)]
    committer.close()
    assert committer.bodies == 11 and committer.groups == 2  # the first, then the ten
    with env.begin() as txn:
        assert txn.get(b"first") == b"1" and txn.get(b"k09") == b"v"


def test_a_failing_body_is_rolled_back_alone_and_later_bodies_see_earlier_ones(
        env: lmdb.Environment) -> None:
    committer = GroupCommitter(env)
    release = threading.Event()

    def hold(txn: lmdb.Transaction) -> None:
        assert release.wait(10)
        txn.put(b"a", b"1")

    def half_then_fail(txn: lmdb.Transaction) -> None:
        txn.put(b"half", b"x")
        raise ValueError("refused")

    def reads(txn: lmdb.Transaction) -> list[bytes | None]:
        return [txn.get(k) for k in (b"a", b"b", b"half")]

    with ThreadPoolExecutor(4) as pool:
        held = pool.submit(committer.run, hold)
        while committer._queue.qsize() or not held.running():
            threading.Event().wait(0.01)
        # One group: a write, a body that fails half-way, a read of both.
        writer = pool.submit(committer.run, put(b"b", b"2"))
        while committer._queue.qsize() < 1:
            threading.Event().wait(0.01)
        failing = pool.submit(committer.run, half_then_fail)
        while committer._queue.qsize() < 2:
            threading.Event().wait(0.01)
        reader = pool.submit(committer.run, reads)
        while committer._queue.qsize() < 3:
            threading.Event().wait(0.01)
        release.set()
        held.result(10)
        assert writer.result(10) == b"b"
        with pytest.raises(ValueError, match="refused"):
            failing.result(10)
        assert reader.result(10) == [b"1", b"2", None]
    committer.close()
    assert committer.groups == 2
    with env.begin() as txn:
        assert txn.get(b"a") == b"1" and txn.get(b"b") == b"2" and txn.get(b"half") is None


def test_a_full_map_fails_that_body_only(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path / "small"), map_size=64 * 4096, sync=True)
    committer = GroupCommitter(env)
    with pytest.raises(lmdb.MapFullError):
        committer.run(put(b"big", b"x" * (1 << 20)))
    assert committer.run(put(b"small")) == b"small"
    committer.close()
    with env.begin() as txn:
        assert txn.get(b"small") == b"v" and txn.get(b"big") is None
    env.close()


def test_acknowledged_writes_are_there_after_reopening(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    env = lmdb.open(path, map_size=1 << 24, sync=True, metasync=True)
    committer = GroupCommitter(env)
    with ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda i: committer.run(put(b"n%03d" % i)), range(200)))
    committer.close()
    env.close()
    assert len(done) == 200
    again = lmdb.open(path, map_size=1 << 24)
    with again.begin() as txn:
        assert sum(1 for _ in txn.cursor()) == 200
    again.close()


def test_a_body_cannot_start_another_write_and_a_closed_committer_refuses(
        env: lmdb.Environment) -> None:
    committer = GroupCommitter(env)

    def nested(txn: lmdb.Transaction) -> None:
        committer.run(put(b"inner"))

    with pytest.raises(RuntimeError, match="wait for itself"):
        committer.run(nested)
    committer.close()
    with pytest.raises(RuntimeError, match="closed"):
        committer.run(put(b"late"))


def test_bodies_run_together_share_one_commit_and_each_gets_its_own_outcome(
        env: lmdb.Environment) -> None:
    committer = GroupCommitter(env)

    def refused(txn: lmdb.Transaction) -> bytes:
        txn.put(b"refused", b"x")
        raise PermissionError("no")

    bodies = [put(b"a%d" % i) for i in range(3)] + [refused] + [put(b"a3")]
    outcomes, seq = committer.run_together(bodies)
    assert [ok for ok, _ in outcomes] == [True, True, True, False, True]
    assert [v for ok, v in outcomes if ok] == [b"a0", b"a1", b"a2", b"a3"]
    assert isinstance(outcomes[3][1], PermissionError)
    assert seq == 0  # no replication log attached
    assert committer.groups == 1 and committer.bodies == 5
    with env.begin() as txn:
        assert txn.get(b"refused") is None and txn.get(b"a3") == b"v"
    committer.close()


def test_a_batch_is_never_cut_into_groups(env: lmdb.Environment) -> None:
    """A batch larger than MAX_GROUP stays one group: it came as one item of the queue."""
    committer = GroupCommitter(env, max_group=4)
    outcomes, _ = committer.run_together([put(b"c%02d" % i) for i in range(10)])
    assert all(ok for ok, _ in outcomes) and committer.groups == 1
    # Lone bodies queued behind a running group still fill the next one up to MAX_GROUP.
    assert committer.run(put(b"lone")) == b"lone" and committer.groups == 2
    with pytest.raises(ValueError):
        committer.run_together([])
    committer.close()
    with pytest.raises(RuntimeError, match="closed"):
        committer.run_together([put(b"late")])
