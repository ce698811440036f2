"""`mosafs bench checkpoint`'s pure parts (mosafs/bench/checkpoint_plan.py): the state dict's
plan, the tensors each step changes, the verdicts on the issue's targets, the table, and
the command line. No cluster: tests/fuse/test_fuse_bench_checkpoint.py runs the real thing.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from mosafs.bench import checkpoint as ck
from mosafs.bench import checkpoint_plan as ckp
from mosafs.bench.procs import BenchError
from mosafs.cli import build_parser

MiB = 1 << 20
GiB = 1 << 30


def test_the_plan_adds_up_to_the_size_in_tensors_of_4_to_64_mib_and_small_ones() -> None:
    for total in (1 * MiB, 16 * MiB, 100 * MiB + 12, 256 * MiB, GiB):
        plan = ckp.plan_state(total)
        assert 0 <= total - sum(t.nbytes for t in plan) < 4
        assert len({t.name for t in plan}) == len(plan)
    plan = ckp.plan_state(GiB)
    sizes = sorted({t.nbytes for t in plan})
    assert {4 * MiB, 8 * MiB, 16 * MiB, 64 * MiB} <= set(sizes)
    assert max(sizes) == 64 * MiB and min(sizes) == 4096  # norms and biases
    big = sum(t.nbytes for t in plan if t.nbytes >= 4 * MiB)
    assert big > 0.95 * GiB
    assert {t.dtype for t in plan} == {"float32", "bfloat16"}


def test_file_order_and_header_are_what_safetensors_writes() -> None:
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    plan = ckp.plan_state(16 * MiB)
    state = {t.name: torch.zeros(t.shape, dtype=getattr(torch, t.dtype)) for t in plan}
    data = safetensors_torch.save(state)
    order, header = ckp.file_order(plan)
    assert header == 8 + int.from_bytes(data[:8], "little")
    import json

    entries = json.loads(data[8:header])
    by_offset = sorted(entries, key=lambda name: entries[name]["data_offsets"][0])
    assert [plan[i].name for i in order] == by_offset


def test_change_groups_hold_every_tensor_once_with_one_large_tensor_each() -> None:
    for total in (16 * MiB, GiB):
        plan = ckp.plan_state(total)
        groups = ckp.change_groups(plan)
        assert sorted(i for g in groups for i in g) == list(range(len(plan)))
        assert [i for g in groups for i in g] == ckp.file_order(plan)[0]
        for g in groups:
            large = [i for i in g if plan[i].nbytes >= ckp.SMALL]
            assert len(large) == 1
            assert g[-1] == large[0] or g is groups[-1]  # small ones at the end join it


@pytest.mark.parametrize("fraction", [0.05, 0.10, 0.25, 0.5, 0.9])
def test_changed_tensors_come_to_about_the_fraction_of_the_bytes(fraction: float) -> None:
    plan = ckp.plan_state(GiB)
    total = sum(t.nbytes for t in plan)
    largest = max(sum(plan[i].nbytes for i in g) for g in ckp.change_groups(plan))
    subsets = []
    for step in range(2, 12):
        chosen = ckp.changed_tensors(plan, fraction, ckp.step_rng(0, step))
        changed = sum(plan[i].nbytes for i in chosen)
        assert abs(changed - fraction * total) <= largest / 2, (step, changed / total)
        assert chosen == sorted(set(chosen))
        subsets.append(tuple(chosen))
    assert len(set(subsets)) > 5  # a different subset each step


def test_changed_tensors_are_seeded_and_take_whole_groups() -> None:
    plan = ckp.plan_state(64 * MiB)
    first = ckp.changed_tensors(plan, 0.1, ckp.step_rng(3, 2))
    assert first == ckp.changed_tensors(plan, 0.1, ckp.step_rng(3, 2))
    assert first != ckp.changed_tensors(plan, 0.1, ckp.step_rng(4, 2))
    for g in ckp.change_groups(plan):
        assert set(g) <= set(first) or not set(g) & set(first)
    assert ckp.changed_tensors(plan, 0.0, ckp.step_rng(0, 2)) == []
    assert ckp.changed_tensors(plan, 1.0, ckp.step_rng(0, 2)) == list(range(len(plan)))


def test_step_kinds() -> None:
    assert ckp.step_kinds(1) == ["first", "nonblocking", "all_new"]
    assert ckp.step_kinds(3) == ["first", "changed", "changed", "nonblocking", "all_new"]


def _row(step: int, kind: str, save: float | None, local: float, *, to_host: int = 0,
         sent: int = 0, returned: float | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"step": step, "kind": kind, "save_blocking_s": save,
                           "torch_save_local_s": local, "bytes_to_host": to_host,
                           "bytes_sent": sent, "total_s": save or 1.0,
                           "torch_save_mount_s": 2.0, "changed_fraction": 0.1,
                           "bytes_hashed": GiB, "ratio_vs_local": ckp.ratio(save, local)}
    if returned is not None:
        row["nonblocking"] = {"returned_s": returned, "blocked_s": returned, "total_s": 0.3}
    return row


def _steps(dedup_save: float = 0.15, new_save: float = 1.0, returned: float = 0.05,
           to_host: int = 110_000 + 1000) -> list[dict[str, Any]]:
    return [_row(1, "first", new_save, 1.0, to_host=GiB, sent=GiB),
            _row(2, "changed", 0.1, 1.0, to_host=1000, sent=100_000),
            _row(3, "changed", dedup_save, 1.0, to_host=to_host, sent=100_000),
            _row(4, "nonblocking", None, 1.0, returned=returned, to_host=5, sent=5),
            _row(5, "all_new", 0.9, 1.0, to_host=GiB, sent=GiB)]


LOADS = {"cold": {"mosafs_s": 1.0, "local_s": 0.8}, "warm": {"mosafs_s": 0.5, "local_s": 0.4},
         "page_cache_dropped": True}


def test_verdicts_at_the_targets_pass_and_just_beyond_fail() -> None:
    ok = ckp.verdicts(_steps(), LOADS, device="cuda", header_bytes=1000)
    assert ok["pass"] is True
    assert ok["dedup_save_vs_torch_local"]["value"] == 0.15
    assert ok["dedup_save_vs_torch_local"]["steps"] == [2, 3]
    assert ok["dedup_bytes_to_host"]["per_step"][1]["limit_bytes"] == 111_000
    assert ok["nonblocking_return_s"]["value"] == 0.05
    assert ok["all_new_save_vs_torch_local"]["steps"] == [1, 5]
    assert ok["load_speed_vs_safetensors_local"]["value"] == 0.8
    for name, steps in [("dedup_save_vs_torch_local", _steps(dedup_save=0.16)),
                        ("dedup_bytes_to_host", _steps(to_host=111_001)),
                        ("nonblocking_return_s", _steps(returned=0.051)),
                        ("all_new_save_vs_torch_local", _steps(new_save=1.01))]:
        bad = ckp.verdicts(steps, LOADS, device="cuda", header_bytes=1000)
        assert bad[name]["pass"] is False and bad["pass"] is False, name
        assert [n for n, t in bad.items() if n != "pass" and t["pass"] is False] == [name]
    slow = {**LOADS, "cold": {"mosafs_s": 1.0, "local_s": 0.79}}
    bad = ckp.verdicts(_steps(), slow, device="cuda", header_bytes=1000)
    assert bad["load_speed_vs_safetensors_local"]["value"] == 0.79
    assert bad["pass"] is False


def test_verdicts_judge_nothing_that_is_not_there() -> None:
    on_cpu = ckp.verdicts(_steps(to_host=10 * GiB), LOADS, device="cpu", header_bytes=1000)
    assert on_cpu["dedup_bytes_to_host"]["pass"] is None  # no device: nothing copied
    assert on_cpu["pass"] is True
    one_step = [s for s in _steps() if s["kind"] != "changed"]
    got = ckp.verdicts(one_step, None, device="cuda", header_bytes=1000)
    assert got["dedup_save_vs_torch_local"] == {
        "value": None, "target": "<= 0.15", "pass": None, "values": [], "steps": [],
        "unchanged_chunks": [], "note": None}
    assert got["load_speed_vs_safetensors_local"]["pass"] is None
    assert got["pass"] is True
    assert ckp.verdicts([], None, device="cuda", header_bytes=1000)["pass"] is None


def test_format_table_has_a_row_per_step_the_loads_and_the_verdicts() -> None:
    steps = _steps(dedup_save=0.5)
    result = {"benchmark": "mosafs bench checkpoint", "steps": steps, "loads": LOADS,
              "params": {"state_dict_bytes": GiB, "tensors": 202, "device": "cuda",
                         "changed": 0.1},
              "targets": ckp.verdicts(steps, LOADS, device="cuda", header_bytes=1000)}
    lines = ckp.format_table(result).splitlines()
    assert lines[0] == ("mosafs bench checkpoint: 1024 MiB state dict, 202 tensors on cuda, "
                        "10% changed per step")
    rows = [line.split() for line in lines if line[:4].strip().isdigit()]
    assert [r[:2] for r in rows] == [["1", "first"], ["2", "changed"], ["3", "changed"],
                                     ["4", "nonblocking"], ["5", "all_new"]]
    assert rows[2][3] == "0.500" and rows[3][3] == "-"
    assert "     non-blocking: returned in 0.0500s, saved in 0.300s" in lines
    assert "load cold: mosafs 1.000s, safetensors local 0.800s" in lines
    assert "dedup_save_vs_torch_local: 0.500 (target <= 0.15) FAIL" in lines
    assert "nonblocking_return_s: 0.050 (target <= 0.05 s) PASS" in lines
    assert lines[-1] == "overall: FAIL"


def test_up_args_add_the_gpu_backend_on_cuda_unless_chosen() -> None:
    assert ck._up_args([], "cpu") == []
    assert ck._up_args(["--benefactors=4"], "cuda") == ["--benefactors=4", "--hash-backend",
                                                         "gpu"]
    assert ck._up_args(["--hash-backend=cpu"], "cuda") == ["--hash-backend=cpu"]


def test_the_command_line() -> None:
    args = build_parser().parse_args(["bench", "checkpoint"])
    assert (args.size_mib, args.steps, args.changed, args.device, args.local_dir,
            args.keep, args.up_arg, args.seed, args.json) == (
        1024, 5, 0.10, None, None, None, [], 0, False)
    args = build_parser().parse_args(
        ["bench", "checkpoint", "--size-mib", "16", "--steps", "2", "--changed", "0.5",
         "--device", "cpu", "--up-arg=--benefactors=4", "--up-arg=--insecure", "--json"])
    assert (args.size_mib, args.steps, args.changed, args.device, args.up_arg, args.json) == (
        16, 2, 0.5, "cpu", ["--benefactors=4", "--insecure"], True)


@pytest.mark.parametrize(("flag", "value"), [("--size-mib", "0"), ("--steps", "0"),
                                             ("--changed", "1.5"), ("--changed", "-0.1"),
                                             ("--device", "tpu")])
def test_bad_values_are_one_line_errors(flag: str, value: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["bench", "checkpoint", f"{flag}={value}"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"mosafs bench checkpoint: argument {flag}: ") and "\n" not in error


def test_cuda_without_a_gpu_is_an_error_before_anything_starts() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    with pytest.raises(BenchError, match="torch sees no CUDA device"):
        ck.run_checkpoint(size_mib=1, device="cuda")


def test_the_module_and_the_help_need_no_torch() -> None:
    code = ("import sys, mosafs.bench.checkpoint, mosafs.bench.cli; "
            "assert 'torch' not in sys.modules and 'safetensors' not in sys.modules")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


def test_verdicts_name_changed_steps_short_of_the_issues_unchanged_chunks() -> None:
    steps = _steps()
    steps[1]["unchanged_chunks"], steps[2]["unchanged_chunks"] = 0.95, 0.86
    got = ckp.verdicts(steps, LOADS, device="cuda", header_bytes=1000)
    dedup = got["dedup_save_vs_torch_local"]
    assert dedup["unchanged_chunks"] == [0.95, 0.86]
    assert dedup["note"] is not None and "steps [3]" in dedup["note"]
    steps[2]["unchanged_chunks"] = 0.9
    assert ckp.verdicts(steps, LOADS, device="cuda", header_bytes=1000)[
        "dedup_save_vs_torch_local"]["note"] is None
