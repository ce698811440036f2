"""`mosafs bench write` as one run (`run_benchmark`): the phases of mosafs.bench.write (the
null file system, mosafs through its mount) and of mosafs.bench.phases (concurrent
writers, the series, the peer), in order, into one JSON-able result. Apart from both so
that neither imports the other."""

from __future__ import annotations

import datetime
import os
import time
from typing import Any

from mosafs.bench import moosefs, phases
from mosafs.bench.phases import table_rows
from mosafs.bench.timing import make_data
from mosafs.bench.write import (
    LARGE_WRITE,
    READ_BLOCK,
    SMALL_WRITE,
    MiB,
    Options,
    _check_all_stopped,
    _committed,
    _Mosafs,
    _mosafs_phase,
    _null_phase,
    _signals_interrupt,
    _work_dir,
    git_info,
    machine_info,
    progress,
    targets,
)


def run_benchmark(options: Options, command: str = "mosafs bench write") -> dict[str, Any]:
    """Run every phase; the result as one JSON-able dict. Cleans up whatever happens."""
    started = time.perf_counter()
    peer_skipped = moosefs.choose_peer(options.peer)  # `moosefs` that cannot run: error now
    counts = phases.writer_counts(options.writers)
    result: dict[str, Any] = {
        "benchmark": "mosafs bench write",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine_info(),
        "git": git_info(),
        "params": {
            "size_bytes": options.size,
            "quick": options.quick,
            "large_write_bytes": LARGE_WRITE,
            "small_write_bytes": SMALL_WRITE,
            "read_block_bytes": READ_BLOCK,
            "null_repeat": options.repeat,
            "tls": options.tls,
            "chunk_tokens": options.chunk_tokens,
            "memory_size_bytes": options.memory_size,
            "peer": options.peer,
            "peer_fsync": options.peer_fsync,
            "writer_counts": counts,
            "series_bytes": options.series_size,
            "series_steps": options.series_steps,
            "units": "MB/s = 10^6 bytes/s; sizes in bytes; times in seconds",
        },
        "notes": [],
    }
    with _work_dir(options.keep) as workdir, _signals_interrupt():
        progress(f"work directory {workdir}")
        # Generated (and so touched: the kernel splits FUSE writes from never-touched
        # memory into pieces of at most a page) before anything is timed; the null file
        # system writes the same bytes as mosafs' 1 MiB-write run.
        data = make_data(f"{options.seed}/1m".encode(), options.size)
        result["nullfs"] = _null_phase(workdir / "null", data, options)
        del data
        writers: dict[str, Any] = {"counts": counts, "bytes": options.size,
                                   "write_bytes": LARGE_WRITE}
        result["writers"] = writers
        writers["nullfs"] = phases.null_writers(workdir / "null-writers", counts, options.size,
                                                options.seed, options.repeat)

        def more(m: _Mosafs) -> None:  # on the running cluster, after the reads
            phases.mosafs_more(m.mnt, m.pids, lambda path, n: _committed(m, path, n),
                               workdir, options, result)

        result["mosafs"] = _mosafs_phase(workdir / "mosafs", options, result["notes"],
                                         after=more)
        result["moosefs"] = phases.peer_phase(workdir, options, peer_skipped, result)
        writers["ratios"] = phases.writer_ratios(writers)
        result["targets"] = targets(result)
        result["comparisons"] = phases.comparisons(result)
        result["processes"] = _check_all_stopped()
        result["elapsed_s"] = round(time.perf_counter() - started, 1)
        result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        if options.keep:
            import json

            (workdir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


# -- the human table --------------------------------------------------------------------------

def format_table(result: dict[str, Any]) -> str:
    null, mosafs, tg = result["nullfs"], result["mosafs"], result["targets"]
    size = result["params"]["size_bytes"]
    rows: list[tuple[str, str]] = [
        ("null write, 1 MiB writes", f"{null['write_1m']['mb_s']:.0f} MB/s"),
        ("null write, 4 KiB writes", f"{null['write_4k']['mb_s']:.0f} MB/s"),
        ("null read, 1 MiB reads", f"{null['read_1m']['mb_s']:.0f} MB/s"),
    ]
    for name, label in (("write_1m", "1 MiB"), ("write_4k", "4 KiB"),
                        ("write_memory", "1 MiB, --memory")):
        w = mosafs.get(name)
        if w:
            rows.append((f"mosafs write {w['bytes'] / MiB:.0f} MiB, {label} writes",
                         f"OAB {w['oab_mb_s']:.0f} MB/s, ASB {w['asb_mb_s']:.0f} MB/s, "
                         f"peak RSS {w['peak_rss_bytes'] / MiB:.0f} MiB"))
    rows += [
        (f"mosafs cold read {size / MiB:.0f} MiB", f"{mosafs['read_cold']['mb_s']:.0f} MB/s"),
        (f"mosafs warm read {size / MiB:.0f} MiB", f"{mosafs['read_warm']['mb_s']:.0f} MB/s"),
        *table_rows(result),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"{a:<{width}}  {b}" for a, b in rows]
    lines.append("")
    for name, t in {**tg, **result.get("comparisons", {})}.items():
        value = t["value"]
        shown = f"{value:.3g}" if isinstance(value, float) else str(value)
        target = t["target"]
        if name == "peak_rss_while_writing":
            shown = f"{t['peak_rss_mib']:.0f} MiB ({t['file_bytes'] / MiB:.0f} MiB file)"
            target = f"< {t['limit_mib']:.0f} MiB"
        lines.append(f"{name:<{width}}  {shown:<24} {target:<10} "
                     f"{'PASS' if t['pass'] else 'FAIL'}")
    return "\n".join(lines)

