"""Replication and failure handling with real processes: a manager with R=2, three
benefactors and a FUSE mount, each started on its own so that a test can SIGKILL one.

Figures come from `mosafs status --json` and from the chunk files on the benefactors'
disks, never from the manager's word alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import blake3

from tests import harness
from tests.cluster.conftest import Cluster, start_cluster

KiB = 1 << 10
MiB = 1 << 20


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
    cluster = start_cluster(tmp_path)
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt", "--write-semantics", "optimistic")
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


def test_cluster_pessimistic_is_the_default_and_close_returns_with_r_copies(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path)
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt")  # the default pool's semantics
    data = _data(2, 5 * MiB)
    (mnt / "f").write_bytes(data)
    copies = cluster.chunk_copies()
    assert len(copies) > 10
    assert set(copies.values()) == {2}, "close returned before every chunk had R copies"
    # Every second copy came from the write itself: replication copied nothing, and the
    # commit was fully redundant when it was made.
    metrics = harness.scrape(cluster.manager.ready["metrics"])
    assert metrics.get("mosafs_manager_replicated_bytes_total{}", 0) == 0
    assert metrics['mosafs_manager_close_to_redundant_seconds_bucket{le=0.0}'] == \
        metrics["mosafs_manager_close_to_redundant_seconds_count{}"] == 1


def test_cluster_benefactor_killed_during_a_series(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    """Acceptance: SIGKILL one of three benefactors (R=2) while ten versions are written;
    every version whose close succeeded reads back byte-identical (through a new mount, so
    no cache helps); after the lease, nothing is under-replicated. Pessimistic writes: a
    close that returned has R copies, so one failure cannot lose it (an optimistic close
    has one copy until the background pass, see the next test)."""
    cluster = start_cluster(tmp_path)
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
    cluster = start_cluster(tmp_path)
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt", "--write-semantics", "optimistic")
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
