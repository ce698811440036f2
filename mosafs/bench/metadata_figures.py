"""The pure parts of `mosafs bench metadata` (mosafs.bench.metadata): a phase's figures from
its clients' answers, the issue's targets judged on a result, and the table for people.
No process is started here."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# The issue's targets.
CREATES_MIN = 3000.0        # creates/s, aggregate, 8 client processes
STATS_MIN = 20000.0         # stats/s, aggregate, 8 clients, cached and uncached files
CLOSE_P99_MAX_MS = 5.0      # commit (close) latency p99 with 8 writers
LS_MAX_S = 2.0              # `ls -l` of a 100,000-entry directory
VS_MOOSEFS_MIN = 1.0        # creates/s, mosafs / MooseFS
TARGET_CLIENTS = 8
TARGET_ENTRIES = 100_000
SCALE_CHUNKS = 10_000_000   # chunk records of the synthetic manager
IDLE_SHARE_MAX = 0.05       # of one core, idle manager at that size
REACTION_MAX_S = 1.0        # re-replication starts after a death is detected
STATUS_MAX_MS = 100.0       # `mosafs status` (GetClusterStatus) at that size
# The large directory's listings, as the table names them.
LISTINGS = {"ls_l_cold": "ls -l cold", "ls_l_warm": "ls -l warm",
            "listdir_cold": "listdir cold", "listdir_warm": "listdir warm"}
Roles = Mapping[str, tuple[str, ...]]  # role -> prefixes of its processes' names


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest rank: the smallest of VALUES with at least Q % of them at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def latency_ms(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p99, max and mean of VALUES (seconds), in milliseconds."""
    def ms(x: float | None) -> float | None:
        return None if x is None else round(1000 * x, 3)

    return {"p50": ms(percentile(values, 50)), "p99": ms(percentile(values, 99)),
            "max": ms(max(values, default=None)),
            "mean": ms(sum(values) / len(values) if values else None)}


def rate(ops: int, seconds: float) -> float | None:
    return round(ops / seconds, 1) if seconds > 0 else None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def judge(value: float | None, op: str, target: float, *, applies: bool = True,
          **extra: Any) -> dict[str, Any]:
    """A target: VALUE against OP TARGET; "pass" None where there is no value or the run
    does not match the target's conditions (not APPLIES). Extras that are None are left
    out."""
    passed = None
    if value is not None and applies:
        passed = value >= target if op == ">=" else value <= target
    return {"value": value, "target": f"{op} {target:g}", "pass": passed,
            **{k: v for k, v in extra.items() if v is not None}}


def role_cpu(cpu: dict[str, Any], roles: Roles) -> dict[str, float]:
    """CPU seconds summed by role: each role the processes whose names start with one of
    its prefixes (the mount's data-path workers count as the mount's)."""
    seconds = cpu.get("cpu_s", {})
    return {f"{role}_cpu_s": round(sum(v for k, v in seconds.items() if k.startswith(prefixes)),
                                   3) for role, prefixes in roles.items()}


