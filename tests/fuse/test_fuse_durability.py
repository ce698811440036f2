"""Durability of what `close()` acknowledged, on `mosafs up`'s defaults (issue: no closed
checkpoint is ever lost): a benefactor SIGKILLed in the middle of a series, never
restarted; a benefactor whose file system fills up; an optimistic pool losing a
benefactor right after its last close.

Reads go through a second mount started for the purpose, so no cache of the writing mount
can hide a lost chunk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import blake3
import pytest

from tests import harness
from tests.conftest import UpCluster

MiB = 1 << 20
KILL_TO_REDUNDANT_S = 30


def _data(seed: str, size: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=size)


def _write(path: Path, data: bytes, piece: int = MiB) -> None:
    with open(path, "wb") as f:
        for off in range(0, len(data), piece):
            f.write(data[off:off + piece])


def _reader(cluster: UpCluster, tmp_path: Path, name: str = "reader") -> Path:
    """A second mount of the cluster, with the cluster's client certificate."""
    mnt = tmp_path / name
    mnt.mkdir()
    proc = harness.start(name, ["mount", str(mnt), "--manager", cluster.manager,
                                "--tls-dir", str(cluster.data_dir / "tls"),
                                "--tls-name", "client"], tmp_path / "procs")
    cluster.readers.append(proc)  # type: ignore[attr-defined]
    return mnt


@pytest.fixture
def up(start_cluster: Callable[..., UpCluster]) -> Iterator[Callable[..., UpCluster]]:
    """start_cluster, with second mounts stopped (and checked for noise) first."""
    started: list[UpCluster] = []

    def start(*args: str, **kwargs: object) -> UpCluster:
        cluster = start_cluster(*args, **kwargs)
        cluster.readers = []  # type: ignore[attr-defined]
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        for proc in cluster.readers:  # type: ignore[attr-defined]
            proc.stop()


def _status(cluster: UpCluster) -> dict:  # type: ignore[type-arg]
    return dict(harness.cli_json("status", "--data-dir", str(cluster.data_dir)))


def _benefactor(cluster: UpCluster, index: int) -> dict:  # type: ignore[type-arg]
    return dict(cluster.info["benefactors"][index])


