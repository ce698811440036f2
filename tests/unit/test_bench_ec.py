"""`mosafs bench ec` (mosafs.bench.ec): the command's refusals, the coder part's JSON on
a machine without a GPU, and the targets judged on given figures. The mount part starts
clusters of up to 11 benefactors; it is measured by hand (docs/benchmarks.md), not here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mosafs.bench.ec import targets, tolerated, width

ROOT = Path(__file__).resolve().parents[2]


def mosafs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mosafs", "bench", "ec", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(("args", "words"), [
    (["--layouts", "ec:40+2"], "K (data fragments) must be 1..16"),
    (["--layouts", "raid6"], "bad redundancy"),
    (["--layouts", "ec:8+2", "--benefactors", "6"], "needs 10 benefactors"),
    (["--parts", "coders,speed"], "--parts takes some of"),
    (["--size-mib", "0"], "--size-mib"),
])
def test_cli_bad_arguments_get_one_line_and_exit_2(args: list[str], words: str) -> None:
    done = mosafs(*args)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr


def test_cli_coders_quick_json_without_gpu() -> None:
    done = mosafs("--parts", "coders", "--quick", "--no-gpu", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    row = result["coders"]["isal"]["4+2"]
    assert row["encode_GBps_1_thread"] > 0 and row["decode_GBps_2_lost_1_thread"] > 0
    target = result["targets"]["cpu_encode_4_2_one_core_at_least_4GBps"]
    assert target["value"] == row["encode_GBps_1_thread"] and isinstance(target["met"], bool)
    assert result["coders"]["gpu"] == {"skipped": "not asked for"}


def test_layout_arithmetic() -> None:
    assert (tolerated("replicas:3"), width("replicas:3")) == (2, 3)
    assert (tolerated("ec:8+2"), width("ec:8+2")) == (2, 10)


def test_targets_judge_the_figures() -> None:
    def layout(write: float, stored: float, ratio: float) -> dict[str, object]:
        return {"write": {"asb_mb_s": write}, "stored_per_byte": stored,
                "degraded_over_healthy": ratio}

    result = {"mount": {"ec:4+2": layout(200, 1.56, 0.4), "replicas:3": layout(100, 3, 1)},
              "rebuild": {"comparisons": {"ec:1+1": {"speedup": 3.2}}}}
    judged = targets(result)
    assert judged["space_ec_4_2_at_most_1.55x"]["met"] is False
    assert judged["degraded_read_at_least_0.5x"]["met"] is False
    assert judged["ec_4_2_write_at_least_replicas_3"] == {"value": 2.0, "target": ">= 1.0",
                                                          "met": True}
    assert judged["rebuild_ec_1_1_6_survivors_at_least_3x_2"]["met"] is True
