"""`mosafs bench standby` run for real with tiny counts and one pair: a metadata benchmark
on a `mosafs up` cluster, then one on `mosafs up --managers 2` (an active manager, a
standby and etcd), the JSON's figures taken from each run and summarized, no noise in
its output or in any cluster's logs, and every process and mount gone afterwards. Never
asserts a speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mosafs.bench.standby import LINES
from tests.conftest import fuse_available
from tests.harness import NOISE, cli, mounts_under

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(autouse=True)
def _needs_fuse() -> None:
    reason = fuse_available()
    if reason:
        pytest.skip(reason)


def test_bench_standby_one_pair(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = cli("bench", "standby", "--pairs", "1", "--files", "5", "--dir-entries", "40",
               "--commit-files", "2", "--commit-chunks", "4", "--keep", str(run_dir),
               "--json", timeout=220)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # exactly one JSON object on stdout
    assert [line for line in done.stderr.splitlines() if NOISE.search(line)] == []
    assert result["benchmark"] == "mosafs bench standby"
    assert result["params"]["pairs"] == 1 and result["params"]["clients"] == [1, 8]

    runs = result["runs"]
    assert [(r["pair"], r["managers"]) for r in runs] == [(1, 1), (1, 2)]
    for run in runs:
        assert set(run["figures"]) == {*LINES, "control_stat_uncached_8"}
        assert all(v > 0 for v in run["figures"].values())
        assert run["left_running"] == []
    for line in LINES:
        summary = result["lines"][line]
        assert summary["one_manager"] == [runs[0]["figures"][line]]
        assert summary["with_standby"] == [runs[1]["figures"][line]]
        expected = round(100 * (runs[1]["figures"][line] / runs[0]["figures"][line] - 1), 1)
        assert summary["change_pct"] == summary["change_pct_by_pair"][0] == expected
    assert isinstance(result["target"]["pass"], bool)

    # Each run kept its own cluster; the one with a standby ran two managers, and no
    # cluster's log holds a warning, an error or a traceback.
    one, two = run_dir / "pair1-m1", run_dir / "pair1-m2"
    for kept in (one, two):
        assert json.loads((kept / "result.json").read_text())["runs"][1]["clients"] == 8
        logs = sorted((kept / "mosafs" / "data" / "logs").glob("*.log"))
        assert logs
        for log in logs:
            assert [x for x in log.read_text().splitlines() if NOISE.search(x)] == [], log
    managers = {p.name for p in (two / "mosafs" / "data" / "logs").glob("manager*.log")}
    assert len(managers) == 2, managers
    assert mounts_under(tmp_path) == []
