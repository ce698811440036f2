"""A standby's follower thread (mosafs.rpc.follow) against an active manager's feed in
this process (its gRPC FeedAddress and its framed feed, plaintext): it follows, and what
fails while it does is reported and retried, a bug (no MosafsError) included, with its
traceback: the thread lives on. The processes are tested in tests/services/test_standby.py."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mosafs.manager import follow_servicer
from mosafs.manager.follow_servicer import Feed
from mosafs.manager.metadata import MetadataStore
from mosafs.manager.standby import Standby
from mosafs.procutil import listen
from mosafs.rpc import follow
from mosafs.rpc.follow import Follower
from tests.unit.test_replog import MAP, dump, start_log, workload


@pytest.fixture
def active(tmp_path: Path) -> Iterator[tuple[MetadataStore, str]]:
    """An active manager's store (with its log and feed), and its gRPC address."""
    store = MetadataStore(tmp_path / "active" / "metadata.lmdb", map_size=MAP)
    journal = start_log(store)
    feed = Feed(journal, store, tmp_path / "spool", "127.0.0.1", 0).start()
    srv, port = listen(follow_servicer.add_to_server(feed.port), "127.0.0.1:0",
                       label="manager")
    try:
        yield store, f"127.0.0.1:{port}"
    finally:
        journal.close()
        feed.close()
        srv.stop(0).wait()
        store.close()


def wait_until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_bug_while_following_is_logged_and_the_follower_goes_on(
        active: tuple[MetadataStore, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    store, address = active
    monkeypatch.setattr(follow, "RETRY_S", 0.05)
    (tmp_path / "standby").mkdir()
    standby = Standby(tmp_path / "standby", map_size=MAP)
    follower = Follower(address, standby, "s1")
    try:
        with caplog.at_level(logging.INFO, "mosafs.rpc.follow"):
            follower.start()
            workload(store, "first")
            wait_until(lambda: standby.position() == store.log_position(), "caught up")
            # The standby's next settle fails with what no MosafsError is (a bug, as
            # lmdb.BadValsizeError was for an entry with an empty key): the fault, once.
            settle = standby.settle
            failed: list[int] = []

            def fails_once() -> None:
                if not failed:
                    failed.append(1)
                    raise RuntimeError("a bug in applying entries")
                settle()

            monkeypatch.setattr(standby, "settle", fails_once)
            workload(store, "second")
            wait_until(lambda: bool(failed), "the fault was met")
            # The thread lived: it connected again and follows on.
            workload(store, "third")
            wait_until(lambda: standby.position() == store.log_position() and
                       not standby.unsettled, "caught up again")
        bugs = [r for r in caplog.records if "bug while following" in r.getMessage()]
        assert len(bugs) == 1 and bugs[0].exc_info is not None
        assert bugs[0].levelno == logging.ERROR
        assert dump(standby.store) == dump(store)
    finally:
        follower.stop()
        standby.close()
