"""Replication and failure handling with real processes: a manager with R=2, three
benefactors and a FUSE mount, each started on its own so that a test can SIGKILL one.

Figures come from `mosafs status --json` and from the chunk files on the benefactors'
disks, never from the manager's word alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import blake3
import pytest

from tests import harness
from tests.conftest import fuse_available

KiB = 1 << 10
MiB = 1 << 20
CHUNKER = "cdc:16384:65536:262144"
LEASE_S = 2.0


@dataclass
class Cluster:
    base: Path
    manager: harness.Proc
    benefactors: list[harness.Proc] = field(default_factory=list)
    mounts: list[harness.Proc] = field(default_factory=list)

    def start_benefactor(self, i: int) -> harness.Proc:
        proc = harness.start(f"benefactor-{i}", [
            "benefactor", "--data-dir", str(self.base / f"b{i}"),
            "--manager", self.manager.address], self.base / "procs")
        if i < len(self.benefactors):
            self.benefactors[i] = proc
        else:
            self.benefactors.append(proc)
        return proc

    def mount(self, name: str, *extra: str) -> Path:
        mnt = self.base / name
        mnt.mkdir(exist_ok=True)
        self.mounts.append(harness.start(name, [
            "mount", str(mnt), "--manager", self.manager.address, *extra],
            self.base / "procs"))
        return mnt

    def status(self) -> dict:  # type: ignore[type-arg]
        out = subprocess.run(
            [sys.executable, "-m", "mosafs", "status", "--manager", self.manager.address,
             "--json"], capture_output=True, text=True, timeout=60, check=True)
        return dict(json.loads(out.stdout))

    def chunk_copies(self) -> dict[str, int]:
        """chunk id (hex) -> number of benefactor directories holding a file of it."""
        copies: dict[str, int] = {}
        for i in range(len(self.benefactors)):
            for path in (self.base / f"b{i}" / "chunks").glob("*/*/*"):
                if path.is_file() and len(path.name) == 64:
                    copies[path.name] = copies.get(path.name, 0) + 1
        return copies

    def wait_dead(self, bid: str, timeout: float = LEASE_S + 30) -> None:
        """Until the manager has declared BID dead and run a pass since."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            alive = {b["id"]: b["alive"] for b in status["benefactors"]}
            if not alive[bid]:
                time.sleep(1.5)  # a replication pass that knows
                return
            assert time.monotonic() < deadline, f"{bid} is still alive: {status}"
            time.sleep(0.2)

    def wait_redundant(self, timeout: float = 60) -> dict:  # type: ignore[type-arg]
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            fresh = 0 <= status["figures_age_ms"] < 5000
            if fresh and status["chunks"] and status["under_replicated_chunks"] == 0:
                return status
            assert time.monotonic() < deadline, f"still under-replicated: {status}"
            time.sleep(0.5)


def _start(base: Path, *manager_args: str) -> Cluster:
    manager = harness.start("manager", [
        "manager", "--data-dir", str(base / "manager"), "--replication", "2",
        "--chunker", CHUNKER, "--heartbeat-interval", "0.5",
        "--benefactor-lease", str(LEASE_S), "--replication-interval", "0.5",
        *manager_args], base / "procs")
    cluster = Cluster(base, manager)
    for i in range(3):
        cluster.start_benefactor(i)
    deadline = time.monotonic() + 30
    while sum(b["alive"] for b in cluster.status()["benefactors"]) < 3:
        assert time.monotonic() < deadline, "benefactors did not register"
        time.sleep(0.1)
    return cluster


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[list[Cluster]]:
    reason = fuse_available()
    if reason:
        pytest.skip(reason)
    clusters: list[Cluster] = []
    yield clusters
    failures = []
    for cluster in clusters:
        for proc in [*cluster.mounts, *cluster.benefactors, cluster.manager]:
            try:
                proc.stop()
            except AssertionError as exc:
                failures.append(str(exc))
        for proc in cluster.mounts:
            mnt = Path(proc.ready.get("mountpoint", ""))
            if mnt and os.path.ismount(mnt):
                os.system(f"fusermount3 -u -z {mnt}")
    assert not failures, "\n".join(failures)


def _data(seed: int, size: int) -> bytes:
    return blake3.blake3(seed.to_bytes(8, "little")).digest(length=size)


def _step(seed: int, step: int, size: int = 3 * MiB) -> bytes:
    """Step STEP of a checkpoint series: the same base with one region rewritten per step."""
    data = bytearray(_data(seed, size))
    start = (step * 397 * KiB) % (size - 256 * KiB)
    data[start:start + 256 * KiB] = _data(seed * 1000 + step, 256 * KiB)
    return bytes(data)


