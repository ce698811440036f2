"""The pure parts of the multi-GPU benchmarks (mosafs.bench.checkpoint_ranks and
mosafs.bench.ec_devices): how a pass's rows become aggregate figures, how a worker's
failure reaches the parent, the verdicts, and the devices part's refusal where no GPU
is usable. The runs themselves: tests/fuse/test_fuse_bench_checkpoint_ranks.py (CPU) and
tests/gpu/test_gpu_bench_devices.py (a GPU)."""

from __future__ import annotations

import queue
import subprocess
import sys
from pathlib import Path

import pytest

from mosafs.bench import checkpoint_ranks as ranks
from mosafs.bench import ec_devices
from mosafs.bench.procs import BenchError
from mosafs.chunking.gpu import probe_gpu

ROOT = Path(__file__).resolve().parents[2]
GiB = 1 << 30


def test_every_rank_of_every_pass_has_a_state_of_its_own() -> None:
    seeds = {ranks.rank_seed(0, n, r) for n in (1, 2, 4, 8) for r in range(n)}
    assert len(seeds) == 1 + 2 + 4 + 8
    assert ranks.rank_seed(1, 2, 0) != ranks.rank_seed(0, 2, 0)


def test_a_series_is_first_changed_steps_then_two_all_new() -> None:
    assert ranks.step_kinds(1) == ["first", "all_new", "all_new"]
    assert ranks.step_kinds(3) == ["first", "changed", "changed", "all_new", "all_new"]


def row(rank: int, step: int, kind: str, start: float, end: float,
        size: int = GiB, sent: int = GiB, unchanged: float | None = 0.0) -> tuple[object, ...]:
    return (rank, step, kind, start, end, size, sent, sent, unchanged, {"write_s": end - start})


def test_a_step_spans_the_first_call_to_the_last_return() -> None:
    rows = [row(0, 1, "first", 10.0, 11.0), row(1, 1, "first", 10.5, 12.0),
            row(1, 2, "changed", 20.0, 20.25, sent=GiB // 10, unchanged=0.9),
            row(0, 2, "changed", 20.0, 20.5, sent=GiB // 10, unchanged=0.91)]
    got = ranks._aggregate(rows, 2)
    first, changed = got["steps"]
    assert first["wall_s"] == 2.0 and first["bytes"] == 2 * GiB
    assert first["GBps"] == round(2 * GiB / 2.0 / 1e9, 3)
    assert first["rank_s"] == [1.0, 1.5]  # in rank order
    assert changed["wall_s"] == 0.5 and changed["unchanged_chunks"] == 0.9  # the worst rank
    assert changed["bytes_sent"] == 2 * (GiB // 10)
    assert got["median_GBps"] == {"first": first["GBps"], "changed": changed["GBps"]}


def test_a_step_some_rank_did_not_report_is_an_error() -> None:
    with pytest.raises(BenchError, match="step 1: 1 of 2 ranks reported"):
        ranks._aggregate([row(0, 1, "first", 0.0, 1.0)], 2)


def test_the_verdict_is_the_largest_pass_over_one_rank() -> None:
    passes = [{"ranks": 1, "median_GBps": {"changed": 5.0, "all_new": 1.0}},
              {"ranks": 2, "median_GBps": {"changed": 9.5, "all_new": 1.7}}]
    got = ranks.verdicts(passes)
    assert got["changed_2_ranks_over_1"] == {"value": 1.9, "target": ">= 1.8", "met": True}
    assert got["all_new_2_ranks_over_1"]["value"] == 1.7
    assert got["all_new_2_ranks_over_1"]["met"] is False and got["pass"] is False
    assert ranks.verdicts(passes[:1])["pass"] is None


def test_rounds_of_several_workers_become_aggregate_rates() -> None:
    out: queue.Queue[object] = queue.Queue()
    for worker, (start, end) in enumerate([(1.0, 2.0), (1.5, 3.0)]):
        out.put(("round", 0, start, end, 10**9, 5, 5))
        out.put(("done",))
        del worker
    assert ec_devices._collect(out, 2, 1, lambda: True) == [pytest.approx(1.0)]


def test_a_failed_worker_fails_its_arrangement_with_its_traceback() -> None:
    out: queue.Queue[object] = queue.Queue()
    out.put(("error", "Traceback ...\nRuntimeError: out of memory"))
    with pytest.raises(BenchError, match="out of memory"):
        ec_devices._collect(out, 2, 1, lambda: True)
    with pytest.raises(BenchError, match="ended without reporting"):
        ec_devices._collect(queue.Queue(), 1, 1, lambda: False)


def test_the_devices_verdict_is_judged_on_a_process_per_gpu() -> None:
    devices = {"gpus": 2,
               "process_per_gpu": {"one_gpu": {}, "all_gpus": {}, "scaling": 1.71},
               "thread_per_gpu": {"one_gpu": {}, "all_gpus": {}, "scaling": 1.85},
               "one_stream": {"error": "a worker failed"}}
    got = ec_devices.verdict(devices)
    assert (got["value"], got["met"], got["judged_on"]) == (1.71, False, "process_per_gpu")
    assert got["arrangements"]["thread_per_gpu"]["met"] is True
    assert got["arrangements"]["one_stream"] == {"scaling": None, "target": ">= 1.8",
                                                 "met": False, "error": "a worker failed"}
    assert ec_devices.verdict({"gpus": 1})["met"] is None


@pytest.mark.skipif(probe_gpu() is None, reason="a GPU is usable here: nothing to refuse")
def test_the_devices_part_without_a_gpu_is_a_one_line_error() -> None:
    done = subprocess.run([sys.executable, "-m", "mosafs", "bench", "ec", "--parts",
                           "devices", "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert "the devices part needs a GPU" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
