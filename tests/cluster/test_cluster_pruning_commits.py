"""One close() makes at most one version, even when the commit's reply comes late or never
(issue 15, point 4: a second, identical version made pruning count one checkpoint twice).

Separate processes; the metadata store is made busy from the test (a write transaction on
the manager's LMDB environment held by this process), so the mount's CommitVersion reaches
the manager but is stored only after the mount's deadline (--manager-timeout 2) passed.
The write lease lives 3 s, so the mount renews it every second meanwhile.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import blake3
import lmdb
import pytest

from tests.cluster.conftest import Cluster, start_cluster

MiB = 1 << 20


@contextmanager
def busy_metadata(cluster: Cluster, seconds: float) -> Iterator[threading.Thread]:
    """The manager's LMDB write lock held by this process for SECONDS (a slow disk, a busy
    manager): the manager's commits wait for it."""
    env = lmdb.open(str(cluster.base / "manager" / "metadata.lmdb"), subdir=True,
                    max_dbs=64, map_size=1 << 30)
    held = threading.Event()

    def hold() -> None:
        with env.begin(write=True):  # aborted at the end: nothing written
            held.set()
            time.sleep(seconds)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    try:
        yield holder
    finally:
        holder.join()
        env.close()


def versions(cluster: Cluster, path: Path) -> list[tuple[int, int]]:
    out = subprocess.run(
        [sys.executable, "-m", "mosafs", "versions", str(path), "--json", "--manager",
         cluster.manager.address], capture_output=True, text=True, timeout=60, check=True)
    return [(v["version"], v["size"]) for v in json.loads(out.stdout)["versions"]]


def started(tmp_path: Path, cluster_factory: list) -> tuple[Cluster, Path]:
    cluster = start_cluster(tmp_path, "--write-lease", "3")
    cluster_factory.append(cluster)
    return cluster, cluster.mount("mnt", "--manager-timeout", "2")


def open_written(path: Path, data: bytes) -> tuple[int, int]:
    """PATH open for writing with DATA written, through two descriptors of one open file
    (as after dup2: closing the first flushes, the second keeps the handle)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, data)
    return fd, os.dup(fd)


def test_cluster_a_commit_answered_after_the_deadline_is_stored_once(
        tmp_path: Path, cluster_factory: list) -> None:
    cluster, mnt = started(tmp_path, cluster_factory)
    data = blake3.blake3(b"late").digest(length=MiB)
    fd, again = open_written(mnt / "app.n0.1", data)
    with busy_metadata(cluster, 3.0):
        begun = time.monotonic()
        os.close(fd)  # the commit's first try times out; its repeat gets the stored version
        assert time.monotonic() - begun >= 2.5
    os.close(again)
    assert versions(cluster, mnt / "app.n0.1") == [(1, MiB)]
    assert (mnt / "app.n0.1").read_bytes() == data


@pytest.mark.parametrize("forgotten", [False, True], ids=["remembered", "forgotten"])
def test_cluster_a_commit_in_doubt_is_settled_without_a_second_version(
        tmp_path: Path, cluster_factory: list, forgotten: bool) -> None:
    """The close fails (no answer within two deadlines), the manager stores the commit
    later. The next flush of the same content must not store it again: the manager answers
    the repeat from its record of the lease, or, once it forgot the lease, the mount sees
    the file's newest version is its content."""
    cluster, mnt = started(tmp_path, cluster_factory)
    data = blake3.blake3(b"in doubt").digest(length=MiB)
    fd, again = open_written(mnt / "app.n0.1", data)
    with busy_metadata(cluster, 5.5):
        with pytest.raises(OSError) as caught:
            os.close(fd)
        assert caught.value.errno == errno.ETIMEDOUT
    time.sleep(1.5)  # stored by now; the mount's renewals of the used lease are refused
    if forgotten:
        time.sleep(3)  # past the record's life (one lease TTL); an open sweeps it away
        (mnt / "other").write_bytes(b"x")
    os.close(again)  # the last flush and release: the commit is settled
    assert versions(cluster, mnt / "app.n0.1") == [(1, MiB)]
    assert (mnt / "app.n0.1").read_bytes() == data
    settled_by_looking = "in doubt was stored as version 1" in cluster.mounts[0].log()
    assert settled_by_looking == forgotten