def test_cluster_optimistic_writes_reach_r_copies_in_the_background(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    cluster = _start(tmp_path)
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt")
    data = _data(1, 6 * MiB)
    (mnt / "f").write_bytes(data)
    status = cluster.wait_redundant()
    copies = cluster.chunk_copies()
    assert status["chunks"] == len(copies) > 10
    assert set(copies.values()) == {2}, "every chunk on exactly two benefactors"
    assert status["replication_backlog_bytes"] == 0
    assert status["lost_chunks"] == 0
    assert status["time_to_full_redundancy_s"] == 0
    assert (mnt / "f").read_bytes() == data


def test_cluster_pessimistic_close_returns_with_r_copies(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    # No background pass for an hour: every second copy must come from the write itself.
    cluster = _start(tmp_path, "--replication-interval", "3600")
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt", "--write-semantics", "pessimistic")
    data = _data(2, 5 * MiB)
    (mnt / "f").write_bytes(data)
    copies = cluster.chunk_copies()
    assert len(copies) > 10
    assert set(copies.values()) == {2}, "close returned before every chunk had R copies"


def test_cluster_benefactor_killed_during_a_series(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    """Acceptance: SIGKILL one of three benefactors (R=2) while ten versions are written;
    every version whose close succeeded reads back byte-identical (through a new mount, so
    no cache helps); after the lease, nothing is under-replicated. Pessimistic writes: a
    close that returned has R copies, so one failure cannot lose it (an optimistic close
    has one copy until the background pass, see the next test)."""
    cluster = _start(tmp_path)
    cluster_factory.append(cluster)
    victim = cluster.benefactors[1]
    victim.expected_noise = [".*"]  # killed: whatever it was saying is cut off
    mnt = cluster.mount("mnt", "--write-semantics", "pessimistic")
    (mnt / "ckpt").mkdir()
    closed: dict[int, bytes] = {}
    errors: list[str] = []

    def write_series() -> None:
        for step in range(1, 11):
            data = _step(3, step)
            try:
                with open(mnt / "ckpt" / f"app.n0.{step}", "wb") as f:
                    for off in range(0, len(data), 256 * KiB):
                        f.write(data[off:off + 256 * KiB])
            except OSError as exc:
                errors.append(f"step {step}: {exc}")
                continue
            closed[step] = data

    writer = threading.Thread(target=write_series)
    writer.start()
    while len(closed) < 3 and writer.is_alive():
        time.sleep(0.01)
    victim.kill(signal.SIGKILL)
    writer.join(timeout=300)
    assert not writer.is_alive()
    assert len(closed) >= 8, f"too many failed closes: {errors}"
    cluster.wait_dead(victim.ready["id"])
    status = cluster.wait_redundant(timeout=60)
    dead = [b for b in status["benefactors"] if not b["alive"]]
    assert [b["id"] for b in dead] == [victim.ready["id"]]
    assert status["lost_chunks"] == 0

    fresh = cluster.mount("mnt2")
    for step, data in closed.items():
        got = (fresh / "ckpt" / f"app.n0.{step}").read_bytes()
        assert got == data, f"version {step} differs after the failure"

    # The benefactor comes back with its disk: it registers again and is alive.
    cluster.start_benefactor(1)
    deadline = time.monotonic() + 30
    while not all(b["alive"] for b in cluster.status()["benefactors"]):
        assert time.monotonic() < deadline, "the returning benefactor is not alive"
        time.sleep(0.2)


def test_cluster_optimistic_data_survives_a_failure_after_replication(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    cluster = _start(tmp_path)
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt")
    files = {f"f{i}": _data(10 + i, 2 * MiB) for i in range(3)}
    for name, data in files.items():
        (mnt / name).write_bytes(data)
    cluster.wait_redundant()
    victim = cluster.benefactors[0]
    victim.expected_noise = [".*"]
    victim.kill(signal.SIGKILL)
    fresh = cluster.mount("mnt2")  # reads fail over to the surviving copies
    for name, data in files.items():
        assert (fresh / name).read_bytes() == data
    cluster.wait_dead(victim.ready["id"])
    status = cluster.wait_redundant()
    assert status["lost_chunks"] == 0
    survivors = sum(1 for b in status["benefactors"] if b["alive"])
    assert survivors == 2


def test_cluster_status_finds_no_manager_with_a_clear_error(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mosafs", "status", "--data-dir", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if k != "MOSAFS_MANAGER"})
    assert out.returncode != 0
    assert "no manager found" in out.stderr
    assert "Traceback" not in out.stderr
