"""Clusters of separate processes for cluster tests: a manager, benefactors and mounts,
each started on its own so that a test can SIGKILL or restart one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import harness
from tests.conftest import fuse_available

CHUNKER = "cdc:16384:65536:262144"
LEASE_S = 2.0


@dataclass
class Cluster:
    base: Path
    manager: harness.Proc
    benefactors: list[harness.Proc] = field(default_factory=list)
    mounts: list[harness.Proc] = field(default_factory=list)
    benefactor_args: tuple[str, ...] = ()

    def start_benefactor(self, i: int) -> harness.Proc:
        proc = harness.start(f"benefactor-{i}", [
            "benefactor", "--data-dir", str(self.base / f"b{i}"),
            "--manager", self.manager.address, *self.benefactor_args], self.base / "procs")
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
            for path in harness.chunk_files(self.base / f"b{i}"):
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
        return dict(harness.wait_redundant("--manager", self.manager.address,
                                           timeout=timeout))


def start_cluster(base: Path, *manager_args: str, benefactor_args: tuple[str, ...] = (),
                  benefactors: int = 3) -> Cluster:
    manager = harness.start("manager", [
        "manager", "--data-dir", str(base / "manager"), "--replication", "2",
        "--chunker", CHUNKER, "--heartbeat-interval", "0.5",
        "--benefactor-lease", str(LEASE_S), "--scan-interval", "0.5",
        *manager_args], base / "procs")
    cluster = Cluster(base, manager, benefactor_args=benefactor_args)
    for i in range(benefactors):
        cluster.start_benefactor(i)
    deadline = time.monotonic() + 30
    while sum(b["alive"] for b in cluster.status()["benefactors"]) < benefactors:
        assert time.monotonic() < deadline, "benefactors did not register"
        time.sleep(0.1)
    return cluster


@pytest.fixture
def cluster_factory(tmp_path: Path,
                    monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Cluster]]:
    reason = fuse_available()
    if reason:
        pytest.skip(reason)
    # These clusters run plaintext (harness.start): so do the commands the test runs.
    monkeypatch.setenv("MOSAFS_INSECURE", "1")
    clusters: list[Cluster] = []
    yield clusters
    failures = [failure for cluster in clusters for failure in stop_cluster(cluster)]
    assert not failures, "\n".join(failures)


def stop_cluster(cluster: Cluster) -> list[str]:
    """Stop every process of CLUSTER (mounts first) and unmount what is left; what each
    process that did not stop cleanly or logged noise said (harness.Proc.stop)."""
    failures = []
    for proc in [*cluster.mounts, *cluster.benefactors, cluster.manager]:
        try:
            proc.stop()
        except AssertionError as exc:
            failures.append(str(exc))
    for proc in cluster.mounts:
        mnt = Path(proc.ready.get("mountpoint", ""))
        if mnt and os.path.ismount(mnt):
            os.system(f"fusermount3 -u -z {mnt}")
    return failures


