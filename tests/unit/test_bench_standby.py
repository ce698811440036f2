"""The figures of `mosafs bench standby` (mosafs.bench.standby) from runs made up here:
the ABBA order, the means and changes per line, the verdict on either side of the 20 %
line, slow runs flagged by the control, and the figures taken from a metadata result.
The real command: tests/fuse/test_fuse_bench_standby.py."""

from __future__ import annotations

from typing import Any

import pytest

from mosafs.bench import standby


def _run(pair: int, managers: int, own: float, shared: float, one: float,
         control: float = 25_000.0) -> dict[str, Any]:
    return {"pair": pair, "managers": managers,
            "figures": {"creates_own_dirs_8": own, "creates_shared_dir_8": shared,
                        "creates_1_client": one, "control_stat_uncached_8": control}}


def test_runs_alternate_in_abba_order() -> None:
    assert standby.order(1) == [(1, 1), (1, 2)]
    assert standby.order(3) == [(1, 1), (1, 2), (2, 2), (2, 1), (3, 1), (3, 2)]


def test_means_changes_and_a_met_target() -> None:
    runs = [_run(1, 1, 1000, 500, 500), _run(1, 2, 900, 400, 450),
            _run(2, 2, 880, 420, 470), _run(2, 1, 1100, 520, 520)]
    out = standby.summarize(runs)
    own = out["lines"]["creates_own_dirs_8"]
    assert own["one_manager"] == [1000, 1100] and own["with_standby"] == [900, 880]
    assert (own["mean_one_manager"], own["mean_with_standby"]) == (1050.0, 890.0)
    assert own["change_pct"] == -15.2  # 890 / 1050 - 1
    assert own["change_pct_by_pair"] == [-10.0, -20.0]
    shared = out["lines"]["creates_shared_dir_8"]
    assert shared["change_pct"] == -19.6  # 410 / 510 - 1: within the line
    assert out["target"] == {"max_loss_pct": 20.0, "worst_line": "creates_shared_dir_8",
                             "worst_change_pct": -19.6, "pass": True,
                             "pass_ci95": False}  # two pairs: intervals far too wide
    assert out["slow_runs"] == []


def test_one_line_beyond_20_percent_fails_the_target() -> None:
    runs = [_run(1, 1, 1000, 500, 500), _run(1, 2, 950, 390, 480)]
    out = standby.summarize(runs)
    assert out["lines"]["creates_shared_dir_8"]["change_pct"] == -22.0
    assert out["target"]["pass"] is False
    assert out["target"]["worst_line"] == "creates_shared_dir_8"


def test_a_run_with_a_low_control_is_flagged_not_dropped() -> None:
    runs = [_run(1, 1, 1000, 500, 500, 25_000), _run(1, 2, 800, 400, 450, 14_000),
            _run(2, 2, 900, 450, 480, 24_000), _run(2, 1, 1000, 500, 500, 26_000)]
    out = standby.summarize(runs)
    assert out["slow_runs"] == [{"pair": 1, "managers": 2,
                                 "control_stat_uncached_8": 14_000}]
    # The slow run still counts: (800 + 900) / 2 against 1000.
    assert out["lines"]["creates_own_dirs_8"]["change_pct"] == -15.0


def test_figures_come_from_the_metadata_phases() -> None:
    def phase(rate: float) -> dict[str, float]:
        return {"ops_per_s": rate}

    result = {"runs": [
        {"clients": 1, "creates_own_dirs": phase(480.5), "creates_shared_dir": phase(470),
         "stat_uncached": phase(9_000)},
        {"clients": 8, "creates_own_dirs": phase(1150), "creates_shared_dir": phase(495.5),
         "stat_uncached": phase(24_000)},
    ]}
    assert standby.figures(result) == {
        "creates_own_dirs_8": 1150.0, "creates_shared_dir_8": 495.5,
        "creates_1_client": 480.5, "control_stat_uncached_8": 24_000.0}


def test_the_table_names_the_verdict_and_the_slow_runs() -> None:
    runs = [_run(1, 1, 1000, 500, 500, 25_000), _run(1, 2, 700, 400, 450, 10_000)]
    result = standby.summarize(runs)
    table = standby.format_table(result)
    assert "NOT met (worst creates_own_dirs_8, -30.0 %)" in table
    assert "slow run flagged: pair 1, managers 2" in table


@pytest.mark.parametrize("pairs", [0, 51])
def test_pairs_out_of_range_is_a_usage_error(pairs: int) -> None:
    import argparse

    from mosafs.bench.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["standby", "--pairs", str(pairs)])
    assert exc.value.code == 2


def test_the_interval_of_the_pairs_changes() -> None:
    assert standby.interval95([-10.0]) is None
    # Two pairs: mean -15, sd 7.07, t = 12.706 (1 degree of freedom), half 63.5.
    assert standby.interval95([-10.0, -20.0]) == [-78.5, 48.5]
    # Eight pairs: t = 2.365 (7 degrees of freedom).
    changes = [-12.0, -18.0, -15.0, -9.0, -21.0, -14.0, -16.0, -11.0]
    low, high = standby.interval95(changes)  # type: ignore[misc]
    assert (low, high) == (-17.8, -11.2)  # mean -14.5, sd 3.89, half 3.25


def test_the_verdict_at_95_percent_needs_every_interval_within_the_line() -> None:
    tight = [(p, -15.0 + (p % 2)) for p in range(1, 9)]
    runs = [r for p, c in tight for r in (
        _run(p, 1, 1000, 500, 500), _run(p, 2, 1000 * (1 + c / 100), 500 * (1 + c / 100),
                                         500 * (1 + c / 100)))]
    out = standby.summarize(runs)
    assert out["target"]["pass"] is True and out["target"]["pass_ci95"] is True
    wide = [*runs[:-1], _run(8, 2, 400, 200, 200)]  # one pair lost 60 %
    out = standby.summarize(wide)
    assert out["target"]["pass_ci95"] is False
    assert "every line's 95 % interval within it: no" in standby.format_table(out)
    assert standby.summarize(runs[:2])["target"]["pass_ci95"] is None
