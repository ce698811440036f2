"""`mosafs bench standby`: what one standby manager costs the creates of `mosafs bench
metadata`, in one command (issue 22's target: at most 20 % fewer creates/s with one
standby on loopback; docs/standby.md says what the standby does on every change).

`mosafs bench metadata` runs --pairs times on a cluster with one manager (`mosafs up`)
and as many times with a standby (`mosafs up --managers 2`: an active manager, a standby
that confirms every change durably before it is acknowledged, and etcd), alternating in
ABBA order (pair 1 without the standby first, pair 2 with it first, ...), so that a
machine that drifts during the run weighs on both sides alike. Every run is a whole
metadata benchmark on a cluster of its own (clients 1 and 8; the MooseFS peer and the
synthetic manager left out).

Figures, per run and as means: creates/s on the three lines the target is judged on (8
clients in a directory each, 8 clients in one shared directory, 1 client), and the
change with the standby. As a control, the 8 clients' stats of uncached files: the mount
answers them from its cache without asking any manager, so a run whose control falls
well below the others' (SLOW_CONTROL of their median) was a slow run of the machine. It
is flagged, never dropped.
"""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MAX_LOSS_PCT = 20.0   # the target: creates/s with a standby at most this much lower
# Student's t, 97.5 % quantile, by degrees of freedom (pairs - 1): a table, since the
# interval below is the benchmark's only use of the distribution. Between two rows the
# lower one's (larger) value is taken, which widens the interval.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 40: 2.021,
         49: 2.010}
SLOW_CONTROL = 0.8    # a run's control below this share of the median is flagged
CLIENTS = (1, 8)
# line -> (clients, phase of `mosafs bench metadata`)
LINES: dict[str, tuple[int, str]] = {
    "creates_own_dirs_8": (8, "creates_own_dirs"),
    "creates_shared_dir_8": (8, "creates_shared_dir"),
    "creates_1_client": (1, "creates_own_dirs"),
}
CONTROL = (8, "stat_uncached")


def order(pairs: int) -> list[tuple[int, int]]:
    """(pair, managers) in the order they run: ABBA, one manager first."""
    out = []
    for pair in range(1, pairs + 1):
        sides = (1, 2) if pair % 2 else (2, 1)
        out += [(pair, managers) for managers in sides]
    return out


def figures(result: dict[str, Any]) -> dict[str, float]:
    """The lines' creates/s and the control (stats/s) of one metadata benchmark's
    RESULT."""
    runs = {run["clients"]: run for run in result["runs"]}
    out = {line: float(runs[n][phase]["ops_per_s"]) for line, (n, phase) in LINES.items()}
    n, phase = CONTROL
    out["control_stat_uncached_8"] = float(runs[n][phase]["ops_per_s"])
    return out


def change_pct(without: float, with_standby: float) -> float:
    return round(100.0 * (with_standby / without - 1.0), 1)


def interval95(changes: Sequence[float]) -> list[float] | None:
    """The 95 % confidence interval of the mean of CHANGES (each pair's change, in %),
    which the machine's swings between pairs make wide; None below two pairs."""
    if len(changes) < 2:
        return None
    df = len(changes) - 1
    t = _T975[max(k for k in _T975 if k <= df)]
    half = t * statistics.stdev(changes) / len(changes) ** 0.5
    mean = statistics.fmean(changes)
    return [round(mean - half, 1), round(mean + half, 1)]


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """RUNS (each {"pair", "managers", "figures"}) as means, changes and the verdict."""
    controls = [run["figures"]["control_stat_uncached_8"] for run in runs]
    floor = SLOW_CONTROL * statistics.median(controls)
    slow = [{"pair": run["pair"], "managers": run["managers"],
             "control_stat_uncached_8": run["figures"]["control_stat_uncached_8"]}
            for run in runs if run["figures"]["control_stat_uncached_8"] < floor]
    pairs = sorted({run["pair"] for run in runs})
    lines: dict[str, Any] = {}
    for line in LINES:
        side = {m: {run["pair"]: run["figures"][line] for run in runs
                    if run["managers"] == m} for m in (1, 2)}
        without, with_standby = (statistics.fmean(side[m].values()) for m in (1, 2))
        lines[line] = {
            "one_manager": [side[1][p] for p in pairs],
            "with_standby": [side[2][p] for p in pairs],
            "mean_one_manager": round(without, 1), "mean_with_standby": round(with_standby, 1),
            "change_pct": change_pct(without, with_standby),
            "change_pct_by_pair": [change_pct(side[1][p], side[2][p]) for p in pairs],
        }
        lines[line]["by_pair_ci95"] = interval95(lines[line]["change_pct_by_pair"])
    worst = min(lines, key=lambda line: lines[line]["change_pct"])
    intervals = [v["by_pair_ci95"] for v in lines.values()]
    return {
        "lines": lines,
        "slow_runs": slow,
        "target": {"max_loss_pct": MAX_LOSS_PCT, "worst_line": worst,
                   "worst_change_pct": lines[worst]["change_pct"],
                   "pass": all(v["change_pct"] >= -MAX_LOSS_PCT for v in lines.values()),
                   # Whether every line's interval lies within the target too: the
                   # verdict that the machine's swings cannot have made.
                   "pass_ci95": None if None in intervals else
                   all(ci[0] >= -MAX_LOSS_PCT for ci in intervals)},
    }


