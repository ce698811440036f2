"""`mosafs bench series` with CA-GPU: the GPU writer finds exactly what the CPU writer
finds on the same checkpoint series (same bytes sent, same bytes stored), with no errors.
Runs where a GPU is (scripts/device_bench.sh)."""

from __future__ import annotations

import json

from tests.gpu.conftest import GPU
from tests.harness import cli

pytestmark = GPU


def test_gpu_bench_series_gpu_and_cpu_dedupe_alike() -> None:
    done = cli("bench", "series", "--quick", "--links", "none", "--size-mib", "64",
               "--configs", "CA-CPU cdc 1024K,CA-GPU cdc 1024K", "--json", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    cpu, gpu = json.loads(done.stdout)["runs"]
    assert (cpu["hash_backend"], gpu["hash_backend"]) == ("cpu", "gpu")
    assert cpu["errors"] == gpu["errors"] == []
    assert gpu["bytes_sent"] == cpu["bytes_sent"] < gpu["bytes_written"]
    assert gpu["bytes_stored"] == cpu["bytes_stored"]
    assert [s["chunks"] for s in gpu["steps"]] == [s["chunks"] for s in cpu["steps"]]
    assert gpu["later"]["asb_mb_s"] > 0

