"""Coordination through etcd (mosafs.coordination, docs/coordination.md) against a real
etcd: leader election and takeover, the fencing rule (valid()) after a pause, the in-sync
set written only by the current leader, member records that vanish with their process,
and the private etcd process itself.

The processes that must die (SIGKILL) or pause (SIGSTOP) are `python -c` children of the
test running the same module; everything else runs in threads of the test process. One
etcd serves the whole module; each test has a cluster name of its own.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import etcd3gw
import pytest
from etcd3gw.lease import Lease

from mosafs.coordination import (
    CoordinationUnavailable,
    Coordinator,
    EtcdNotFound,
    EtcdServer,
    LeaderInfo,
    Leadership,
    etcd_server,
    find_etcd,
)
from mosafs.coordination.gateway import parse_endpoint
from mosafs.errors import ConfigError
from tests import harness

TTL = 2.0  # etcd's smallest lease with its default election timeout


def _etcd_missing() -> str | None:
    try:
        find_etcd()
    except EtcdNotFound:
        return ("etcd is not installed (Debian package etcd-server; scripts/setup.sh "
                "installs it)")
    return None


pytestmark = pytest.mark.skipif(_etcd_missing() is not None, reason=str(_etcd_missing()))

# A member in a process of its own. `campaign`: campaign, say "leader", and on SIGCONT
# say whether it is still valid and whether its in-sync write lands; say "lost" when the
# keepalive gives the term up. `publish`: publish a member record and idle.
MEMBER = """
import json, signal, sys, threading, time
from mosafs.coordination import Coordinator

endpoint, cluster, member, ttl, mode = sys.argv[1:6]

def say(**fields):
    print(json.dumps(fields), flush=True)

coord = Coordinator([endpoint], cluster, member, ttl_s=float(ttl))
if mode == "publish":
    coord.publish(member, member + ":7000")
    say(event="published")
    while True:
        time.sleep(1)
leadership = coord.campaign(member + ":7000", lambda: True, threading.Event())

def resumed(signum, frame):
    say(event="resumed", valid=leadership.valid(),
        written=coord.set_in_sync(leadership, {member}))

signal.signal(signal.SIGCONT, resumed)
say(event="leader", epoch=leadership.epoch, valid=leadership.valid())
while not leadership.lost.wait(0.1):
    pass
say(event="lost", valid=leadership.valid())
while True:
    time.sleep(1)
"""


class Child:
    """A MEMBER process; its stdout lines as JSON objects, in order."""

    def __init__(self, etcd: EtcdServer, cluster: str, member: str, mode: str,
                 log_dir: Path) -> None:
        self.member = member
        self.log_path = log_dir / f"{member}.log"
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-P", "-c", MEMBER, etcd.endpoint, cluster, member,
                 str(TTL), mode], stdout=subprocess.PIPE, stderr=log, text=True)
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(json.loads(line))

    def next_line(self, timeout: float) -> dict[str, Any]:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.member} said nothing within {timeout} s; "
                                 f"log:\n{self.log_path.read_text()}") from None

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        """The next line, which must be EVENT, within TIMEOUT seconds."""
        line = self.next_line(timeout)
        assert line["event"] == event, line
        return line

    def said_nothing(self) -> bool:
        return self.lines.empty()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    def reap(self) -> None:
        self.kill(signal.SIGCONT)  # a stopped process takes SIGKILL, but be sure
        self.kill()
        self.popen.wait(timeout=30)
        # The process is gone, so its stdout ends: the reader finishes before the pipe is
        # closed under it (closing first raised in the reader, seen once in a rehearsal).
        self._reader.join(timeout=30)
        assert self.popen.stdout is not None
        self.popen.stdout.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data")
    with server:
        yield server
    assert server.pid is None


@pytest.fixture
def cluster() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def coordinator(etcd: EtcdServer, cluster: str) -> Iterator[Callable[..., Coordinator]]:
    """coordinator(member, **options): a Coordinator of the test's cluster; every one is
    closed, and every Leadership won through `campaign_now` resigned, at the end."""
    made: list[Coordinator] = []

    def make(member: str, **options: Any) -> Coordinator:
        options.setdefault("ttl_s", TTL)
        options.setdefault("poll_s", 0.2)
        made.append(Coordinator(etcd.endpoints, cluster, member, **options))
        return made[-1]

    yield make
    for coord in made:
        coord.close()


@pytest.fixture
def children(etcd: EtcdServer, cluster: str,
             tmp_path: Path) -> Iterator[Callable[[str, str], Child]]:
    started: list[Child] = []

    def start(member: str, mode: str = "campaign") -> Child:
        started.append(Child(etcd, cluster, member, mode, tmp_path))
        return started[-1]

    yield start
    for child in started:
        child.reap()


def raw_client(etcd: EtcdServer) -> etcd3gw.Etcd3Client:
    """A plain etcd3gw client, to change etcd behind mosafs's back."""
    _, host, port = parse_endpoint(etcd.endpoint)
    return etcd3gw.client(host=host, port=port)


