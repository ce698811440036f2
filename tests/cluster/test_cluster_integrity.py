"""Integrity with real processes (manager R=2, three benefactors, a mount): corrupt chunk
files are never served, `mosafs scrub` finds, deletes and repairs them; fsck of a healthy
cluster finds nothing; deleting every file and collecting garbage empties the disks."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import blake3

from tests import harness
from tests.cluster.conftest import Cluster, start_cluster

MiB = 1 << 20
CORRUPT_NOISE = [r"corrupt chunk [0-9a-f]{64}"]


def _data(seed: int, size: int) -> bytes:
    return blake3.blake3(b"integrity" + seed.to_bytes(8, "little")).digest(length=size)


def _mosafs(cluster: Cluster, *args: str, ok: tuple[int, ...] = (0,)) -> dict:  # type: ignore[type-arg]
    out = subprocess.run([sys.executable, "-m", "mosafs", *args, "--manager",
                          cluster.manager.address, "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode in ok, f"{args}: exit {out.returncode}: {out.stderr}"
    return dict(json.loads(out.stdout))


def _unsound(base: Path, benefactors: int) -> list[Path]:
    """Chunk files whose bytes do not hash to their names."""
    return [p for i in range(benefactors) for p in harness.chunk_files(base / f"b{i}")
            if blake3.blake3(p.read_bytes()).hexdigest() != p.name]


def _settled(count: Callable[[], int], quiet: float = 1.0, timeout: float = 30.0) -> int:
    """COUNT() once it has not changed for QUIET seconds (reports still in flight)."""
    deadline = time.monotonic() + timeout
    last, since = count(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
    raise AssertionError(f"still changing after {timeout} s: {last}")


def test_cluster_scrub_repairs_corrupt_chunk_files(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, benefactor_args=("--scrub-rate", "0"))
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt")
    files = {f"f{i}": _data(i, 2 * MiB + i * 4099) for i in range(4)}
    for name, data in files.items():
        (mnt / name).write_bytes(data)
    cluster.wait_redundant()
    assert _mosafs(cluster, "fsck")["findings"] == []

    held = harness.chunk_files(tmp_path / "b1")
    assert len(held) >= 20, f"only {len(held)} chunks on b1"
    rng = random.Random(1234)
    damaged = rng.sample(held, 20)
    for path in damaged:
        data = bytearray(path.read_bytes())
        data[rng.randrange(len(data))] ^= 0x40
        path.write_bytes(bytes(data))
    assert len(_unsound(tmp_path, 3)) == 20
    for proc in cluster.benefactors:
        proc.expected_noise = CORRUPT_NOISE

    fresh = cluster.mount("mnt2")  # nothing cached: every chunk comes from a benefactor
    cluster.mounts[-1].expected_noise = [r"chunk [0-9a-f]{64} from \S+ is corrupt"]
    for name, data in files.items():
        assert (fresh / name).read_bytes() == data

    # The reader told b1 of each bad copy it got from there; b1 hashed it itself and
    # deleted it (DESIGN §3). Scrub finds the rest.
    b1_proc = cluster.benefactors[1]
    reported = _settled(lambda: len(set(re.findall(
        r"corrupt chunk ([0-9a-f]{64}) in .*; deleted", b1_proc.log()))))
    assert reported > 0
    report = _mosafs(cluster, "scrub")
    by_id = {b["id"]: b for b in report["benefactors"]}
    b1 = by_id[cluster.benefactors[1].ready["id"]]
    assert b1["corrupt_chunks"] == 20 - reported
    assert b1["repaired_chunks"] == 20 - reported and b1["unrepaired_chunks"] == 0
    assert report["checked_chunks"] == sum(b["checked_chunks"] for b in by_id.values())
    assert report["checked_chunks"] >= 2 * len(held) // 2 - reported
    assert report["corrupt_chunks"] == 20 - reported and report["unrepaired_ids"] == []
    assert report["failures"] == []

    assert _unsound(tmp_path, 3) == []
    copies = cluster.chunk_copies()
    assert all(n == 2 for n in copies.values()), copies
    assert {p.name for p in damaged} <= set(copies)
    assert cluster.wait_redundant(timeout=10)["lost_chunks"] == 0
    again = _mosafs(cluster, "scrub")
    assert again["corrupt_chunks"] == 0 and again["missing_chunks"] == 0
    assert _mosafs(cluster, "fsck")["findings"] == []
    third = cluster.mount("mnt3")
    for name, data in files.items():
        assert (third / name).read_bytes() == data


def test_cluster_background_scrub_and_missing_copies(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    """A fast background scrub finds a corrupt file by itself; a chunk file deleted behind
    the benefactor's back is found missing by `mosafs scrub`; both are repaired."""
    cluster = start_cluster(tmp_path, benefactor_args=("--scrub-rate", "64M"))
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt")
    data = _data(99, 3 * MiB)
    (mnt / "f").write_bytes(data)
    cluster.wait_redundant()
    for proc in cluster.benefactors:
        proc.expected_noise = CORRUPT_NOISE
    held = harness.chunk_files(tmp_path / "b0")
    bad, gone = held[0], held[1]
    bad.write_bytes(b"rotten" + bad.read_bytes()[6:])
    gone.unlink()
    deadline = time.monotonic() + 60
    while bad.exists() and blake3.blake3(bad.read_bytes()).hexdigest() != bad.name:
        assert time.monotonic() < deadline, "background scrub did not find the corrupt copy"
        time.sleep(0.2)
    report = _mosafs(cluster, "scrub")
    assert report["missing_chunks"] >= 1 and report["unrepaired_chunks"] == 0
    assert _unsound(tmp_path, 3) == []
    copies = cluster.chunk_copies()
    assert bad.name in copies and gone.name in copies
    assert all(n == 2 for n in copies.values()), copies
    assert (cluster.mount("mnt2") / "f").read_bytes() == data


def test_cluster_gc_after_deleting_everything_empties_the_disks(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, "--gc-grace", "1",
                            benefactor_args=("--inventory-interval", "3600"))
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt")
    (mnt / "d").mkdir()
    for i in range(6):
        (mnt / "d" / f"ck.n0.{i}").write_bytes(_data(200 + i, MiB + 777 * i))
    (mnt / "big").write_bytes(_data(300, 5 * MiB))
    cluster.wait_redundant()

    def stored() -> int:
        return harness.sizes(p for i in range(3)
                             for p in harness.chunk_files(tmp_path / f"b{i}"))

    assert stored() > 2 * 10 * MiB
    for path in [*(mnt / "d").iterdir(), mnt / "big"]:
        path.unlink()
    (mnt / "d").rmdir()
    deadline = time.monotonic() + 30
    while stored():  # the manager collects them once the grace period is over
        assert time.monotonic() < deadline, f"{stored()} bytes still stored"
        time.sleep(0.1)
    report = _mosafs(cluster, "gc")  # and a round finds nothing left
    assert report["failures"] == [] and report["waiting_chunks"] == 0
    assert report["freed_bytes"] == 0
    deadline = time.monotonic() + 10
    while True:  # figures arrive with the next heartbeats and replication pass
        status = cluster.status()
        if status["chunks"] == 0 and all(b["chunks"] == 0 and b["stored_bytes"] == 0
                                         for b in status["benefactors"]):
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    assert _mosafs(cluster, "fsck")["findings"] == []