def summarize(answers: Sequence[dict[str, Any]], cpu: dict[str, Any] | None = None,
              roles: Roles | None = None) -> dict[str, Any]:
    """One phase from its clients' answers: aggregate rate over the span from the first
    start to the last end, latencies over every operation, CPU by role."""
    start = min(a["start"] for a in answers)
    seconds = max(a["end"] for a in answers) - start
    ops = sum(int(a["ops"]) for a in answers)
    clients_cpu = round(sum(float(a.get("cpu_s", 0.0)) for a in answers), 3)
    out: dict[str, Any] = {
        "clients": len(answers), "ops": ops, "seconds": round(seconds, 6),
        "ops_per_s": rate(ops, seconds),
        "latency_ms": latency_ms([x for a in answers for x in a["latencies"]]),
        "per_client_ops_per_s": [rate(a["ops"], a["end"] - a["start"]) for a in answers],
        "start_spread_s": round(max(a["start"] for a in answers) - start, 6),
        "clients_cpu_s": clients_cpu,
    }
    if cpu is not None:
        # The clients have reported their own CPU: one more process of the figure, not
        # other work on the machine.
        cpu = {**cpu, "cpu_s": {**cpu["cpu_s"], "clients": clients_cpu}}
        out.update(role_cpu(cpu, roles or {}))
        out["cpu"] = cpu
    return out


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets on RESULT's figures."""
    run = next((r for r in result["runs"] if r["clients"] == TARGET_CLIENTS), None)
    no_run = None if run else f"no run with {TARGET_CLIENTS} clients (--clients)"
    peer = result.get("moosefs") or {}

    def figure(phase: str, *keys: str) -> Any:
        """RUN[PHASE][KEYS...]; None without a run at TARGET_CLIENTS."""
        if run is None:
            return None
        value = run[phase]
        for key in keys:
            value = value[key]
        return value

    floor = result.get("floor") or {}

    def of_floor(phase: str, ours: float | None) -> dict[str, Any]:
        """The null namespace's figure for PHASE (mosafs.bench.nullns) and ours as a share
        of it: the ceiling of any pyfuse3 file system on this machine in this run."""
        theirs = (floor.get(phase) or {}).get("ops_per_s")
        return {"floor_per_s": theirs, "of_floor": ratio(ours, theirs)}

    out: dict[str, Any] = {}
    for layout in ("shared_dir", "own_dirs"):
        ours = figure(f"creates_{layout}", "ops_per_s")
        out[f"creates_per_s_{layout}"] = judge(ours, ">=", CREATES_MIN,
                                               clients=TARGET_CLIENTS, note=no_run,
                                               **of_floor(f"creates_{layout}", ours))
        theirs = (peer.get(f"creates_{layout}") or {}).get("ops_per_s")
        out[f"creates_{layout}_vs_moosefs"] = judge(
            ratio(ours, theirs), ">=", VS_MOOSEFS_MIN, mosafs_per_s=ours,
            moosefs_per_s=theirs, note=no_run or peer.get("skipped"))
    out["commit_close_p99_ms"] = judge(figure("commits", "latency_ms", "p99"), "<=",
                                       CLOSE_P99_MAX_MS, writers=TARGET_CLIENTS, note=no_run)
    # The block-map commit itself (the manager's CommitVersion), which close() waits for
    # after the file's chunks are stored: known to its histogram bucket.
    rpc = (run["commits"].get("commit_rpc") if run is not None else None) or {}
    at_most = rpc.get("p99_at_most_s")
    out["commit_rpc_p99_ms"] = judge(
        None if at_most is None else round(at_most * 1000, 3), "<=", CLOSE_P99_MAX_MS,
        writers=TARGET_CLIENTS, calls=rpc.get("calls"),
        note=no_run or (None if at_most is not None else "past the histogram's last bound"
                        if rpc.get("calls") else "the manager's metrics were not read"))
    cached = figure("stat_cached", "ops_per_s")
    out["stat_cached_per_s"] = judge(cached, ">=", STATS_MIN, clients=TARGET_CLIENTS,
                                     note=no_run, **of_floor("stat_cached", cached))
    dropped = figure("stat_uncached", "caches_dropped")
    uncached = figure("stat_uncached", "ops_per_s")
    out["stat_uncached_per_s"] = judge(
        uncached, ">=", STATS_MIN, clients=TARGET_CLIENTS,
        caches_dropped=dropped, **of_floor("stat_uncached", uncached), note=no_run or (
            None if dropped or run is None else "the kernel's caches could not be dropped "
            "(not root): only the attribute timeout expired them"))
    large = result["large_dir"]
    cold = large["ls_l_cold"]
    as_issue = large["entries"] == TARGET_ENTRIES
    out["ls_l_100000_entries_s"] = judge(
        cold["seconds"], "<=", LS_MAX_S, applies=as_issue, entries=large["entries"],
        warm_s=large["ls_l_warm"]["seconds"], caches_dropped=cold["caches_dropped"],
        linear_projection_s=None if as_issue else round(
            cold["seconds"] * TARGET_ENTRIES / large["entries"], 3),
        note=None if as_issue else f"the target is for {TARGET_ENTRIES} entries, this run "
        f"listed {large['entries']} (--dir-entries): not judged")
    out.update(_scale_targets(result.get("scale") or {}))
    return out


