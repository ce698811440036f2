"""`mosafs bench write --quick`: the JSON shape, and that every process and mount is gone
afterwards, after a normal run and after a Ctrl-C. Never asserts a speed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import fuse_available
from tests.harness import interrupt_bench, mounts_under, pid_alive, started_bench, up_pids

pytestmark = pytest.mark.timeout(180)

SMALL = ["--quick", "--size-mib", "16", "--memory-mib", "24"]
TARGETS = {"oab_1m_vs_null_write_1m", "asb_1m_mb_s", "oab_4k_vs_oab_1m",
           "cold_read_vs_null_read", "peak_rss_while_writing"}


@pytest.fixture(autouse=True)
def _needs_fuse() -> None:
    reason = fuse_available()
    if reason:
        pytest.skip(reason)


def test_bench_write_quick_json_shape(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "mosafs", "bench", "write", "--json", *SMALL,
         "--keep", str(run_dir), "--plot", str(tmp_path / "figures")],
        capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # exactly one JSON object on stdout
    figures = result.pop("figures")
    assert figures == [str(tmp_path / "figures" / "write.png")]
    assert (tmp_path / "figures" / "write.png").read_bytes()[:4] == b"\x89PNG"
    assert result == json.loads((run_dir / "result.json").read_text())

    size = 16 << 20
    assert result["params"]["size_bytes"] == size
    for name in ("write_1m", "write_4k", "read_1m"):
        figure = result["nullfs"][name]
        assert figure["mb_s"] > 0
        assert figure["fuse_requests_per_run"]
    mosafs = result["mosafs"]
    for name, block, n in (("write_1m", 1 << 20, size), ("write_4k", 4096, size),
                           ("write_memory", 1 << 20, 24 << 20)):
        w = mosafs[name]
        assert (w["bytes"], w["write_bytes"]) == (n, block)
        assert w["oab_mb_s"] > 0 and w["asb_mb_s"] > 0
        assert w["stats"]["size"] == n and w["stats"]["version"] >= 1
        assert w["stats"]["new_bytes"] == n  # different seeds: nothing deduped
        assert w["close_returned_s"] <= w["stats_confirmed_s"]
        assert w["peak_rss_bytes"] > 0
        assert {"mount", "manager", "benefactor-0", "benefactor-1", "benefactor-2"} <= set(
            w["cpu"]["cpu_s"])
    assert mosafs["read_cold"]["mb_s"] > 0 and mosafs["read_warm"]["mb_s"] > 0
    assert mosafs["read_verified"] is True
    assert mosafs["window_bytes"] == 64 << 20

    assert set(result["targets"]) == TARGETS
    for target in result["targets"].values():
        assert isinstance(target["pass"], bool)
        assert "value" in target and "target" in target
    assert result["targets"]["peak_rss_while_writing"]["measured_on"] == "write_memory"

    started = result["processes"]["started"]
    assert {p["name"] for p in started} >= {"nullfs", "up", "mount", "manager"}
    assert result["processes"]["left_running"] == []
    assert not [p for p in started if pid_alive(p["pid"])]
    assert mounts_under(run_dir) == []


def test_bench_write_ctrl_c_stops_everything(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with started_bench("write", "--json", *SMALL, "--keep", str(run_dir),
                       "--plot", str(tmp_path / "figures")) as bench:
        ready = run_dir / "mosafs" / "up.ready.json"
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert bench.poll() is None, bench.communicate()[1]
            assert time.monotonic() < deadline, "the mosafs cluster did not start"
            time.sleep(0.05)
        manager_ready = run_dir / "mosafs" / "data" / "run" / "manager.ready.json"
        pids = [*up_pids(ready), json.loads(manager_ready.read_text())["pid"]]
        interrupt_bench(bench, pids, run_dir, run_dir)


def test_bench_backends_cpu_json_shape(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "mosafs", "bench", "backends", "--backends", "cpu",
         "--size-mib", "64", "--json", "--keep", str(run_dir)],
        capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    cpu = result["backends"]["cpu"]
    assert cpu["backend_logged"] == "cpu"  # the mount says which backend it uses
    assert cpu["new"]["new_bytes"] == 64 << 20
    assert cpu["new"]["cpu_s_per_gib"] > 0
    # The checkpoint is the same file with a few edits: most chunks dedupe.
    assert cpu["checkpoint"]["shared_chunks"] > cpu["checkpoint"]["chunks"] // 2
    assert cpu["checkpoint"]["new_bytes"] < 32 << 20
    assert mounts_under(run_dir) == []
