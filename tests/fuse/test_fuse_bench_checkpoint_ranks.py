"""`mosafs bench checkpoint --ranks 1,2` run for real on the CPU at a tiny size: two
passes of rank processes on one cluster, the JSON's shape and sane figures (each rank's
changed step sends less than its first, each rank's last file loads back equal: a rank
that failed would fail the run), no noise in the output or the cluster's logs, and every
process and mount gone afterwards. Never asserts a speed (issue 23's figures are from the
lent two-GPU machine: docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import fuse_available
from tests.harness import NOISE, cli, mounts_under, pid_alive

pytestmark = pytest.mark.timeout(240)

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _needs_fuse_and_torch() -> None:
    reason = fuse_available()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("torch", reason="torch (CPU) is a test dependency")


def test_bench_checkpoint_ranks_cpu(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = cli("bench", "checkpoint", "--ranks", "1,2", "--size-mib", "8", "--steps", "2",
               "--device", "cpu", "--keep", str(run_dir), "--json", timeout=230)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert [line for line in done.stderr.splitlines() if NOISE.search(line)] == []
    logs = [run_dir / "up.log", *sorted((run_dir / "data" / "logs").glob("*.log"))]
    assert len(logs) > 1
    for log in logs:
        assert [x for x in log.read_text().splitlines() if NOISE.search(x)] == [], log

    assert result["params"]["ranks"] == [1, 2] and result["params"]["device"] == "cpu"
    assert result["command"].startswith("mosafs bench checkpoint --ranks 1,2")
    one, two = result["passes"]
    assert (one["ranks"], two["ranks"]) == (1, 2)
    assert one["gpus_of_ranks"] == [None] and two["gpus_of_ranks"] == [None, None]
    for p in (one, two):
        kinds = [s["kind"] for s in p["steps"]]
        assert kinds == ["first", "changed", "all_new", "all_new"]
        first, changed, *new = p["steps"]
        size = first["bytes"] // p["ranks"]
        assert size > 8 * MiB  # the state dict and its header
        for s in p["steps"]:
            assert s["bytes"] == size * p["ranks"] and len(s["rank_s"]) == p["ranks"]
            assert 0 < max(s["rank_s"]) <= s["wall_s"] and s["GBps"] > 0
            assert len(s["phases"]) == p["ranks"]
        for s in (first, *new):  # every byte new: nothing deduplicated
            assert s["bytes_sent"] == s["bytes"]
        assert 0 < changed["bytes_sent"] < first["bytes_sent"]
        assert set(p["median_GBps"]) == {"first", "changed", "all_new"}
        assert p["cluster_cpu_s"]["benefactors"] > 0
        # Each step of each rank sent new chunks, each stored twice (R=2) by a timed
        # store; grouped puts' blobs also wait for a storing thread, and local puts for a
        # serving thread.
        puts = p["benefactor_puts"]
        assert puts["store"]["count"] >= 2 * len(p["steps"]) * p["ranks"]
        assert puts["store"]["mean_ms"] > 0
        assert puts["wait"]["count"] + puts["local_wait"]["count"] > 0
    targets = result["targets"]
    assert set(targets) == {"changed_2_ranks_over_1", "all_new_2_ranks_over_1", "pass"}
    assert all(isinstance(t["met"], bool) for n, t in targets.items() if n != "pass")

    started = result["processes"]["started"]
    assert {p["name"] for p in started} >= {"up", "mount", "manager"}
    assert result["processes"]["left_running"] == []
    assert not [p for p in started if pid_alive(p["pid"])]
    assert mounts_under(tmp_path) == []