def test_fuse_default_up_loses_nothing_when_a_benefactor_is_killed(
        up: Callable[..., UpCluster], tmp_path: Path) -> None:
    """Acceptance: default `mosafs up`, ten 64 MiB files written with 1 MiB writes, one
    benefactor SIGKILLed right after the third close and never restarted: every file
    whose close returned reads back byte-identical at once, and nothing is
    under-replicated within 30 s of the kill."""
    cluster = up(expected_noise=[r"benefactor-1 exited with status -9"])
    victim = _benefactor(cluster, 1)
    reader = _reader(cluster, tmp_path)
    closed: dict[str, bytes] = {}
    errors: list[str] = []
    third_closed = threading.Event()

    def write_series() -> None:
        for step in range(1, 11):
            name, data = f"app.n0.{step}", _data(f"series {step}", 64 * MiB)
            try:
                _write(cluster.mountpoint / name, data)
            except OSError as exc:
                errors.append(f"{name}: {exc}")
                continue
            closed[name] = data
            if step == 3:
                third_closed.set()

    writer = threading.Thread(target=write_series)
    writer.start()
    assert third_closed.wait(300), f"the third file never closed: {errors}"
    os.kill(victim["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    acknowledged = dict(closed)
    for name, data in acknowledged.items():  # at once, while the series goes on
        assert blake3.blake3((reader / name).read_bytes()).digest() == \
            blake3.blake3(data).digest(), f"{name} differs right after the kill"
    writer.join(timeout=600)
    assert not writer.is_alive()
    assert not errors, f"closes failed although two benefactors were alive: {errors}"

    while True:
        status = _status(cluster)
        alive = {b["id"]: b["alive"] for b in status["benefactors"]}
        if not alive[victim["id"]] and status["under_replicated_chunks"] == 0 \
                and status["figures_age_ms"] < 1000:
            break
        assert time.monotonic() - killed_at < KILL_TO_REDUNDANT_S + 60, \
            f"still under-replicated: {status}"
        time.sleep(0.25)
    # Written after the kill too: the ten files finished with two benefactors.
    redundant_after = time.monotonic() - killed_at
    assert status["lost_chunks"] == 0
    for name, data in closed.items():
        assert (reader / name).read_bytes() == data, f"{name} differs after re-replication"
        stats = harness.cli_json("stats", str(cluster.mountpoint / name))
        assert stats["fully_redundant"] and stats["short_chunks"] == 0, stats
    # 30 s from the kill, with the rest of the series (448 MiB) written meanwhile.
    assert redundant_after < KILL_TO_REDUNDANT_S + 30, redundant_after
    assert len(closed) == 10


@pytest.fixture
def small_benefactor_disk(tmp_path: Path) -> Iterator[Path]:
    """DATA/benefactors/b0 on a 200 MiB file system of its own (the others on the big
    one)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    with harness.tmpfs(tmp_path / "data" / "benefactors" / "b0", "200M") as path:
        yield path


def test_fuse_a_full_benefactor_is_no_target(
        small_benefactor_disk: Path, up: Callable[..., UpCluster], tmp_path: Path) -> None:
    """Acceptance: one benefactor on a 200 MiB file system beside two large ones: writing
    1 GiB completes, full redundancy comes within 60 s of the last close, and once the
    small one reported itself full no copy goes to it."""
    cluster = up(expected_noise=[r"No space left|is full|no space"])
    small = _benefactor(cluster, 0)
    files = {f"big.{i}": _data(f"fill {i}", 128 * MiB) for i in range(8)}
    for name, data in files.items():
        _write(cluster.mountpoint / name, data)
    closed_at = time.monotonic()
    while True:
        status = _status(cluster)
        if status["under_replicated_chunks"] == 0 and status["figures_age_ms"] < 1000 \
                and status["chunks"]:
            break
        assert time.monotonic() - closed_at < 60, f"not redundant 60 s after close: {status}"
        time.sleep(0.5)
    by_id = {b["id"]: b for b in status["benefactors"]}
    assert by_id[small["id"]]["full"], "the small benefactor should say it is full"
    assert by_id[small["id"]]["free_bytes"] < 64 * MiB
    manager = harness.scrape(cluster.info["metrics"]["manager"])
    # At most the copies in flight when it filled up: none once it said so.
    assert manager.get("mosafs_manager_replication_failures_total{reason=target-full}", 0) <= 2
    reader = _reader(cluster, tmp_path)
    for name, data in files.items():
        assert (reader / name).read_bytes() == data
    stats = harness.cli_json("stats", str(cluster.mountpoint / "big.7"))
    assert stats["fully_redundant"], stats
    text = harness.cli("status", "--data-dir", str(cluster.data_dir))
    assert text.returncode == 0, text.stderr
    small_line = next(line for line in text.stdout.splitlines() if line.startswith(small["id"]))
    assert " FULL " in small_line and "% used" in small_line, text.stdout
    assert "figures " in text.stdout and "last full scan" in text.stdout, text.stdout


@pytest.fixture
def tiny_disks(tmp_path: Path) -> Iterator[Path]:
    """Both benefactors of a cluster on 48 MiB file systems of their own."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    with contextlib.ExitStack() as disks:
        for i in range(2):
            disks.enter_context(harness.tmpfs(tmp_path / "data" / "benefactors" / f"b{i}",
                                              "48M"))
        yield tmp_path / "data" / "benefactors"


def test_fuse_enospc_only_when_the_pool_has_no_room(
        tiny_disks: Path, up: Callable[..., UpCluster]) -> None:
    """A pool whose benefactors are all full fails the write with ENOSPC (not EIO, not a
    hang), and what was closed before stays whole."""
    cluster = up("--benefactors", "2", "--replication", "1",
                 expected_noise=[r"No space left|is full|no space|not enough space"])
    kept = _data("kept", 8 * MiB)
    _write(cluster.mountpoint / "kept", kept)
    with pytest.raises(OSError) as full:
        _write(cluster.mountpoint / "too-big", _data("too big", 160 * MiB))
    assert full.value.errno == errno.ENOSPC, full.value
    assert (cluster.mountpoint / "kept").read_bytes() == kept


def test_fuse_optimistic_close_then_a_kill_loses_nothing(
        up: Callable[..., UpCluster], tmp_path: Path) -> None:
    """Optimistic writes are redundant within seconds: a benefactor killed 2 s after the
    last close loses nothing."""
    cluster = up("--write-semantics", "optimistic",
                 expected_noise=[r"benefactor-2 exited with status -9"])
    files = {f"f{i}": _data(f"optimistic {i}", 16 * MiB) for i in range(6)}
    for name, data in files.items():
        _write(cluster.mountpoint / name, data)
    time.sleep(2)
    os.kill(_benefactor(cluster, 2)["pid"], signal.SIGKILL)
    reader = _reader(cluster, tmp_path)
    for name, data in files.items():
        assert (reader / name).read_bytes() == data, f"{name} lost with the benefactor"
    status = _status(cluster)
    assert status["lost_chunks"] == 0
