"""Issue 15, no closed checkpoint is lost, when the metadata fills: a cluster whose manager
runs with `--map-size 2M`, written through a real FUSE mount until the metadata is full.
Applications get ENOSPC for new files, while unlink still works (before the fix unlink got
ENOSPC too, and only a restart with a bigger --map-size freed space); the map grows by
itself, creates resume without a restart, every checkpoint closed before reads back, and
`mosafs fsck` is clean."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import blake3
import pytest

from tests.cluster.conftest import Cluster, start_cluster

FULL = r"metadata store .* is full \(ceiling --map-size 1048576, reserve 262144 bytes\)"
PASSED = r"metadata map of .* grown from 1048576 to \d+ bytes .*passed for a deletion"
CHUNK = 1024  # fixed:1024: a checkpoint of 128 KiB names 128 chunks


def content(i: int) -> bytes:
    return blake3.blake3(f"checkpoint {i}".encode()).digest(length=128 * CHUNK)


def fill(mnt: Path) -> dict[str, bytes]:
    """Checkpoints until the mount answers ENOSPC, then directories until it does again
    (up to the reserve); the checkpoints closed."""
    closed: dict[str, bytes] = {}
    for i in range(10_000):
        try:
            (mnt / f"ckpt.{i:04d}").write_bytes(content(i))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            break
        closed[f"ckpt.{i:04d}"] = content(i)
    for i in range(100_000):
        try:
            os.mkdir(mnt / f"d{i:06d}")
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            return closed
    raise AssertionError("the metadata never filled")


def test_full_metadata_through_a_mount(cluster_factory: list[Cluster], tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, "--map-size", "1M", "--replication", "1",
                            "--chunker", f"fixed:{CHUNK}", benefactors=1)
    cluster_factory.append(cluster)
    cluster.manager.expected_noise = [FULL, PASSED]
    mnt = cluster.mount("mnt")
    # The checkpoint whose close got ENOSPC keeps its bytes in the mount (uncommitted)
    # until the mount goes; the file keeps its previous version.
    cluster.mounts[0].expected_noise = [r"unmounting with uncommitted changes to inode \d+"]
    pid = cluster.manager.ready["pid"]

    closed = fill(mnt)
    assert len(closed) >= 5
    with pytest.raises(OSError) as refused:
        (mnt / "one-more").write_bytes(b"x")
    assert refused.value.errno == errno.ENOSPC

    for name in sorted(closed)[:3]:
        os.unlink(mnt / name)  # rewrites 128 chunk records: the reserve, or more map
        del closed[name]
    (mnt / "after").write_bytes(b"written after the unlink")
    os.mkdir(mnt / "dir")
    assert (mnt / "after").read_bytes() == b"written after the unlink"
    for name, data in closed.items():  # every checkpoint closed before is intact
        assert (mnt / name).read_bytes() == data, name
    assert cluster.manager.alive() and cluster.manager.ready["pid"] == pid

    log = cluster.manager.log()
    assert "grown from 524288 to 1048576 bytes" in log, log
    done = subprocess.run([sys.executable, "-m", "mosafs", "fsck", "--manager",
                           cluster.manager.address, "--json"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["findings"] == []