def run_standby(pairs: int, *, files: int, dir_entries: int, commit_files: int,
                commit_chunks: int, tls: bool = True, keep: Path | None = None,
                command: str = "mosafs bench standby") -> dict[str, Any]:
    """The whole benchmark (see the module); one JSON-able dict."""
    from mosafs.bench.metadata import Options, run_metadata
    from mosafs.bench.write import _work_dir, machine_info, progress

    result: dict[str, Any] = {
        "benchmark": "mosafs bench standby",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command, "machine": machine_info(),
        "params": {"pairs": pairs, "clients": list(CLIENTS), "files": files,
                   "dir_entries": dir_entries, "commit_files": commit_files,
                   "commit_chunks": commit_chunks, "tls": tls,
                   "units": "creates/s and stats/s, aggregate over each phase"},
        "runs": [],
    }
    with _work_dir(keep, "mosafs-bench-standby-") as workdir:
        for pair, managers in order(pairs):
            progress(f"pair {pair}: {'one manager' if managers == 1 else 'with a standby'}")
            options = Options(clients=CLIENTS, files=files, dir_entries=dir_entries,
                              commit_files=commit_files, commit_chunks=commit_chunks,
                              peer="none", tls=tls, scale_chunks=0, managers=managers,
                              floor=False, keep=workdir / f"pair{pair}-m{managers}")
            one = run_metadata(options,
                               command=f"{command} (pair {pair}, --managers {managers})")
            result["runs"].append({"pair": pair, "managers": managers, "date": one["date"],
                                   "figures": figures(one),
                                   "left_running": one["processes"]["left_running"]})
    result.update(summarize(result["runs"]))
    return result


def format_table(result: dict[str, Any]) -> str:
    rows = [f"{'line':<22} {'one manager':>24} {'with a standby':>24} {'change':>8} "
            f"{'pairs, 95 %':>16}"]
    for line, v in result["lines"].items():
        ci = v["by_pair_ci95"]
        rows.append(f"{line:<22} {_list(v['one_manager']):>24} "
                    f"{_list(v['with_standby']):>24} {v['change_pct']:>+7.1f}% "
                    f"{f'{ci[0]:+.1f}..{ci[1]:+.1f} %' if ci else '-':>16}")
    target = result["target"]
    rows.append(f"target: at most {target['max_loss_pct']:g} % fewer creates/s on every "
                f"line: {'met' if target['pass'] else 'NOT met'} (worst "
                f"{target['worst_line']}, {target['worst_change_pct']:+.1f} %)")
    if target["pass_ci95"] is not None:
        rows.append("every line's 95 % interval within it: "
                    f"{'yes' if target['pass_ci95'] else 'no'}")
    for run in result["slow_runs"]:
        rows.append(f"slow run flagged: pair {run['pair']}, managers {run['managers']}, "
                    f"uncached stats {run['control_stat_uncached_8']:.0f}/s")
    return "\n".join(rows)


def _list(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.0f}" for v in values)