def campaign_now(coord: Coordinator, timeout: float = 10) -> Leadership:
    stop = threading.Event()
    timer = threading.Timer(timeout, stop.set)
    timer.start()
    try:
        leadership = coord.campaign(f"{coord.member}:7000", lambda: True, stop)
    finally:
        timer.cancel()
    assert leadership is not None, f"{coord.member} did not win within {timeout} s"
    return leadership


class Campaign:
    """coord.campaign(...) in a thread."""

    def __init__(self, coord: Coordinator, eligible: Callable[[], bool] = lambda: True):
        self.stop = threading.Event()
        self.result: list[Leadership | None] = []
        self.thread = threading.Thread(target=lambda: self.result.append(
            coord.campaign(f"{coord.member}:7000", eligible, self.stop)), daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> Leadership | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the campaign still runs after {timeout} s"
        return self.result[0]

    def cancel(self) -> None:
        self.stop.set()
        self.thread.join(10)
        if self.result and self.result[0] is not None:
            self.result[0].resign()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until PREDICATE() held; fails after TIMEOUT."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout} s"
        time.sleep(0.05)
    return time.monotonic() - started


# -- leader election ----------------------------------------------------------------------


def test_one_of_two_wins_and_the_other_takes_over_when_it_is_killed(
        children: Callable[..., Child], coordinator: Callable[..., Coordinator]) -> None:
    a, b = children("a"), children("b")
    observer = coordinator("observer")
    wait_until(lambda: observer.leader() is not None, 30, "a leader")
    leader = observer.leader()
    assert leader is not None
    winner, loser = (a, b) if leader.member == "a" else (b, a)
    first = winner.expect("leader", 15)
    assert first["valid"] and first["epoch"] == leader.epoch
    assert leader.address == f"{winner.member}:7000"
    time.sleep(2 * TTL)  # the winner's keepalive holds the key past its TTL
    assert observer.leader() == leader and loser.said_nothing()

    winner.kill()
    killed = time.monotonic()
    second = loser.expect("leader", TTL + 10)
    took = time.monotonic() - killed
    assert second["epoch"] > first["epoch"]
    assert took < TTL + 3, f"takeover took {took:.1f} s with a TTL of {TTL} s"
    assert observer.leader() == LeaderInfo(loser.member, f"{loser.member}:7000",
                                           second["epoch"])


def test_a_leader_paused_past_its_lease_is_not_valid_when_it_resumes(
        children: Callable[..., Child], coordinator: Callable[..., Coordinator]) -> None:
    old = children("old")
    first = old.expect("leader", 30)
    old.kill(signal.SIGSTOP)
    paused = time.monotonic()
    new = campaign_now(coordinator("new"), timeout=TTL + 10)  # once the old lease is gone
    assert new.epoch > first["epoch"]
    time.sleep(max(0.0, TTL + 0.5 - (time.monotonic() - paused)))

    old.kill(signal.SIGCONT)
    # Its SIGCONT handler and its keepalive thread (which gives the term up) race; the
    # handler judges by the clock, so it finds the term over either way.
    said = {line["event"]: line for line in (old.next_line(10), old.next_line(10))}
    assert said == {"resumed": {"event": "resumed", "valid": False, "written": False},
                    "lost": {"event": "lost", "valid": False}}
    assert new.valid() and coordinator("observer").leader() == LeaderInfo(
        "new", "new:7000", new.epoch)
    new.resign()


def test_valid_follows_the_send_time_of_the_last_refresh(
        coordinator: Callable[..., Coordinator]) -> None:
    clock = FakeClock()
    coord = coordinator("a", ttl_s=3.0, margin_s=0.6, clock=clock)
    granted = clock.now
    term = campaign_now(coord)
    # Judged by the clock alone, before the first refresh (due a second from now).
    clock.now = granted + 2.3
    assert term.valid() and term.remaining() == pytest.approx(0.1)
    clock.now = granted + 2.5
    assert not term.valid() and term.remaining() == 0.0
    clock.now = granted + 2.0  # (the clock stood still; now it has moved on 2 s)
    wait_until(lambda: term.remaining() > 1.0, 5, "a refresh")  # sent at granted + 2
    clock.now = granted + 4.3
    assert term.valid()
    clock.now = granted + 4.5
    assert not term.valid()
    # The keepalive thread notices at its next wake-up, gives the term up and revokes.
    assert term.lost.wait(5)
    wait_until(lambda: coord.leader() is None, 5, "the leader key to go")


def test_the_lease_stops_being_valid_when_etcd_goes_away(tmp_path: Path) -> None:
    with EtcdServer(tmp_path / "etcd") as server:
        coord = Coordinator(server.endpoints, "gone", "a", ttl_s=TTL, poll_s=0.2)
        try:
            term = campaign_now(coord)
            server.stop()
            assert term.lost.wait(TTL + 2), "the leader did not notice etcd was gone"
            assert not term.valid()
            with pytest.raises(CoordinationUnavailable):
                coord.leader()
        finally:
            coord.close()


@pytest.mark.parametrize("watch_s", [None, 30.0], ids=["default", "long-watches"])
def test_resigning_hands_over_at_once_and_watchers_follow(
        coordinator: Callable[..., Coordinator], watch_s: float | None) -> None:
    """Also with watches that would wait half a minute: the change wakes the follower and
    the waiting campaign at once, and the follower's stop ends its wait at once."""
    options = {} if watch_s is None else {"watch_s": watch_s}
    a, b = coordinator("a"), coordinator("b", **options)
    follower = coordinator("follower", **options)
    seen: list[LeaderInfo | None] = []
    stop = threading.Event()
    watcher = threading.Thread(target=follower.watch_leader, args=(seen.append, stop))
    watcher.start()
    try:
        wait_until(lambda: seen == [None], 5, "the first report")
        term_a = campaign_now(a)
        wait_until(lambda: len(seen) == 2, 1.5, "a's term reported")
        assert seen[1] == LeaderInfo("a", "a:7000", term_a.epoch)
        b_campaign = Campaign(b)
        time.sleep(0.5)
        assert b_campaign.thread.is_alive()
        resigned = time.monotonic()
        assert term_a.resign() and not term_a.valid()
        term_b = b_campaign.join(5)
        assert term_b is not None and term_b.epoch > term_a.epoch
        assert time.monotonic() - resigned < 1.5, "the standby waited for a TTL or a watch"
        wait_until(lambda: seen[-1] == LeaderInfo("b", "b:7000", term_b.epoch), 1.5,
                   "b's term reported")
        term_b.resign()
        wait_until(lambda: seen[-1] is None, 1.5, "the resignation reported")
        time.sleep(0.3)  # the follower waits on its next watch
    finally:
        stopped = time.monotonic()
        stop.set()
        watcher.join(5)
    assert not watcher.is_alive()
    assert time.monotonic() - stopped < 1.0, "the follower's watch outlived its stop"


def test_campaign_returns_none_when_stopped(coordinator: Callable[..., Coordinator]) -> None:
    term = campaign_now(coordinator("a"))
    # A watch that would wait half a minute: the stop ends it, not its timeout.
    waiting = Campaign(coordinator("b", watch_s=30.0))
    time.sleep(0.5)
    stopped = time.monotonic()
    waiting.stop.set()
    assert waiting.join(3) is None
    assert time.monotonic() - stopped < 1.0, "the campaign's watch outlived its stop"
    assert term.valid()
    term.resign()


# -- the in-sync set ----------------------------------------------------------------------


def test_a_member_that_is_not_eligible_does_not_campaign(
        coordinator: Callable[..., Coordinator]) -> None:
    a = coordinator("a")
    eligible = threading.Event()
    campaign = Campaign(a, eligible.is_set)
    try:
        time.sleep(1.0)
        assert a.leader() is None and campaign.thread.is_alive()
        eligible.set()
        term = campaign.join(5)
        assert term is not None and a.leader() == LeaderInfo("a", "a:7000", term.epoch)
    finally:
        campaign.cancel()


def test_a_change_of_the_in_sync_set_during_a_campaign_makes_it_ask_again(
        etcd: EtcdServer, cluster: str, coordinator: Callable[..., Coordinator]) -> None:
    a = coordinator("a")
    assert a.bootstrap_in_sync({"a", "b"})
    raw = raw_client(etcd)
    asked = []

    def eligible() -> bool:
        # The leader drops and re-adds members between this member's look and its try.
        asked.append(time.monotonic())
        if len(asked) == 1:
            raw.put(f"/mosafs/{cluster}/in_sync", json.dumps({"members": ["b"], "epoch": 0}))
        return True

    try:
        term = campaign_now_with(a, eligible)
    finally:
        raw.session.close()
    assert len(asked) == 2, "the try made on a stale look at the in-sync set succeeded"
    term.resign()


def campaign_now_with(coord: Coordinator, eligible: Callable[[], bool]) -> Leadership:
    campaign = Campaign(coord, eligible)
    term = campaign.join(10)
    assert term is not None
    return term


def test_only_the_current_leader_writes_the_in_sync_set(
        etcd: EtcdServer, coordinator: Callable[..., Coordinator]) -> None:
    # A long TTL: the deposed leader's keepalive does not notice within the test, so its
    # write is refused by etcd's compare on the epoch, not by its own valid().
    a, b = coordinator("a", ttl_s=30.0), coordinator("b")
    assert a.in_sync() == (set(), 0)
    assert a.bootstrap_in_sync({"a", "b"}) and not b.bootstrap_in_sync({"b"})
    members, first = a.in_sync()
    assert members == {"a", "b"} and first > 0

    term_a = campaign_now(a)
    assert a.set_in_sync(term_a, {"a"})
    members, second = a.in_sync()
    assert members == {"a"} and second > first

    # a's lease vanishes in etcd (as after a partition) while a still thinks it leads.
    raw = raw_client(etcd)
    try:
        Lease(term_a.lease, raw).revoke()
    finally:
        raw.session.close()
    term_b = campaign_now(b)
    assert term_b.epoch > term_a.epoch
    assert term_a.valid(), "the test needs a deposed leader that does not know it yet"
    assert not a.set_in_sync(term_a, {"a", "b"})
    assert a.in_sync() == ({"a"}, second)
    assert b.set_in_sync(term_b, {"b"})
    assert b.in_sync()[0] == {"b"}
    term_b.resign()
    term_a.resign()


# -- member records -----------------------------------------------------------------------


def test_member_records_vanish_when_their_process_dies(
        children: Callable[..., Child], coordinator: Callable[..., Coordinator]) -> None:
    observer = coordinator("observer")
    observer.publish("observer", "observer:7000")
    standby = children("standby", "publish")
    standby.expect("published", 30)
    records = observer.members()
    assert set(records) == {"observer", "standby"}
    assert records["standby"].address == "standby:7000"
    assert records["observer"].address == "observer:7000"

    time.sleep(2 * TTL)  # kept alive past its TTL while the process lives
    assert "standby" in observer.members()
    standby.kill()
    assert "standby" in observer.members()  # the lease, not the kill, removes it
    took = wait_until(lambda: "standby" not in observer.members(), TTL + 5,
                      "the dead member's record to go")
    assert took <= TTL + 2
    observer.publish("observer", "observer:7001")  # published again: the record follows
    assert observer.members()["observer"].address == "observer:7001"
    observer.close()
    assert coordinator("other").members() == {}


# -- failures -----------------------------------------------------------------------------


def test_an_unreachable_etcd_is_one_clear_error() -> None:
    port = etcd_server.free_port()
    coord = Coordinator([f"http://127.0.0.1:{port}", f"127.0.0.1:{port}"], "c", "a",
                        ttl_s=TTL, poll_s=0.1)
    try:
        with pytest.raises(CoordinationUnavailable, match=f"127.0.0.1:{port}") as caught:
            coord.leader()
        assert caught.value.exit_code == 7
        with pytest.raises(CoordinationUnavailable):
            coord.publish("a", "a:7000")
        stop = threading.Event()
        threading.Timer(0.5, stop.set).start()
        assert coord.campaign("a:7000", lambda: True, stop) is None  # waits, never raises
    finally:
        coord.close()


@pytest.mark.parametrize("endpoint,cluster,member,margin", [
    ("nowhere", "c", "a", None), ("ftp://h:1", "c", "a", None), ("h:1", "c/d", "a", None),
    ("h:1", "c", "", None), ("h:1", "c", "a/b", None), ("h:1", "c", "a", 2.0)])
def test_names_endpoints_and_margins_are_checked(endpoint: str, cluster: str, member: str,
                                                 margin: float | None) -> None:
    with pytest.raises(ConfigError):
        Coordinator([endpoint], cluster, member, ttl_s=2.0, margin_s=margin)


# -- the etcd process ---------------------------------------------------------------------


def test_a_missing_etcd_binary_names_the_package(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EtcdNotFound, match="etcd-server") as caught:
        EtcdServer(tmp_path / "d", binary=str(tmp_path / "no-etcd"))
    assert caught.value.exit_code == 2
    monkeypatch.setattr(etcd_server, "DEFAULT_BINARY", str(tmp_path / "no-etcd"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EtcdNotFound, match="apt-get install etcd-server"):
        EtcdServer(tmp_path / "d")


def test_the_etcd_process_is_stopped_and_keeps_its_data(tmp_path: Path) -> None:
    server = EtcdServer(tmp_path / "etcd", log_path=tmp_path / "etcd.log")
    with server:
        pid = server.pid
        assert pid is not None and harness.pid_alive(pid)
        first_port = server.client_port
        with Coordinator(server.endpoints, "keep", "a") as coord:
            assert coord.bootstrap_in_sync({"a"})
    assert not harness.pid_alive(pid) and server.pid is None
    server.stop()  # a second stop is harmless
    with server:  # a restart on other ports finds the data
        with Coordinator(server.endpoints, "keep", "a") as coord:
            assert coord.in_sync()[0] == {"a"}
        assert server.client_port != first_port or server.attempts > 1
    assert "etcd" in (tmp_path / "etcd.log").read_text()


def test_a_port_race_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = iter([taken])
        real = etcd_server.free_port
        monkeypatch.setattr(etcd_server, "free_port",
                            lambda host="127.0.0.1": next(ports, None) or real(host))
        with EtcdServer(tmp_path / "etcd") as server:
            assert server.attempts == 2 and server.client_port != taken
            with Coordinator(server.endpoints, "race", "a") as coord:
                assert coord.leader() is None


ORPHAN = """
import sys, time
from mosafs.coordination import EtcdServer
server = EtcdServer(sys.argv[1]).start()
print(server.pid, flush=True)
time.sleep(600)
"""


def test_etcd_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-P", "-c", ORPHAN, str(tmp_path / "etcd")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        assert harness.pid_alive(pid)
    finally:
        parent.kill()
        parent.wait(30)
        if parent.stdout:
            parent.stdout.close()
    try:
        wait_until(lambda: not harness.pid_alive(pid), 15, "etcd to die with its parent")
    finally:
        if harness.pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
