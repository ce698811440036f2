"""`mosafs bench checkpoint` run for real on the CPU at a tiny size: the JSON's shape, sane
figures (a step with a tenth of the tensors changed sends less than the first; every load
equals the state), no noise in its output or the cluster's logs, and every process and
mount gone afterwards, after a normal run and after a Ctrl-C. Never asserts a speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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

MiB = 1 << 20
TARGETS = {"dedup_save_vs_torch_local", "dedup_bytes_to_host", "nonblocking_return_s",
           "all_new_save_vs_torch_local", "load_speed_vs_safetensors_local", "pass"}


@pytest.fixture(autouse=True)
def _needs_fuse_and_torch() -> None:
    reason = fuse_available()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("torch", reason="torch (CPU) is a test dependency")
    pytest.importorskip("safetensors.torch")


def test_bench_checkpoint_cpu_json_and_figures(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = cli("bench", "checkpoint", "--size-mib", "16", "--steps", "2", "--device", "cpu",
               "--keep", str(run_dir), "--local-dir", str(tmp_path / "local"), "--json",
               "--quiet-disks", "2", timeout=170)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # exactly one JSON object on stdout
    assert result == json.loads((run_dir / "result.json").read_text())
    assert [line for line in done.stderr.splitlines() if NOISE.search(line)] == []
    logs = [run_dir / "up.log", *sorted((run_dir / "data" / "logs").glob("*.log"))]
    assert len(logs) > 1
    for log in logs:
        assert [x for x in log.read_text().splitlines() if NOISE.search(x)] == [], log

    params = result["params"]
    assert (params["size_mib"], params["steps"], params["device"]) == (16, 2, "cpu")
    assert params["state_dict_bytes"] == 16 * MiB and params["as_issue"] is False
    assert {"benchmark", "date", "command", "machine", "params", "warmup_s", "steps",
            "loads", "targets", "notes", "processes", "elapsed_s"} <= set(result)
    assert result["command"].startswith("mosafs bench checkpoint --size-mib 16")
    assert result["machine"]["torch"] and result["machine"]["cpus"] >= 1

    steps = result["steps"]
    assert [s["kind"] for s in steps] == ["first", "changed", "nonblocking", "all_new"]
    assert params["quiet_s"] == 2.0
    for s in steps:  # each timed save began after a wait for idle disks, within the limit
        assert 0 <= s["disk_wait_s"] <= 2.5 and 0 <= s["torch_disk_wait_s"] <= 2.5
    size = steps[0]["save"]["size"]
    assert size == 16 * MiB + params["header_bytes"]
    for s in steps:
        assert s["bytes_hashed"] == size and s["save"]["size"] == size
        assert s["bytes_to_host"] == 0 and s["save"]["backend"] == "cpu"  # CPU tensors
        assert s["save"]["version"] == 1 and s["name"] == f"model.r0.{s['step']}"
        assert s["total_s"] > 0 and s["torch_save_local_s"] > 0 and s["torch_save_mount_s"] > 0
        assert s["torch_file_bytes"] > 16 * MiB
    first, changed, nonblocking, all_new = steps
    assert first["bytes_sent"] == size and all_new["bytes_sent"] == size  # all new
    assert first["changed_fraction"] == all_new["changed_fraction"] == 1.0
    for s in (changed, nonblocking):  # deduplicated against the step before
        assert 0.05 <= s["changed_fraction"] <= 0.15
        assert 0 < s["bytes_sent"] < first["bytes_sent"]
    assert changed["save_blocking_s"] > 0
    assert changed["ratio_vs_local"] == round(changed["save_blocking_s"]
                                              / changed["torch_save_local_s"], 3)
    nb = nonblocking["nonblocking"]
    assert nonblocking["save_blocking_s"] is None
    assert 0 < nb["returned_s"] <= nb["total_s"] and nb["blocked_s"] <= nb["total_s"]

    loads = result["loads"]
    assert loads["verified"] is True and loads["file"] == "model.r0.4"
    assert loads["file_bytes"] == size  # safetensors' own file: the same bytes' length
    for kind in ("cold", "warm"):
        assert loads[kind]["mosafs_s"] > 0 and loads[kind]["local_s"] > 0
    assert isinstance(loads["page_cache_dropped"], bool)

    targets = result["targets"]
    assert set(targets) == TARGETS
    assert targets["dedup_bytes_to_host"]["pass"] is None  # no GPU: nothing to judge
    for name in TARGETS - {"pass", "dedup_bytes_to_host"}:
        assert isinstance(targets[name]["pass"], bool), name
        assert targets[name]["value"] is not None and targets[name]["target"]
    assert targets["nonblocking_return_s"]["value"] == nb["returned_s"]

    started = result["processes"]["started"]
    assert {p["name"] for p in started} >= {"up", "mount", "manager"}
    assert result["processes"]["left_running"] == []
    assert not [p for p in started if pid_alive(p["pid"])]
    assert mounts_under(tmp_path) == []
    assert list((tmp_path / "local").iterdir())  # --keep keeps the local files too


def test_bench_checkpoint_ctrl_c_stops_everything(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with started_bench("checkpoint", "--size-mib", "64", "--steps", "5", "--device", "cpu",
                       "--keep", str(run_dir), "--json") as bench:
        assert bench.stderr is not None
        seen = []
        for line in bench.stderr:  # until step 1 is done: the signal lands in the series
            seen.append(line)
            if line.startswith("[bench] step 1 "):
                break
        assert seen and seen[-1].startswith("[bench] step 1 "), "".join(seen)
        out, _ = interrupt_bench(bench, up_pids(run_dir / "up.ready.json"), run_dir,
                                 tmp_path)
    assert out == ""
