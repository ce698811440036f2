"""`mosafs bench metadata` run for real on a `mosafs up` cluster with tiny counts: the JSON's
shape, figures that are positive and add up (every operation counted, rates that are the
operations over the span, p50 <= p99 <= max), no noise in its output, the cluster's logs or
the clients' logs, and every process and mount gone afterwards, after a normal run and
after a Ctrl-C. Never asserts a speed. Without MooseFS (--peer none)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from mosafs.bench.procs import children, cmdline
from tests.conftest import fuse_available
from tests.harness import (
    NOISE,
    cli,
    interrupt_bench,
    mounts_under,
    pid_alive,
    started_bench,
    up_pids,
)

pytestmark = pytest.mark.timeout(180)

FILES, ENTRIES, COMMIT_FILES, COMMIT_CHUNKS = 5, 40, 2, 4
PHASES = ("creates_shared_dir", "creates_own_dirs", "stat_cached", "lookups_missing",
          "stat_uncached", "commits")
LISTINGS = ("ls_l_cold", "ls_l_warm", "listdir_cold", "listdir_warm")


@pytest.fixture(autouse=True)
def _needs_fuse() -> None:
    reason = fuse_available()
    if reason:
        pytest.skip(reason)


def _check_phase(phase: dict[str, Any], clients: int, ops: int) -> None:
    assert phase["clients"] == clients and phase["ops"] == ops
    assert phase["seconds"] > 0 and phase["ops_per_s"] > 0
    # The rate is the operations over the span (both rounded in the JSON: the span to a
    # microsecond, which is a part in a hundred of the shortest phase here).
    assert abs(phase["ops_per_s"] - ops / phase["seconds"]) <= 0.01 * phase["ops_per_s"] + 0.1
    assert len(phase["per_client_ops_per_s"]) == clients
    assert all(r > 0 for r in phase["per_client_ops_per_s"])
    assert 0 <= phase["start_spread_s"] < phase["seconds"]
    cpu = phase["cpu"]
    assert {"manager", "mount", "benefactor-0", "clients"} <= set(cpu["cpu_s"])
    assert phase["manager_cpu_s"] == cpu["cpu_s"]["manager"] >= 0
    assert phase["mount_cpu_s"] >= cpu["cpu_s"]["mount"] >= 0
    assert phase["clients_cpu_s"] == cpu["cpu_s"]["clients"] >= 0


def test_bench_metadata_json_figures_and_clean_up(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = cli("bench", "metadata", "--clients", "1,8", "--files", str(FILES),
               "--dir-entries", str(ENTRIES), "--commit-files", str(COMMIT_FILES),
               "--commit-chunks", str(COMMIT_CHUNKS), "--peer", "none",
               "--scale-chunks", "3000", "--scale-files", "300", "--scale-idle-s", "2",
               "--keep", str(run_dir), "--json", timeout=200)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # exactly one JSON object on stdout
    assert result == json.loads((run_dir / "result.json").read_text())
    assert [line for line in done.stderr.splitlines() if NOISE.search(line)] == []
    logs = [run_dir / "mosafs" / "up.log", *sorted((run_dir / "mosafs" / "data" / "logs")
                                                   .glob("*.log"))]
    assert len(logs) > 1
    for log in logs:
        assert [x for x in log.read_text().splitlines() if NOISE.search(x)] == [], log
    client_logs = sorted((run_dir / "clients").glob("*.log"))
    assert len(client_logs) == 1 + 8 + 8 + 8  # n1, n8, the large directory's, the floor's
    assert [p.name for p in client_logs if p.read_text()] == []

    assert {"benchmark", "date", "command", "machine", "params", "cluster", "runs",
            "large_dir", "moosefs", "targets", "targets_pass", "notes", "processes",
            "elapsed_s"} <= set(result)
    assert result["command"].startswith("mosafs bench metadata --clients 1,8")
    assert result["machine"]["cpus"] >= 1
    params = result["params"]
    assert (params["clients"], params["files"], params["dir_entries"]) == ([1, 8], FILES,
                                                                           ENTRIES)
    assert (params["commit_files"], params["commit_chunks"], params["tls"]) == (
        COMMIT_FILES, COMMIT_CHUNKS, True)
    assert result["cluster"]["up_args"] == ["--chunker", "fixed:4096"]

    assert [r["clients"] for r in result["runs"]] == [1, 8]
    for run in result["runs"]:
        n = run["clients"]
        for name in PHASES:
            _check_phase(run[name], n, n * (COMMIT_FILES if name == "commits" else FILES))
            lat = run[name]["latency_ms"]
            assert 0 <= lat["p50"] <= lat["p99"] <= lat["max"], name
        assert run["stat_uncached"]["caches_dropped"] is (os.geteuid() == 0)
        assert run["stat_uncached"]["waited_s"] > 1

    large = result["large_dir"]
    assert large["entries"] == ENTRIES
    _check_phase(large["fill"], 8, ENTRIES)
    for name in LISTINGS:
        _check_phase(large[name], 1, ENTRIES)
    assert large["ls_l_cold"]["caches_dropped"] is (os.geteuid() == 0)
    assert result["moosefs"] == {"skipped": "not asked for (--peer none)"}
    # The floor: the same creates and stats on the null namespace, by its one process.
    floor = result["floor"]
    assert floor["clients"] == 8 and params["floor"] is True
    for name in ("creates_shared_dir", "creates_own_dirs", "stat_cached", "stat_uncached"):
        assert floor[name]["ops"] == 8 * FILES and floor[name]["ops_per_s"] > 0, name
        assert {"nullns", "clients"} <= set(floor[name]["cpu"]["cpu_s"])
        assert floor[name]["mount_cpu_s"] == floor[name]["cpu"]["cpu_s"]["nullns"]
    assert floor["stat_uncached"]["caches_dropped"] is (os.geteuid() == 0)
    # The synthetic manager: generated, served, idle, asked for its status, one benefactor
    # stopped and its chunks copied from the others.
    scale = result["scale"]
    assert (scale["generated"]["chunks"], scale["generated"]["files"]) == (3000, 300)
    assert scale["chunks_in_status"] == 3000
    assert 0 <= scale["idle_cpu_share"] < 1
    assert 0 < scale["status_ms"]["p50"] <= scale["status_ms"]["p99"]
    failure = scale["failure"]
    assert failure["detection_s"] > 0 and failure["first_copy_after_detection_s"] >= 0
    assert failure["chunks_copied_in_window"] == 3000 * 2 // 6  # all the stopped one held

    targets = result["targets"]
    assert targets["creates_per_s_own_dirs"]["value"] == \
        result["runs"][1]["creates_own_dirs"]["ops_per_s"]
    assert targets["commit_close_p99_ms"]["value"] == \
        result["runs"][1]["commits"]["latency_ms"]["p99"]
    for name in ("creates_per_s_shared_dir", "creates_per_s_own_dirs", "commit_close_p99_ms",
                 "stat_cached_per_s", "stat_uncached_per_s"):
        assert isinstance(targets[name]["pass"], bool), name  # judged at 8 clients
    for name, phase in (("creates_per_s_own_dirs", "creates_own_dirs"),
                        ("stat_uncached_per_s", "stat_uncached")):
        assert targets[name]["floor_per_s"] == floor[phase]["ops_per_s"]
        assert targets[name]["of_floor"] > 0
    for name in ("creates_shared_dir_vs_moosefs", "creates_own_dirs_vs_moosefs",
                 "ls_l_100000_entries_s", "scale_idle_cpu_share",
                 "scale_rereplication_start_s", "scale_status_p99_ms"):
        assert targets[name]["pass"] is None and targets[name]["note"], name
    assert result["targets_pass"] is all(t["pass"] for t in targets.values()
                                         if t["pass"] is not None)

    started = result["processes"]["started"]
    names = {p["name"] for p in started}
    assert {"up", "mount", "manager", "n1-client-0", "n8-client-7", "large-client-7",
            "nullns", "nullns-client-7"} <= names
    assert result["processes"]["left_running"] == []
    assert not [p for p in started if pid_alive(p["pid"])]
    assert mounts_under(tmp_path) == []


def test_bench_metadata_ctrl_c_stops_everything(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with started_bench("metadata", "--clients", "8", "--files", "100000", "--peer", "none",
                       "--keep", str(run_dir), "--json") as bench:
        deadline = time.monotonic() + 120
        clients: list[int] = []
        while len(clients) < 8:  # the signal lands while the clients create files
            assert bench.poll() is None, bench.communicate()[1]
            assert time.monotonic() < deadline, "the clients did not start"
            time.sleep(0.1)
            clients = [c for c in children(bench.pid)
                       if "mosafs.bench.metadata_ops" in cmdline(c)]
        time.sleep(1)
        pids = [*up_pids(run_dir / "mosafs" / "up.ready.json"), *clients]
        out, _ = interrupt_bench(bench, pids, run_dir, tmp_path)
    assert out == ""
