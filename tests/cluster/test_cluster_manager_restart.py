"""Manager durability (DESIGN §8): SIGKILL the manager at 20 random moments while a series
of checkpoints is written through a real mount, restart it on the same data directory and
address, and check after every restart that each version whose close() succeeded reads
back byte-identical and that fsck finds nothing. The mount and the benefactors reconnect
by themselves; writes that fail while the manager is down are skipped."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3

from tests import harness
from tests.cluster.conftest import Cluster, start_cluster

KILLS = 20
KiB = 1 << 10
# While the manager is down: benefactors lose and regain it, writers' files fail.
BENEFACTOR_NOISE = [r"WARNING mosafs\.benefactor\[\d+\]: manager \S+ unreachable"]
# A file whose commit failed (its lease died with the manager) is dropped at unmount.
MOUNT_NOISE = [r"WARNING mosafs\.client\S*: unmounting with uncommitted changes to inode"]
PAUSE_S = 0.1  # between two checkpoints of the series


def _data(i: int) -> bytes:
    size = 16 * KiB + (i * 7919) % (96 * KiB)
    return blake3.blake3(b"restart" + i.to_bytes(8, "little")).digest(length=size)


class Writer(threading.Thread):
    """Writes ck.n0.<i> for i = 0, 1, ... into DIR; remembers what closed successfully."""

    def __init__(self, folder: Path) -> None:
        super().__init__(daemon=True)
        self.folder = folder
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.closed: dict[str, bytes] = {}
        self.failed = 0

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            name, data = f"ck.n0.{i}", _data(i)
            try:
                with open(self.folder / name, "wb") as f:
                    f.write(data)
            except OSError:
                self.failed += 1  # the manager was down: skip this one
                time.sleep(0.05)
            else:
                with self.lock:
                    self.closed[name] = data
            i += 1
            self.stop.wait(PAUSE_S)

    def snapshot(self) -> dict[str, bytes]:
        with self.lock:
            return dict(self.closed)


def _restart(cluster: Cluster, base: Path, n: int) -> None:
    address = cluster.manager.address
    cluster.manager.kill(signal.SIGKILL)
    cluster.manager = harness.start(f"manager-{n}", [
        "manager", "--data-dir", str(base / "manager"), "--listen", address,
        "--heartbeat-interval", "0.5", "--benefactor-lease", "2",
        "--scan-interval", "0.5"], base / "procs")
    assert cluster.manager.address == address


def _checked(cluster: Cluster, folder: Path, closed: dict[str, bytes]) -> list[object]:
    """Read every closed file in FOLDER back while `mosafs fsck` runs; fsck's findings."""
    fsck = subprocess.Popen([sys.executable, "-m", "mosafs", "fsck", "--json", "--manager",
                             cluster.manager.address], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _check(folder, closed)
        out, err = fsck.communicate(timeout=60)
    finally:
        if fsck.poll() is None:  # the check failed, or fsck hangs: no process left behind
            fsck.kill()
            fsck.communicate()
    assert fsck.returncode == 0, out + err
    return list(json.loads(out)["findings"])


def _check(folder: Path, closed: dict[str, bytes]) -> None:
    def read(name: str) -> bytes:
        return (folder / name).read_bytes()

    # Four readers at once: the series grows to a few hundred files, each read after
    # every restart, and one reader at a time spent most of the test's time on them.
    with ThreadPoolExecutor(4) as pool:
        for (name, data), got in zip(closed.items(), pool.map(read, closed), strict=True):
            assert got == data, (f"{name}: {len(got)} bytes read, {len(data)} written and "
                                 f"closed")


def test_cluster_manager_sigkill_keeps_every_closed_version(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path)
    cluster_factory.append(cluster)
    for proc in cluster.benefactors:
        proc.expected_noise = BENEFACTOR_NOISE
    mnt = cluster.mount("mnt")
    cluster.mounts[-1].expected_noise = MOUNT_NOISE
    (mnt / "series").mkdir()
    writer = Writer(mnt / "series")
    writer.start()
    rng = random.Random(20)
    try:
        for n in range(1, KILLS + 1):
            time.sleep(rng.uniform(0.1, 0.8))
            killed = cluster.manager
            _restart(cluster, tmp_path, n)
            killed.stop()  # already dead: checks its log only
            closed = writer.snapshot()
            assert _checked(cluster, mnt / "series", closed) == [], f"after restart {n}"
    finally:
        writer.stop.set()
        writer.join(timeout=60)
    assert not writer.is_alive()
    closed = writer.snapshot()
    assert len(closed) >= KILLS, f"only {len(closed)} files closed ({writer.failed} failed)"
    fresh = cluster.mount("mnt2")
    assert _checked(cluster, fresh / "series", closed) == []
    listed = {p.name for p in (fresh / "series").iterdir()}
    assert set(closed) <= listed
