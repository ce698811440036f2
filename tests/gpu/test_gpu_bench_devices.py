"""`mosafs bench ec --parts devices` where a GPU is: every arrangement runs and reports a
figure for one GPU and for every GPU (on the lent two-GPU machine, two: issue 23)."""

from __future__ import annotations

from mosafs.bench.ec_devices import run_devices, verdict
from tests.gpu.conftest import GPU

pytestmark = GPU


def test_gpu_bench_devices_every_arrangement_runs() -> None:
    got = run_devices(total=256 << 20, reps=1)
    assert got["gpus"] >= 1
    for name in ("process_per_gpu", "thread_per_gpu", "one_stream",
                 "hash_only_process_per_gpu"):
        row = got[name]
        assert "error" not in row, row
        assert row["one_gpu"]["median_GBps"] > 0 and row["all_gpus"]["median_GBps"] > 0
        assert row["scaling"] > 0
    assert all(x > 0 for x in got["h2d"]["per_gpu_GBps"])
    assert got["copy_in_and_parity_out"]["one_gpu_GBps"] > 0
    judged = verdict(got)
    assert judged["met"] is None if got["gpus"] < 2 else isinstance(judged["met"], bool)
