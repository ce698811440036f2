"""The torch checkpoint benchmark's pure parts (benchmarks/torch_checkpoint.py): the state
dict's layout, the subset rewritten each step, the verdicts and the table. None needs
torch: the module imports it only to run."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

MiB = 1 << 20
PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "torch_checkpoint.py"


@pytest.fixture(scope="module")
def tc() -> ModuleType:
    """The benchmark, imported from its file (benchmarks/ is no package), with torch made
    unimportable (None in sys.modules) whether or not it is installed."""
    spec = importlib.util.spec_from_file_location("torch_checkpoint_bench", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = {name: sys.modules.get(name) for name in ("torch", spec.name)}
    sys.modules["torch"] = None  # type: ignore[assignment]
    sys.modules[spec.name] = module  # dataclasses look their module up while being made
    try:
        spec.loader.exec_module(module)
    finally:
        for name, old in saved.items():
            if old is None:
                del sys.modules[name]
            else:
                sys.modules[name] = old
    return module


def test_without_torch_one_line_says_so(tc: ModuleType,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(SystemExit) as exc:
        tc.import_torch()
    message = str(exc.value.code)
    assert "needs PyTorch" in message and "\n" not in message


@pytest.mark.parametrize("mib", [1, 16, 256, 1024])
def test_layout_adds_up_and_looks_like_a_model(tc: ModuleType, mib: int) -> None:
    layout = tc.model_layout(mib * MiB)
    total = sum(s.nbytes for s in layout)
    assert mib * MiB - 4 <= total <= mib * MiB
    assert len({s.name for s in layout}) == len(layout)
    assert {s.dtype for s in layout} <= {"float32", "bfloat16"}
    assert max(s.nbytes for s in layout) <= 64 * MiB


def test_layout_of_a_gib(tc: ModuleType) -> None:
    sizes = [s.nbytes for s in tc.model_layout(1024 * MiB)]
    assert sizes.count(64 * MiB) == 4                           # a few embeddings
    assert sum(1 for n in sizes if 4 * MiB <= n <= 16 * MiB) > 100  # many matrices
    assert sum(1 for n in sizes if n < MiB) > 20                # norms and biases
    dtypes = {s.dtype for s in tc.model_layout(1024 * MiB)}
    assert dtypes == {"float32", "bfloat16"}


def test_choose_changed_comes_close_to_the_fraction(tc: ModuleType) -> None:
    sizes = [64, 64, *([4] * 50), *([8] * 20), *([16] * 10), 1, 1, 1]
    total = sum(sizes)
    for seed in range(20):
        taken = tc.choose_changed(sizes, 0.10, random.Random(seed))
        assert taken == sorted(set(taken))
        got = sum(sizes[i] for i in taken)
        assert abs(got - 0.10 * total) <= max(sizes[i] for i in taken) / 2
        for i in set(range(len(sizes))) - set(taken):  # none left out would come closer
            assert abs(got + sizes[i] - 0.10 * total) >= abs(got - 0.10 * total)
    assert tc.choose_changed(sizes, 0.0, random.Random(1)) == []
    assert tc.choose_changed(sizes, 1.0, random.Random(1)) == list(range(len(sizes)))


def test_choose_changed_is_seeded(tc: ModuleType) -> None:
    sizes = list(range(1, 100))
    a = tc.choose_changed(sizes, 0.3, random.Random("x"))
    assert a == tc.choose_changed(sizes, 0.3, random.Random("x"))
    assert a != tc.choose_changed(sizes, 0.3, random.Random("y"))


def test_small_tensors_change_with_their_neighbour(tc: ModuleType) -> None:
    layout = tc.model_layout(1024 * MiB)
    groups = tc.change_groups(layout)
    assert sorted(i for g in groups for i in g) == list(range(len(layout)))
    for g in groups:
        assert g == list(range(g[0], g[-1] + 1))                 # contiguous in the file
        assert sum(1 for i in g if layout[i].nbytes >= MiB) == 1  # one matrix each
    total = sum(s.nbytes for s in layout)
    for step in range(2, 8):
        changed = tc.changed_tensors(layout, 0.10, tc.step_rng(0, step))
        assert changed == tc.changed_tensors(layout, 0.10, tc.step_rng(0, step))
        fraction = sum(layout[i].nbytes for i in changed) / total
        assert 0.08 <= fraction <= 0.12
        whole = {tuple(g) for g in groups if set(g) <= set(changed)}
        assert sorted(i for g in whole for i in g) == changed    # whole runs only
    assert tc.changed_tensors(layout, 0.10, tc.step_rng(0, 2)) != \
        tc.changed_tensors(layout, 0.10, tc.step_rng(0, 3))


def test_verdicts(tc: ModuleType) -> None:
    ok = tc.verdicts([1.0, 1.0, 1.0], [1.4, 0.5, 0.9])
    assert ok["first_step_vs_local"]["pass"] is True
    assert ok["first_step_vs_local"]["value"] == 1.4
    assert ok["dedup_steps_vs_local"] == {**ok["dedup_steps_vs_local"], "value": 0.9,
                                          "per_step": [0.5, 0.9], "pass": True}
    assert ok["pass"] is True

    slow_first = tc.verdicts([1.0, 1.0], [1.6, 0.5])
    assert slow_first["first_step_vs_local"]["pass"] is False
    assert slow_first["pass"] is False

    # "less than local" is strict: equal is a failure, and one slow step fails them all.
    equal = tc.verdicts([1.0, 2.0, 1.0], [1.0, 1.0, 1.0])
    assert equal["dedup_steps_vs_local"]["pass"] is False
    assert equal["dedup_steps_vs_local"]["value"] == 1.0
    assert equal["pass"] is False

    single = tc.verdicts([1.0], [1.2])  # no deduplicated step: not judged
    assert single["first_step_vs_local"]["pass"] is True
    assert single["dedup_steps_vs_local"]["pass"] is None
    assert single["pass"] is None

    zero = tc.verdicts([0.0, 1.0], [1.0, 0.5])  # a ratio over nothing is no pass
    assert zero["first_step_vs_local"]["value"] is None
    assert zero["pass"] is False


def _result(tc: ModuleType) -> dict[str, Any]:
    steps = [
        {"step": 1, "changed_fraction": 1.0, "local_s": 1.0, "mosafs_s": 1.3, "ratio": 1.3,
         "new_bytes": 256 * MiB, "deduped_fraction": 0.0,
         "mosafs_cpu": {"cluster_cpu_s": 3.2}},
        {"step": 2, "changed_fraction": 0.1, "local_s": 1.0, "mosafs_s": 1.2, "ratio": 1.2,
         "mosafs_cpu": {"cluster_cpu_s": 1.0}},  # no stats: shown as "-"
    ]
    return {"steps": steps,
            "loads": {"cold": {"local_s": 0.5, "mosafs_s": 2.0, "ratio": 4.0}},
            "targets": tc.verdicts([1.0, 1.0], [1.3, 1.2])}


def test_table(tc: ModuleType) -> None:
    table = tc.format_table(_result(tc))
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["step", "changed", "local", "s"]
    assert lines[1].split() == ["1", "100.0%", "1.00", "1.30", "1.30", "256", "0.0%", "3.20"]
    assert lines[2].split() == ["2", "10.0%", "1.00", "1.20", "1.20", "-", "-", "1.00"]
    assert "load cold: local 0.50s, mosafs 2.00s, ratio 4.00" in lines
    assert "first_step_vs_local: 1.30 (target <= 1.5) PASS" in lines
    assert "dedup_steps_vs_local: 1.20 (target < 1.0 each) FAIL" in lines
    assert lines[-1] == "overall: FAIL"


def test_options(tc: ModuleType) -> None:
    opts = tc.parse_args(["--size-mib", "8", "--steps", "2", "--device", "cpu",
                          "--up-arg=--hash-backend=cpu", "--up-arg=--insecure"])
    assert (opts.size, opts.steps, opts.changed, opts.device) == (8 * MiB, 2, 0.10, "cpu")
    assert opts.up_args == ["--hash-backend=cpu", "--insecure"]
    assert tc.parse_args([]).device is None  # chosen once torch is imported
    with pytest.raises(SystemExit):
        tc.parse_args(["--changed", "1.5"])
