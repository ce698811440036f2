"""`mosafs up --managers 3` (docs/coordination.md): three managers elect the active one
through a private etcd; what `close()` acknowledged survives the loss of the active
manager's process and disk, a standby takes over by itself, and writes go on.

Faults as they happen: SIGKILL of the active manager with its data directory deleted
(`up` paused meanwhile, so that it cannot start the manager again before the directory
is gone), and a pause (SIGSTOP) of the active manager past its election lease."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import blake3

from tests import harness
from tests.conftest import UpCluster

MiB = 1 << 20
TAKEOVER_S = 10.0  # the bound: a standby is active within this of the failure
# What a failure makes the others say (every process of the cluster logs to one folder).
FAILOVER_NOISE = [
    r"WARNING mosafs\.up\[\d+\]: manager (manager|manager-\d) exited with status",
    r"WARNING mosafs\.benefactor\[\d+\]: manager [\d.:,]+ unreachable",
    r"WARNING mosafs\.coordination\[\d+\]: member \w+ is no longer leader",
    r"ERROR mosafs\.manager\[\d+\]: this manager is no longer the active one",
    r"WARNING mosafs\.coordination\[\d+\]: .*cannot refresh the leader lease",
]


def _data(seed: str, size: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=size)


def _actives(cluster: UpCluster) -> list[tuple[str, dict[str, Any]]]:
    """(name, ready record) of every live manager whose ready file says it is active (a
    paused one that lost its lease still says so)."""
    found = []
    for path in sorted((cluster.data_dir / "run").glob("manager*.ready.json")):
        try:
            ready = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being rewritten
        if ready.get("role") == "active" and harness.pid_alive(int(ready["pid"])):
            found.append((path.name.removesuffix(".ready.json"), ready))
    return found


def _active(cluster: UpCluster) -> tuple[str, dict[str, Any]]:
    found = _actives(cluster)
    assert len(found) == 1, found
    return found[0]


def _wait_new_active(cluster: UpCluster, old_pid: int, timeout: float) -> tuple[str, float]:
    """The name of the manager that became active after OLD_PID, and how long it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        for name, ready in _actives(cluster):
            if ready["pid"] != old_pid:
                return name, time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"no standby became active within {timeout} s")


class Series:
    """A checkpoint series written in a thread: every file whose close() returned is
    remembered with its bytes; a close that failed (EIO during a failover) is counted."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.closed: dict[str, bytes] = {}
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        step = 0
        while not self._stop.is_set():
            name, data = f"model.0.{step}", _data(f"series {step}", MiB + 4096 * step)
            try:
                with open(self.folder / name, "wb") as f:
                    f.write(data)
                self.closed[name] = data
            except OSError:
                self.failed += 1
                time.sleep(0.2)
            step += 1

    def __enter__(self) -> Series:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def wait_more(self, count: int, timeout: float = 60) -> None:
        want = len(self.closed) + count
        deadline = time.monotonic() + timeout
        while len(self.closed) < want:
            assert time.monotonic() < deadline, f"writes did not go on: {len(self.closed)}"
            time.sleep(0.1)


@contextmanager
def _paused(pid: int) -> Iterator[None]:
    harness.pause(pid)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _check_all(cluster: UpCluster, series: Series) -> None:
    for name, data in series.closed.items():
        assert (series.folder / name).read_bytes() == data, name
    assert harness.cli("fsck", str(cluster.mountpoint)).returncode == 0


def test_fuse_failover_after_the_active_managers_process_and_disk_are_lost(
        start_cluster: Callable[..., UpCluster]) -> None:
    cluster = start_cluster("--managers", "3", expected_noise=FAILOVER_NOISE)
    assert len(cluster.info["managers"]) == 3 and str(cluster.info["etcd"]).startswith("http")
    folder = cluster.mountpoint / "ckpt"
    folder.mkdir()
    with Series(folder) as series:
        series.wait_more(3)
        name, ready = _active(cluster)
        with _paused(cluster.proc.popen.pid):  # `up` would start it again at once
            os.kill(int(ready["pid"]), signal.SIGKILL)
            shutil.rmtree(cluster.data_dir / name)
        new, took = _wait_new_active(cluster, int(ready["pid"]), TAKEOVER_S)
        assert new != name and took <= TAKEOVER_S
        series.wait_more(3)  # writes go on through the new active manager
    assert len(series.closed) >= 6
    _check_all(cluster, series)
    # The lost manager came back empty, as a standby, and caught up from a snapshot.
    member = (cluster.data_dir / name / "manager.id").read_text().strip()
    active_log = cluster.data_dir / "logs" / f"{new}.log"
    harness.wait_for(lambda: f"standby {member} is in sync" in active_log.read_text(),
                     timeout=60, what=f"{name} to catch up")
    back = json.loads((cluster.data_dir / "run" / f"{name}.ready.json").read_text())
    assert back["role"] == "standby" and back["member"] == member
    assert back["address"] == ready["address"]  # on its own address again
    status = harness.cli_json("status", "--data-dir", str(cluster.data_dir))
    shown = {m["member"]: m for m in status["managers"]}
    assert len(shown) == 3 and shown[member]["role"] == "standby"
    assert shown[member]["in_sync"] and shown[member]["address"] == ready["address"]
    assert [m["role"] for m in status["managers"]].count("active") == 1


def test_fuse_a_paused_manager_acknowledges_nothing_after_its_lease(
        start_cluster: Callable[..., UpCluster]) -> None:
    cluster = start_cluster("--managers", "3", expected_noise=FAILOVER_NOISE)
    folder = cluster.mountpoint / "ckpt"
    folder.mkdir()
    with Series(folder) as series:
        series.wait_more(3)
        name, ready = _active(cluster)
        pid = int(ready["pid"])
        with _paused(pid):  # past its lease: a standby takes over meanwhile
            new, _ = _wait_new_active(cluster, pid, TAKEOVER_S)
            assert new != name
            series.wait_more(3)
        # Resumed, it finds its lease lapsed and stops; `up` starts it again as a standby.
        log = cluster.data_dir / "logs" / f"{name}.log"
        harness.wait_for(lambda: "this manager is no longer the active one" in
                         log.read_text(), timeout=30, what="the paused manager to step down")
        series.wait_more(2)
    _check_all(cluster, series)
    for name_ in series.closed:  # each close committed exactly one version
        versions = harness.cli_json("versions", str(folder / name_))
        assert len(versions["versions"]) == 1, name_
