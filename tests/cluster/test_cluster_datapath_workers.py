"""Data-path workers (`mosafs mount --datapath-workers N`): written files are chunked,
hashed and uploaded by worker processes, with the same results as in the mount; a
worker SIGKILLed mid-write fails only the commits of the files it carried (EIO at
close, the previous version intact) and the mount goes on; a SIGKILLed mount leaves no
worker behind."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import blake3
import pytest

from tests.cluster.conftest import Cluster, start_cluster
from tests.gpu.conftest import GPU

MiB = 1 << 20


def _data(seed: str, size: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=size)


def _workers(mount_pid: int) -> list[int]:
    """Pids of the mount's data-path workers."""
    out = subprocess.run(["pgrep", "-P", str(mount_pid), "-f", "mosafs.client.worker"],
                         capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _stats(cluster: Cluster, path: Path) -> dict:  # type: ignore[type-arg]
    import json

    out = subprocess.run([sys.executable, "-m", "mosafs", "stats", str(path), "--json"],
                         capture_output=True, text=True, timeout=60, check=True)
    return dict(json.loads(out.stdout))


def _write(path: Path, data: bytes, piece: int = MiB) -> None:
    with open(path, "wb") as f:
        for off in range(0, len(data), piece):
            f.write(data[off:off + piece])


def test_cluster_workers_write_dedupe_and_read_back(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path)
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt", "--datapath-workers", "2")
    assert len(_workers(cluster.mounts[-1].popen.pid)) == 2
    first = _data("w-first", 6 * MiB + 123)
    second = first[:5 * MiB] + _data("w-new", MiB)  # the first 5 MiB unchanged
    (mnt / "ckpt").mkdir()
    # several files at once: both workers carry streams
    paths = [mnt / "ckpt" / f"app.0.{i}" for i in range(4)]
    for i, path in enumerate(paths):
        _write(path, first if i == 0 else _data(f"w-{i}", 3 * MiB + i))
    _write(mnt / "ckpt" / "app.0.9", second)
    stats = _stats(cluster, mnt / "ckpt" / "app.0.9")
    assert stats["new_bytes"] < 2 * MiB, stats  # deduplicated against app.0.0
    cluster.wait_redundant()
    # read back through the workers (they fetch and verify the chunks) ...
    assert (mnt / "ckpt" / "app.0.9").read_bytes() == second
    # ... and through a mount without any
    reader = cluster.mount("reader", "--datapath-workers", "0")
    assert (reader / "ckpt" / "app.0.0").read_bytes() == first
    assert (reader / "ckpt" / "app.0.9").read_bytes() == second
    for i, path in enumerate(paths[1:], start=1):
        assert (reader / "ckpt" / path.name).read_bytes() == _data(f"w-{i}", 3 * MiB + i)
    # a rewrite in place (spill, re-chunked by a worker at close)
    with open(mnt / "ckpt" / "app.0.9", "r+b") as f:
        f.seek(MiB)
        f.write(b"x" * 1000)
    expected = second[:MiB] + b"x" * 1000 + second[MiB + 1000:]
    assert (reader / "ckpt" / "app.0.9").read_bytes() == expected


def test_cluster_worker_killed_mid_write_fails_that_commit_only(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path)
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt", "--datapath-workers", "1")
    mount = cluster.mounts[-1]
    old = _data("k-old", 2 * MiB)
    _write(mnt / "f", old)
    [worker] = _workers(mount.popen.pid)
    mount.expected_noise = [r"data-path worker 0 \(pid \d+\) is gone",
                            r"commit of inode \d+ failed"]
    fd = os.open(mnt / "f", os.O_WRONLY | os.O_TRUNC)
    os.write(fd, _data("k-new", 3 * MiB))
    os.kill(worker, signal.SIGKILL)
    time.sleep(0.5)
    try:  # the stream is gone: a write may already say so
        os.write(fd, _data("k-more", 2 * MiB))
    except OSError as exc:
        assert exc.errno == errno.EIO
    with pytest.raises(OSError) as failure:  # ... and the close, which commits, does
        os.close(fd)
    assert failure.value.errno == errno.EIO
    reader = cluster.mount("reader", "--datapath-workers", "0")
    assert (reader / "f").read_bytes() == old  # the previous version is intact
    # the mount goes on: no worker left, so files are written in the mount itself
    fresh = _data("k-after", 3 * MiB)
    _write(mnt / "g", fresh)
    assert (reader / "g").read_bytes() == fresh


def test_cluster_workers_die_with_a_killed_mount(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path)
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt", "--datapath-workers", "2")
    mount = cluster.mounts.pop()
    workers = _workers(mount.popen.pid)
    assert len(workers) == 2
    mount.kill(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{p}").exists() for p in workers):
        assert time.monotonic() < deadline, f"workers {workers} outlived their mount"
        time.sleep(0.1)
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _maps_cuda(pid: int) -> bool:
    return "libcuda" in Path(f"/proc/{pid}/maps").read_text()


@GPU[0]
@GPU[1]
def test_cluster_gpu_workers_keep_cuda_out_of_the_fuse_process(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    """With data-path workers the GPU backend lives in the workers only: the FUSE process
    never loads the CUDA driver (its context and pinned pool would sit in the mount's
    memory for nothing), the workers do, and what they chunk reads back."""
    import threading

    cluster = start_cluster(tmp_path)
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt", "--datapath-workers", "2", "--hash-backend", "gpu",
                        "--gpu-pinned-mib", "64")
    mount_pid = cluster.mounts[-1].popen.pid
    files = {mnt / f"rank.{i}": _data(f"g-{i}", 40 * MiB + i) for i in range(3)}
    writers = [threading.Thread(target=_write, args=item) for item in files.items()]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    for path, data in files.items():
        assert path.read_bytes() == data
    assert "hash backend: gpu (in the data-path workers)" in cluster.mounts[-1].log()
    assert not _maps_cuda(mount_pid)
    assert all(_maps_cuda(pid) for pid in _workers(mount_pid))
