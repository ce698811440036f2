"""`mosafs bench backends` as a newcomer first types it (issue 16): no arguments on a machine
without a GPU runs the CPU backend, says why the GPU one was left out, and prints a table,
not a JSON document."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import fuse_available

pytestmark = pytest.mark.timeout(180)


def test_bench_backends_without_arguments_runs_what_this_machine_has(tmp_path: Path) -> None:
    from mosafs.chunking.gpu import GpuBackend

    reason = fuse_available()
    if reason:
        pytest.skip(reason)
    gpu = GpuBackend.unavailable_reason()
    command = [sys.executable, "-P", "-m", "mosafs", "bench", "backends", "--size-mib", "8"]
    table = subprocess.run([*command, "--keep", str(tmp_path / "table")], capture_output=True,
                           text=True, timeout=170)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("mosafs bench backends: two checkpoints of 8 MiB each")
    assert [line.split()[:2] for line in lines[3:5]] == [["cpu", "new"], ["cpu", "checkpoint"]]
    if gpu is not None:
        assert f"gpu       skipped: {gpu}" in lines
    assert "{" not in table.stdout and len(table.stdout) < 2000

    done = subprocess.run([*command, "--json", "--keep", str(tmp_path / "json")],
                          capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert sorted(result["backends"]) == (["cpu"] if gpu else ["cpu", "gpu"])
    assert result["skipped"] == ({"gpu": gpu} if gpu else {})
    assert result["backends"]["cpu"]["new"]["new_bytes"] == 8 << 20
