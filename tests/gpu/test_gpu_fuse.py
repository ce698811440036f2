"""The GPU backend under a real mount: FUSE writes land in pinned buffers (in place), and
what is stored is exactly what the CPU chunker makes of the same bytes.

Runs where a GPU is (tests/gpu is run on the device machine by scripts/device_gpu_check.sh);
the test that asks for the GPU where there is none runs everywhere else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mosafs.chunking import make_chunker
from tests.gpu.conftest import GPU, REASON

MiB = 1 << 20
SPEC = "cdc:65536:262144:1048576"


def mosafs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mosafs", *args], capture_output=True,
                          text=True, timeout=120)


def _write(path, data: bytes, sizes: list[int]) -> None:
    """Write DATA through the mount in pieces of the given sizes, cycling."""
    with open(path, "wb") as f:
        pos, k = 0, 0
        while pos < len(data):
            n = sizes[k % len(sizes)]
            f.write(data[pos:pos + n])
            pos, k = pos + n, k + 1


def _stats(path) -> dict:
    out = mosafs("stats", str(path), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.gpu
@pytest.mark.skipif(REASON is None, reason="this host has a usable GPU")
def test_fuse_gpu_backend_without_gpu_is_a_one_line_error(tmp_path):
    out = mosafs("up", str(tmp_path / "mnt"), "--data-dir", str(tmp_path / "data"),
                 "--hash-backend", "gpu")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert "GPU hash backend requested but" in out.stderr
    assert "Traceback" not in out.stderr
    assert not os.path.ismount(tmp_path / "mnt")


@pytest.mark.gpu
@pytest.mark.skipif(REASON is None, reason="this host has a usable GPU")
def test_fuse_mount_with_workers_gets_the_workers_one_line_reason(tmp_path):
    """With data-path workers the backend is set up in the workers only (the FUSE process
    never holds a CUDA context): the mount stops with a worker's reason, in one line, and
    every worker stops with it (the others' broken pipe is no traceback either)."""
    def workers() -> set[str]:
        found = subprocess.run(["pgrep", "-f", "mosafs.client.worker"], capture_output=True,
                               text=True)
        return set(found.stdout.split())

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    before = workers()
    out = mosafs("mount", str(mnt), "--manager", "127.0.0.1:1", "--insecure",
                 "--hash-backend", "gpu", "--datapath-workers", "3")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == f"mosafs mount: GPU hash backend requested but {REASON}"
    assert not os.path.ismount(mnt)
    assert workers() <= before  # reaped: none of this mount's is left


@GPU[0]
@GPU[1]
@pytest.mark.parametrize("size", [0, 1000, 3 * MiB + 17, 150 * MiB + 4097])
def test_fuse_gpu_writes_equal_cpu_chunks(start_cluster, size):
    cluster = start_cluster("--hash-backend", "gpu", "--chunker", SPEC)
    log = (cluster.data_dir / "logs" / "mount.log").read_text()
    assert "hash backend: gpu" in log
    data = os.urandom(size)
    path = cluster.mountpoint / "app.n0.1"
    # Odd write sizes: pieces straddle the batch and the pinned buffers' ends.
    _write(path, data, [1 * MiB + 17, 4096, 131 * 1024 + 5])
    assert path.read_bytes() == data
    if size == 0:
        # Created and closed unwritten: the file exists, empty, with no version yet.
        assert os.stat(path).st_size == 0
        return
    expected = make_chunker(SPEC, "cpu").chunk_all(data)
    stats = _stats(path)
    assert stats["size"] == size
    assert stats["chunks"] == len(expected)
    if size > 2 * MiB:
        # The next checkpoint: one edit in the middle; the rest dedupes.
        edited = bytearray(data)
        edited[size // 2:size // 2 + 8] = b"EDITED!!"
        _write(path, bytes(edited), [1 * MiB])
        assert path.read_bytes() == edited
        again = _stats(path)
        cpu = make_chunker(SPEC, "cpu").chunk_all(bytes(edited))
        assert again["chunks"] == len(cpu)
        assert again["shared_chunks"] >= len(cpu) - 3
        assert again["new_bytes"] < size // 4