def _scale_targets(scale: dict[str, Any]) -> dict[str, Any]:
    """The targets of the synthetic manager, judged only at the issue's size."""
    params = scale.get("params") or {}
    as_issue = params.get("chunks") == SCALE_CHUNKS
    note = scale.get("skipped") or (None if as_issue else
                                    f"the targets are for {SCALE_CHUNKS} chunk records, "
                                    f"this run had {params.get('chunks')}: not judged")
    failure = scale.get("failure") or {}
    return {
        "scale_idle_cpu_share": judge(scale.get("idle_cpu_share"), "<=", IDLE_SHARE_MAX,
                                      applies=as_issue, note=note),
        "scale_rereplication_start_s": judge(failure.get("first_copy_after_detection_s"),
                                             "<=", REACTION_MAX_S, applies=as_issue,
                                             note=note),
        "scale_status_p99_ms": judge((scale.get("status_ms") or {}).get("p99"), "<=",
                                     STATUS_MAX_MS, applies=as_issue, note=note),
    }


def overall(verdicts: dict[str, Any]) -> bool | None:
    judged = [t["pass"] for t in verdicts.values() if t["pass"] is not None]
    return all(judged) if judged else None


def num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def format_table(result: dict[str, Any]) -> str:
    """The human summary: a line per client count, the large directory, the peer, the
    verdicts."""
    p = result["params"]
    lines = [f"{result['benchmark']}: {p['files']} files per client, commits of "
             f"{p['commit_files']} files x {p['commit_chunks']} chunks of {p['chunk_bytes']} B, "
             f"{'TLS' if p['tls'] else 'plaintext'}", "",
             f"{'clients':>7} {'creates/s':>9} {'creates/s':>9} {'stat/s':>8} {'stat/s':>8} "
             f"{'ENOENT/s':>8} {'create ms':>13} {'close ms':>13}",
             f"{'':>7} {'shared':>9} {'own dirs':>9} {'cached':>8} {'uncached':>8} {'':>8} "
             f"{'own p50/p99':>13} {'p50 / p99':>13}"]
    for r in result["runs"]:
        own, close = r["creates_own_dirs"]["latency_ms"], r["commits"]["latency_ms"]
        lines.append(
            f"{r['clients']:>7} {num(r['creates_shared_dir']['ops_per_s']):>9} "
            f"{num(r['creates_own_dirs']['ops_per_s']):>9} "
            f"{num(r['stat_cached']['ops_per_s']):>8} "
            f"{num(r['stat_uncached']['ops_per_s']):>8} "
            f"{num(r['lookups_missing']['ops_per_s']):>8} "
            f"{num(own['p50'], 1) + ' / ' + num(own['p99'], 1):>13} "
            f"{num(close['p50'], 1) + ' / ' + num(close['p99'], 1):>13}")
    large = result["large_dir"]
    lines += ["", f"directory of {large['entries']} entries (made at "
              f"{num(large['fill']['ops_per_s'])} creates/s): ls -l cold "
              f"{large['ls_l_cold']['seconds']:.3f}s, warm {large['ls_l_warm']['seconds']:.3f}s; "
              f"listdir cold {large['listdir_cold']['seconds']:.3f}s, warm "
              f"{large['listdir_warm']['seconds']:.3f}s"]
    floor = result.get("floor") or {"skipped": "not in this result"}
    if "skipped" in floor:
        lines.append(f"null namespace (the pyfuse3 floor) skipped: {floor['skipped']}")
    else:
        lines.append(f"null namespace (the pyfuse3 floor), {floor['clients']} clients: "
                     f"creates/s shared {num(floor['creates_shared_dir']['ops_per_s'])}, own "
                     f"dirs {num(floor['creates_own_dirs']['ops_per_s'])}; stat/s cached "
                     f"{num(floor['stat_cached']['ops_per_s'])}, uncached "
                     f"{num(floor['stat_uncached']['ops_per_s'])}")
    peer = result["moosefs"]
    if "skipped" in peer:
        lines.append(f"MooseFS peer skipped: {peer['skipped']}")
    else:
        lines.append(f"MooseFS, {peer['clients']} clients: creates/s shared "
                     f"{num(peer['creates_shared_dir']['ops_per_s'])}, own dirs "
                     f"{num(peer['creates_own_dirs']['ops_per_s'])}")
    lines.append("")
    verdict = {True: "PASS", False: "FAIL", None: "n/a"}
    width = max(len(n) for n in result["targets"])
    for name, t in result["targets"].items():
        value = "-" if t["value"] is None else f"{t['value']:g}"
        note = f" ({t['note']})" if t["pass"] is None and t.get("note") else ""
        lines.append(f"{name:<{width}}  {value:>10}  {t['target']:<8} {verdict[t['pass']]}{note}")
    lines.append(f"overall: {verdict[result['targets_pass']]}")
    return "\n".join(lines)
