"""`mosafs bench metadata`'s pure parts (mosafs/bench/metadata.py): percentiles, rates and
ratios, the phases' summaries, the verdicts on the issue's targets, the table, the option
checks and the command line; and the client process (mosafs/bench/metadata_ops.py) on a
local directory. No cluster: tests/fuse/test_fuse_bench_metadata.py runs the real thing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mosafs.bench import metadata as md
from mosafs.bench import metadata_figures as mf
from mosafs.bench import metadata_ops as ops
from mosafs.cli import build_parser
from mosafs.errors import ConfigError

# -- figures ---------------------------------------------------------------------------------


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # 100..1, unsorted on purpose
    assert mf.percentile(values, 50) == 50.0
    assert mf.percentile(values, 99) == 99.0
    assert mf.percentile(values, 100) == 100.0
    assert mf.percentile(values, 0.1) == 1.0
    assert mf.percentile([7.0], 99) == 7.0
    assert mf.percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert mf.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0  # a value measured, never a mean
    assert mf.percentile([], 50) is None


def test_latency_ms_converts_seconds_and_tells_no_figure_from_zero() -> None:
    got = mf.latency_ms([0.001, 0.002, 0.003, 0.1])
    assert got == {"p50": 2.0, "p99": 100.0, "max": 100.0, "mean": 26.5}
    assert mf.latency_ms([0.0000004]) == {"p50": 0.0, "p99": 0.0, "max": 0.0, "mean": 0.0}
    assert mf.latency_ms([]) == {"p50": None, "p99": None, "max": None, "mean": None}


def test_rate_and_ratio_have_no_figure_without_a_denominator() -> None:
    assert mf.rate(300, 2.0) == 150.0
    assert mf.rate(1, 3.0) == 0.3
    assert mf.rate(5, 0.0) is None
    assert mf.ratio(130.0, 2600.0) == 0.05
    assert mf.ratio(None, 10.0) is None
    assert mf.ratio(10.0, None) is None
    assert mf.ratio(10.0, 0.0) is None


def test_judge_passes_at_the_target_and_fails_just_beyond() -> None:
    assert mf.judge(3000.0, ">=", mf.CREATES_MIN)["pass"] is True
    assert mf.judge(2999.9, ">=", mf.CREATES_MIN)["pass"] is False
    assert mf.judge(5.0, "<=", mf.CLOSE_P99_MAX_MS)["pass"] is True
    assert mf.judge(5.001, "<=", mf.CLOSE_P99_MAX_MS)["pass"] is False
    got = mf.judge(None, ">=", 3000.0, clients=8, note="no run with 8 clients")
    assert got == {"value": None, "target": ">= 3000", "pass": None, "clients": 8,
                   "note": "no run with 8 clients"}
    assert mf.judge(0.1, "<=", 2.0, applies=False)["pass"] is None  # conditions not met
    assert "note" not in mf.judge(1.0, "<=", 2.0, note=None)


@pytest.mark.parametrize(("total", "parts"), [(100_000, 8), (5000, 8), (7, 8), (1, 8),
                                              (9, 4), (64, 64)])
def test_split_covers_every_name_once_in_near_equal_parts(total: int, parts: int) -> None:
    ranges = md.split(total, parts)
    assert 1 <= len(ranges) <= parts
    covered = [i for first, count in ranges for i in range(first, first + count)]
    assert covered == list(range(total))
    counts = [count for _, count in ranges]
    assert min(counts) >= 1 and max(counts) - min(counts) <= 1


def test_clients_never_share_a_name_in_a_shared_directory(tmp_path: Path) -> None:
    shared = md.client_commands("create", [tmp_path / "shared"] * 8, 50)
    assert {c["dir"] for c in shared} == {str(tmp_path / "shared")}
    names = [p for c in shared for p in ops.paths(c)]
    assert len(names) == len(set(names)) == 400
    own = md.client_commands("stat", md.own_dirs(tmp_path, 3), 5)
    assert [c["dir"] for c in own] == [str(tmp_path / "own" / f"c{k:02d}") for k in range(3)]
    missing = md.client_commands("missing", md.own_dirs(tmp_path, 3), 5, tag="missing-")
    assert not set(ops.paths(missing[0])) & set(ops.paths(own[0]))
    commit = md.client_commands("commit", [tmp_path], 2, chunks=4, chunk_bytes=4096)
    assert commit == [{"op": "commit", "dir": str(tmp_path), "prefix": "c00-", "count": 2,
                       "chunks": 4, "chunk_bytes": 4096}]


def _answer(start: float, seconds: float, latencies: list[float], cpu_s: float = 0.5,
            ) -> dict[str, Any]:
    return {"start": start, "end": start + seconds, "ops": len(latencies),
            "latencies": latencies, "cpu_s": cpu_s}


CPU = {"wall_s": 2.0, "cpu_s": {"up": 0.0, "mount": 1.0, "mount-worker-0": 0.25,
                                "manager": 3.0, "benefactor-0": 0.5, "bench": 0.0}}


def test_summarize_takes_the_span_from_the_first_start_to_the_last_end() -> None:
    answers = [_answer(10.0, 2.0, [0.001] * 100), _answer(10.5, 2.5, [0.003] * 300)]
    got = mf.summarize(answers, CPU, md.MOSAFS_ROLES)
    assert (got["clients"], got["ops"], got["seconds"]) == (2, 400, 3.0)
    assert got["ops_per_s"] == 133.3
    assert got["per_client_ops_per_s"] == [50.0, 120.0]
    assert got["start_spread_s"] == 0.5
    assert got["latency_ms"]["p50"] == 3.0 and got["latency_ms"]["p99"] == 3.0
    assert got["latency_ms"]["mean"] == 2.5
    # The clients' own CPU is one more process of the figure; the mount's workers count
    # as the mount's.
    assert got["clients_cpu_s"] == 1.0 and got["cpu"]["cpu_s"]["clients"] == 1.0
    assert got["manager_cpu_s"] == 3.0 and got["mount_cpu_s"] == 1.25
    assert "clients" not in CPU["cpu_s"]  # the meter's result is not changed in place
    peer = mf.summarize(answers, {"cpu_s": {"mfsmaster": 2.0, "mfsmaster-helper-0": 0.5,
                                            "mfsmount": 1.0}}, md.MOOSEFS_ROLES)
    assert (peer["master_cpu_s"], peer["mount_cpu_s"]) == (2.5, 1.0)
    assert "cpu" not in mf.summarize(answers)


# -- verdicts and the table ------------------------------------------------------------------

def _phase(per_s: float, p99_ms: float = 1.0, **extra: Any) -> dict[str, Any]:
    return {"clients": 8, "ops": 800, "seconds": 800 / per_s, "ops_per_s": per_s,
            "latency_ms": {"p50": p99_ms / 2, "p99": p99_ms, "max": p99_ms, "mean": 1.0},
            **extra}


def _run(n: int, creates: float = 3000.0, stats: float = 20000.0, close_p99: float = 5.0,
         dropped: bool = True, commit_p99_s: float | None = 0.005) -> dict[str, Any]:
    rpc = {"calls": 80, "p50_at_most_s": 0.001, "p99_at_most_s": commit_p99_s}
    return {"clients": n, "creates_shared_dir": _phase(creates),
            "creates_own_dirs": _phase(creates + 1), "stat_cached": _phase(stats),
            "lookups_missing": _phase(stats), "stat_uncached": _phase(
                stats, caches_dropped=dropped, waited_s=1.5),
            "commits": _phase(100.0, close_p99, commit_rpc=rpc)}


def _scale(chunks: int = 10_000_000, idle: float = 0.05, reaction: float = 1.0,
           status_p99: float = 100.0) -> dict[str, Any]:
    return {"params": {"chunks": chunks}, "idle_cpu_share": idle,
            "status_ms": {"p50": 1.0, "p99": status_p99, "max": status_p99},
            "failure": {"detection_s": 2.0, "first_copy_after_detection_s": reaction}}


def _result(runs: list[dict[str, Any]], *, entries: int = 100_000, ls_s: float = 2.0,
            peer: dict[str, Any] | None = None, scale: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    listing = {"seconds": ls_s, "ops": entries, "caches_dropped": True}
    return {"benchmark": "mosafs bench metadata",
            "params": {"files": 100, "commit_files": 10, "commit_chunks": 64,
                       "chunk_bytes": 4096, "tls": True},
            "runs": runs,
            "large_dir": {"entries": entries, "fill": _phase(120.0),
                          "ls_l_cold": listing, "ls_l_warm": {**listing, "seconds": 0.5},
                          "listdir_cold": listing, "listdir_warm": listing},
            "moosefs": peer or {"skipped": "not asked for (--peer none)"},
            "scale": scale or {"skipped": "not asked for (--scale-chunks 0)"}}


def test_figures_at_the_targets_pass_and_just_short_fail() -> None:
    peer = {"clients": 8, "creates_shared_dir": _phase(3000.0),
            "creates_own_dirs": _phase(3001.0)}
    ok = mf.targets(_result([_run(1, creates=1.0), _run(8)], peer=peer, scale=_scale()))
    assert set(ok) == {"creates_per_s_shared_dir", "creates_per_s_own_dirs",
                       "creates_shared_dir_vs_moosefs", "creates_own_dirs_vs_moosefs",
                       "commit_close_p99_ms", "commit_rpc_p99_ms", "stat_cached_per_s",
                       "stat_uncached_per_s", "ls_l_100000_entries_s", "scale_idle_cpu_share",
                       "scale_rereplication_start_s", "scale_status_p99_ms"}
    assert all(t["pass"] is True for t in ok.values()), ok  # the 1-client run is not judged
    assert ok["creates_shared_dir_vs_moosefs"]["value"] == 1.0
    assert ok["commit_close_p99_ms"]["value"] == 5.0 and mf.overall(ok) is True
    assert ok["commit_rpc_p99_ms"]["value"] == 5.0 and ok["commit_rpc_p99_ms"]["calls"] == 80

    bad = mf.targets(_result([_run(8, creates=2998.0, stats=19999.0, close_p99=5.5,
                                   commit_p99_s=0.01)],
                             ls_s=2.01, peer=peer, scale=_scale(idle=0.051, reaction=1.01,
                                                                status_p99=100.5)))
    assert {n for n, t in bad.items() if t["pass"] is False} == set(bad)
    assert bad["creates_own_dirs_vs_moosefs"]["value"] == round(2999 / 3001, 3)
    assert mf.overall(bad) is False


def test_what_the_run_cannot_judge_is_none_with_the_reason() -> None:
    got = mf.targets(_result([_run(1), _run(16)], entries=5000, ls_s=0.5))
    for name in ("creates_per_s_shared_dir", "commit_close_p99_ms", "stat_cached_per_s",
                 "creates_own_dirs_vs_moosefs"):
        assert got[name]["value"] is None and got[name]["pass"] is None
        assert "8 clients" in got[name]["note"]
    ls = got["ls_l_100000_entries_s"]
    assert ls["value"] == 0.5 and ls["pass"] is None and ls["entries"] == 5000
    assert ls["linear_projection_s"] == 10.0 and "100000 entries" in ls["note"]
    assert mf.overall(got) is None

    skipped = mf.targets(_result([_run(8)]))
    assert skipped["creates_shared_dir_vs_moosefs"]["pass"] is None
    assert skipped["creates_shared_dir_vs_moosefs"]["note"] == "not asked for (--peer none)"
    assert skipped["creates_shared_dir_vs_moosefs"]["mosafs_per_s"] == 3000.0

    small = mf.targets(_result([_run(8)], scale=_scale(chunks=3000)))
    for name in ("scale_idle_cpu_share", "scale_rereplication_start_s", "scale_status_p99_ms"):
        assert small[name]["pass"] is None and "10000000 chunk records" in small[name]["note"]
        assert skipped[name]["note"] == "not asked for (--scale-chunks 0)"

    undropped = mf.targets(_result([_run(8, dropped=False)]))["stat_uncached_per_s"]
    assert undropped["pass"] is True and undropped["caches_dropped"] is False
    assert "not root" in undropped["note"]


def test_the_table_has_a_row_per_client_count_and_every_verdict() -> None:
    result = _result([_run(1, creates=130.0), _run(8, creates=150.0)], entries=5000)
    result["targets"] = mf.targets(result)
    result["targets_pass"] = mf.overall(result["targets"])
    table = mf.format_table(result)
    rows = [line.split() for line in table.splitlines()]
    assert rows[4][:3] == ["1", "130", "131"] and rows[5][:3] == ["8", "150", "151"]
    assert "MooseFS peer skipped: not asked for (--peer none)" in table
    assert "directory of 5000 entries" in table
    for name, t in result["targets"].items():
        line = next(x for x in table.splitlines() if x.startswith(name + " "))
        assert line.split()[4] == {True: "PASS", False: "FAIL", None: "n/a"}[t["pass"]]
    assert table.splitlines()[-1] == "overall: FAIL"

    result["moosefs"] = {"clients": 8, "creates_shared_dir": _phase(900.0),
                         "creates_own_dirs": _phase(950.0)}
    assert "MooseFS, 8 clients: creates/s shared 900, own dirs 950" in mf.format_table(result)


def test_each_create_and_stat_target_names_the_null_namespaces_figure_and_our_share() -> None:
    floor = {"clients": 8, "creates_shared_dir": _phase(4000.0),
             "creates_own_dirs": _phase(8000.0), "stat_cached": _phase(100_000.0),
             "stat_uncached": _phase(25_000.0, caches_dropped=True)}
    result = _result([_run(8, creates=1000.0, stats=20_000.0)])
    result["floor"] = floor
    got = mf.targets(result)
    assert got["creates_per_s_shared_dir"]["floor_per_s"] == 4000.0
    assert got["creates_per_s_shared_dir"]["of_floor"] == 0.25
    assert got["creates_per_s_own_dirs"]["of_floor"] == round(1001 / 8000, 3)
    assert got["stat_cached_per_s"]["of_floor"] == 0.2
    assert got["stat_uncached_per_s"]["of_floor"] == 0.8
    # The floor informs; it does not change a verdict.
    assert got["creates_per_s_shared_dir"]["pass"] is False
    assert got["stat_uncached_per_s"]["pass"] is True
    result["targets"] = got
    result["targets_pass"] = mf.overall(got)
    assert ("null namespace (the pyfuse3 floor), 8 clients: creates/s shared 4000, own dirs "
            "8000; stat/s cached 100000, uncached 25000") in mf.format_table(result)

    result["floor"] = {"skipped": "not asked for (--no-floor)"}
    skipped = mf.targets(result)["stat_cached_per_s"]
    assert "floor_per_s" not in skipped and "of_floor" not in skipped
    assert "floor) skipped: not asked for (--no-floor)" in mf.format_table(result)


# -- options and the command line --------------------------------------------------------------

@pytest.mark.parametrize(("field", "value", "message"), [
    ("clients", (), "clients must be 1..64"), ("clients", (1, 0), "clients must be 1..64"),
    ("clients", (65,), "got 65"), ("files", 0, "--files must be"),
    ("dir_entries", 0, "--dir-entries"), ("commit_files", 0, "--commit-files"),
    ("commit_chunks", 20000, "--commit-chunks must be 1..16384"),
    ("peer", "nfs", "--peer must be one of auto, moosefs, none"),
    ("scale_files", 20_000_000, "--scale-files"), ("scale_idle_s", 0, "--scale-idle-s")])
def test_bad_options_are_a_config_error_before_anything_starts(
        field: str, value: Any, message: str) -> None:
    options = md.Options(**{field: value})
    with pytest.raises(ConfigError, match=message):
        options.check()
    with pytest.raises(ConfigError, match=message):
        md.run_metadata(options)  # refused before a work directory or a process exists


def test_the_defaults_are_the_issues() -> None:
    args = build_parser().parse_args(["bench", "metadata"])
    assert args.clients == (1, 8, 16)
    assert (args.files, args.dir_entries, args.commit_files, args.commit_chunks) == \
        (2000, 100_000, 200, 64)
    assert (args.peer, args.insecure, args.json, args.keep) == ("auto", False, False, None)
    assert md.Options().check().clients == (1, 8, 16)
    assert mf.TARGET_CLIENTS in args.clients and args.dir_entries == mf.TARGET_ENTRIES
    assert (args.scale_chunks, args.scale_files) == (mf.SCALE_CHUNKS, 1_000_000)
    # --scale-chunks 0 skips the part whatever --scale-files says.
    assert md.Options(scale_chunks=0).check().scale_files == 1_000_000


def test_the_attribute_timeout_waited_out_is_the_mounts() -> None:
    from mosafs.client.files.context import ClientConfig

    assert ClientConfig.attr_timeout == md.ATTR_TIMEOUT_S
    assert md.EXPIRE_WAIT_S > md.ATTR_TIMEOUT_S


@pytest.mark.parametrize(("flag", "value"), [
    ("--clients", "0"), ("--clients", "1,65"), ("--clients", "a,b"), ("--clients", ""),
    ("--files", "0"), ("--dir-entries", "-1"), ("--commit-files", "x"),
    ("--commit-chunks", "16385"), ("--peer", "nfs")])
def test_bad_arguments_are_one_line_errors_with_exit_code_2(
        flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["bench", "metadata", f"{flag}={value}"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"mosafs bench metadata: argument {flag}: ") and "\n" not in error


def test_peer_moosefs_where_it_cannot_run_is_refused_at_once() -> None:
    from mosafs.bench import moosefs

    if moosefs.unavailable_reason() is None:
        pytest.skip("MooseFS can run here")
    done = subprocess.run([sys.executable, "-P", "-m", "mosafs", "bench", "metadata",
                           "--peer", "moosefs", "--json"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("mosafs bench metadata: --peer moosefs: ")
    assert "Traceback" not in done.stderr


# -- the client process -----------------------------------------------------------------------

def test_client_operations_on_a_local_directory(tmp_path: Path) -> None:
    made = ops.prepare({"op": "create", "dir": str(tmp_path), "prefix": "c01-", "count": 5,
                        "first": 3})()
    assert made["ops"] == 5 and len(made["latencies"]) == 5 and made["end"] >= made["start"]
    assert sorted(os.listdir(tmp_path)) == [f"c01-{i:07d}" for i in range(3, 8)]
    with pytest.raises(FileExistsError):  # O_EXCL: a create never reuses a name
        ops.prepare({"op": "create", "dir": str(tmp_path), "prefix": "c01-", "count": 1,
                     "first": 3})()
    assert ops.prepare({"op": "stat", "dir": str(tmp_path), "prefix": "c01-", "count": 5,
                        "first": 3})()["ops"] == 5
    assert ops.prepare({"op": "missing", "dir": str(tmp_path), "prefix": "m-",
                        "count": 4})()["ops"] == 4
    with pytest.raises(OSError, match="exists"):
        ops.prepare({"op": "missing", "dir": str(tmp_path), "prefix": "c01-", "count": 1,
                     "first": 3})()
    assert ops.prepare({"op": "ls", "dir": str(tmp_path)})()["ops"] == 5
    assert ops.prepare({"op": "listdir", "dir": str(tmp_path)})()["ops"] == 5
    with pytest.raises(ValueError, match="unknown op"):
        ops.prepare({"op": "rename", "dir": str(tmp_path)})


def test_commits_write_files_of_distinct_chunks(tmp_path: Path) -> None:
    got = ops.prepare({"op": "commit", "dir": str(tmp_path), "prefix": "f", "count": 3,
                       "chunks": 4, "chunk_bytes": 4096})()
    assert got["ops"] == 3 and got["file_bytes"] == 4 * 4096
    assert len(got["latencies"]) == len(got["write_latencies"]) == 3
    chunks = []
    for i in range(3):
        data = (tmp_path / ops.name("f", i)).read_bytes()
        assert len(data) == 4 * 4096
        chunks += [data[o:o + 4096] for o in range(0, len(data), 4096)]
        assert data[:ops.STAMP_BYTES] == i.to_bytes(ops.STAMP_BYTES, "little")
    assert len(set(chunks)) == 12  # nothing dedupes


def test_the_client_process_answers_ready_then_its_figures_or_the_error(
        tmp_path: Path) -> None:
    create = {"op": "create", "dir": str(tmp_path), "prefix": "x", "count": 3}
    script = "\n".join([json.dumps(create), "go", json.dumps(create), "go",
                        '{"op": "nope"}']) + "\n"
    done = subprocess.run([sys.executable, "-P", "-m", "mosafs.bench.metadata_ops"],
                          input=script, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert answers[0] == {"ready": True} and answers[2] == {"ready": True}
    assert answers[1]["ops"] == 3 and answers[1]["cpu_s"] >= 0
    assert "File exists" in answers[3]["error"]  # the second create of the same names
    assert answers[4]["error"].startswith("bad command: ")
    assert len(answers) == 5
