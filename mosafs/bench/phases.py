"""The phases issue 17 added to `mosafs bench write` (mosafs/bench/write.py runs them):

- concurrent writers: N processes each write a file of their own, SIZE/N bytes of distinct
  data (nothing dedupes) with 1 MiB writes, all released at once after generating their
  data; aggregate = total bytes / (first open -> last close returned), on the null file
  system (mosafs.bench.nullfiles: one FUSE server, a file per writer), on mosafs and on
  the MooseFS peer. Always 1 writer, and N. A writer is a process of its own
  (`python -m mosafs.bench.phases write PATH BYTES SEED`): no GIL shared between writers,
  and the same process model on every file system.
- the checkpoint series: steps of the `checkpoint` workload (mosafs.bench.workloads) with
  10 % of the pages rewritten between steps in 8 runs, no insertions (about 90 % of
  1 MiB chunks unchanged), each step a new file `ckpt.0.N` of one folder, 1 MiB writes,
  timed open -> close; on mosafs (close is durable at the default pessimistic semantics)
  and on the local disk (a directory beside the work directory's data) with an fsync
  before close, the fair figure, and without, for reference.
- MooseFS (mosafs.bench.moosefs): the same 1 MiB and 4 KiB writes and cold/warm reads as
  on mosafs, with the same helpers, and its concurrent writers.
- the comparisons with the issue's targets, and their rows in the table.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mosafs.bench import procs
from mosafs.bench.moosefs import GOAL, MooseFs, space_reason
from mosafs.bench.procs import (
    BenchError,
    NullFs,
    alive,
    kill_pids,
    memory_status,
    reset_peak_rss,
)
from mosafs.bench.timing import CpuMeter, digest, drop_caches, make_data, read_file, write_file
from mosafs.bench.workloads import Workload, steps
from mosafs.bench.write import (
    LARGE_WRITE,
    READ_BLOCK,
    SMALL_WRITE,
    Options,
    _uninterrupted,
    progress,
)
from mosafs.procutil import python_command

MiB = 1 << 20
MB = 1e6
SERIES_CHANGE = 0.10     # pages rewritten per step: ~90 % of chunks unchanged
SERIES_REGIONS = 8
WRITER_TIMEOUT = 1800.0

PEER_TARGETS = {  # mosafs / MooseFS
    "oab_1m_vs_moosefs": 1.2,
    "oab_4k_vs_moosefs": 1.0,
    "cold_read_vs_moosefs": 1.0,
}
WRITERS_VS_NULL = 0.8    # the target is for the GPU machine; reported everywhere
SERIES_FIRST_STEP = 1.5  # mosafs step 1 / local disk (fsync), at most
SERIES_LATER_STEPS = 1.0  # each deduplicated step / local disk (fsync), below

Pids = Callable[[], dict[str, int]]
LABELS = {"nullfs": "null", "mosafs": "mosafs", "moosefs": "MooseFS"}


# -- the phases as write.py runs them ---------------------------------------------------------

def mosafs_more(mnt: Path, pids: Pids, committed: Callable[[Path, int], dict[str, Any]],
                workdir: Path, options: Options, result: dict[str, Any]) -> None:
    """On the running mosafs cluster, after its reads: the concurrent writers, then the
    checkpoint series against the local disk (the work directory's file system)."""
    counts = result["writers"]["counts"]
    (mnt / "writers").mkdir()
    result["writers"]["mosafs"] = writer_runs(mnt / "writers", counts, options.size,
                                              options.seed, pids, "mosafs")
    workload = series_workload(options.series_size, options.series_steps, options.seed)
    result["series"] = series_phase(mnt / "series", workdir / "local-series", workload, pids,
                                    committed)


def peer_phase(workdir: Path, options: Options, skipped: str | None,
               result: dict[str, Any]) -> dict[str, Any]:
    """MooseFS where it runs (--peer moosefs where it cannot was refused before the run;
    too little disk is an error then, and a reason to skip with auto); its concurrent
    writers go to result["writers"]["moosefs"]."""
    counts = result["writers"]["counts"]
    if skipped is None:
        skipped = space_reason(workdir, moosefs_bytes(options.size, counts))
        if skipped and options.peer == "moosefs":
            raise BenchError(skipped)
    if skipped:
        progress(f"MooseFS peer skipped: {skipped}")
        return {"skipped": skipped}
    out, result["writers"]["moosefs"] = moosefs_phase(
        workdir / "moosefs", options.size, options.seed, counts, options.peer_fsync,
        result["notes"])
    return out


# -- concurrent writers -----------------------------------------------------------------------

def writer_counts(n: int) -> list[int]:
    """Always one writer (the single-stream figure through the same process model), and N."""
    return sorted({1, n})


def concurrent_writes(paths: list[Path], total: int, seed: str, pids: Pids) -> dict[str, Any]:
    """len(PATHS) writer processes, each TOTAL/len bytes to its path, released together."""
    each = max(1, total // len(paths))
    children: list[subprocess.Popen[bytes]] = []
    try:
        for i, path in enumerate(paths):
            children.append(subprocess.Popen(
                python_command("mosafs.bench.phases", "write", str(path), str(each),
                               f"{seed}/{i}"),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True))
            procs.STARTED.append((f"writer-{i}", children[-1].pid))
        for child in children:  # each has generated its data: nothing of that is timed
            assert child.stdout is not None
            if child.stdout.readline().strip() != b"ready":
                raise BenchError(f"writer {child.pid} did not start: {_stderr(child)}")
        with CpuMeter(pids) as cpu:
            for child in children:
                assert child.stdin is not None
                child.stdin.write(b"go\n")
                child.stdin.flush()
            outs = [_finish(child) for child in children]
    finally:
        kill_pids([c.pid for c in children if alive(c.pid)])
        for child in children:
            child.wait()
    start = min(o["start"] for o in outs)
    end = max(o["start"] + o["closed"] for o in outs)
    size = sum(o["bytes"] for o in outs)
    _count_writers(cpu.result, sum(o["cpu_s"] for o in outs))
    return {
        "writers": len(paths), "bytes_each": each, "bytes": size,
        "aggregate_mb_s": round(size / (end - start) / MB, 1), "seconds": round(end - start, 3),
        "per_writer_mb_s": [round(o["bytes"] / o["closed"] / MB, 1) for o in outs],
        "start_spread_s": round(max(o["start"] for o in outs) - start, 4),
        "writers_cpu_s": round(sum(o["cpu_s"] for o in outs), 2),
        "cpu": cpu.result,
    }


def _count_writers(cpu: dict[str, Any], seconds: float) -> None:
    """The writers' own CPU (each reports it: they have exited before CpuMeter's end) as
    one more process of the figure, not as other work on the machine."""
    wall = cpu["wall_s"]
    cpu["cpu_s"]["writers"] = round(seconds, 2)
    cpu["cpu_s_all"] = round(cpu["cpu_s_all"] + seconds, 2)
    if wall > 0:
        cpu["cpu_percent"]["writers"] = round(100 * seconds / wall, 1)
        cpu["other_busy_cpus"] = round(max(0.0, cpu["other_busy_cpus"] - seconds / wall), 2)


def _finish(child: subprocess.Popen[bytes]) -> dict[str, Any]:
    out, err = child.communicate(timeout=WRITER_TIMEOUT)
    if child.returncode != 0:
        raise BenchError(f"writer {child.pid} failed ({child.returncode}): "
                         f"{err.decode(errors='replace').strip()[-2000:]}")
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


def _stderr(child: subprocess.Popen[bytes]) -> str:
    child.kill()
    _, err = child.communicate()
    return err.decode(errors="replace").strip()[-2000:]


def writer_runs(folder: Path, counts: list[int], total: int, seed: str, pids: Pids,
                label: str, *, names: Callable[[int], str] | None = None,
                repeat: int = 1) -> list[dict[str, Any]]:
    """One concurrent_writes per count in COUNTS (best of REPEAT), files in FOLDER."""
    runs = []
    for n in counts:
        paths = [folder / (names(i) if names else f"n{n}.w{i}.bin") for i in range(n)]
        tries = [concurrent_writes(paths, total, f"{seed}/writers/{n}", pids)
                 for _ in range(repeat)]
        best = max(tries, key=lambda r: float(r["aggregate_mb_s"]))
        if repeat > 1:
            best["runs_mb_s"] = [t["aggregate_mb_s"] for t in tries]
        runs.append(best)
        progress(f"{label} {n} writers: {best['aggregate_mb_s']:.0f} MB/s aggregate")
    return runs


def null_writers(workdir: Path, counts: list[int], total: int, seed: str,
                 repeat: int) -> list[dict[str, Any]]:
    """The ceiling: the null file system with a file per writer."""
    fs = NullFs(workdir, "nullfiles", "--files", str(max(counts)))
    try:
        fs.start()
        return writer_runs(fs.mountpoint, counts, total, seed, lambda: {"nullfs": fs.pid},
                           "null", names=lambda i: f"data.{i}", repeat=repeat)
    finally:
        with _uninterrupted():
            fs.stop()


def writer_main(path: str, size: int, seed: str) -> int:
    """The writer process: generate, say "ready", wait for "go", write, print the times."""
    data = make_data(seed.encode(), size)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    before = os.times()
    t = write_file(path, data, LARGE_WRITE)
    after = os.times()
    # perf_counter is CLOCK_MONOTONIC on Linux: one clock for every process of the machine.
    print(json.dumps({"bytes": t.size, "start": t.start, "opened": t.opened,
                      "written": t.written, "closed": t.closed,
                      "cpu_s": after.user + after.system - before.user - before.system}),
          flush=True)
    return 0


# -- the checkpoint series ---------------------------------------------------------------------

def series_workload(size: int, count: int, seed: str) -> Workload:
    return Workload("checkpoint", size, count, change=SERIES_CHANGE, regions=SERIES_REGIONS,
                    insertions=0, seed=f"{seed}/series").check()


def series_phase(folder: Path, local: Path, workload: Workload, pids: Pids,
                 committed: Callable[[Path, int], dict[str, Any]] | None = None,
                 ) -> dict[str, Any]:
    """Each step to FOLDER (mosafs), then to LOCAL with and without fsync; per step the
    seconds and ratios. COMMITTED(path, size): the version's stats, untimed."""
    folder.mkdir(parents=True, exist_ok=True)
    synced, plain = local / "fsync", local / "no-fsync"
    synced.mkdir(parents=True, exist_ok=True)
    plain.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for step, data in enumerate(steps(workload), 1):
            rows.append(_series_step(step, data, folder, synced, plain, pids, committed))
            del data
            gc.collect()
    finally:
        shutil.rmtree(local, ignore_errors=True)  # only the timing mattered: free the disk
    return {"workload": workload.to_json(), "write_bytes": LARGE_WRITE,
            "local_dir": str(local), "steps": rows}


def _series_step(step: int, data: bytes, folder: Path, synced: Path, plain: Path,
                 pids: Pids, committed: Callable[[Path, int], dict[str, Any]] | None,
                 ) -> dict[str, Any]:
    name = f"ckpt.0.{step}"
    with CpuMeter(pids) as cpu:
        t = write_file(folder / name, data, LARGE_WRITE)
    stats = committed(folder / name, len(data)) if committed else {}
    d = write_file(synced / name, data, LARGE_WRITE, fsync=True)
    p = write_file(plain / name, data, LARGE_WRITE)
    os.sync()  # untimed: the unsynced copy's dirty pages must not flush during the next step
    row: dict[str, Any] = {
        "step": step, "name": name, "bytes": len(data),
        "mosafs_s": round(t.closed, 3), "mosafs_mb_s": round(t.mb_s(t.closed), 1),
        "local_fsync_s": round(d.closed, 3), "local_fsync_mb_s": round(d.mb_s(d.closed), 1),
        "local_s": round(p.closed, 3), "local_mb_s": round(p.mb_s(p.closed), 1),
        "ratio_vs_local_fsync": _ratio(t.closed, d.closed),
        "ratio_vs_local": _ratio(t.closed, p.closed),
        "cpu": cpu.result,
    }
    if stats:
        row["stats"] = stats
        row["unchanged_chunks"] = round(stats["shared_chunks"] / stats["chunks"], 3) \
            if stats["chunks"] else 0.0
    progress(f"series step {step}: mosafs {t.closed:.2f}s, local disk {d.closed:.2f}s "
             f"(fsync) / {p.closed:.2f}s")
    return row


# -- MooseFS --------------------------------------------------------------------------------------

def moosefs_bytes(size: int, counts: list[int]) -> int:
    """Chunk bytes the MooseFS phase stores, every copy counted."""
    return GOAL * size * (2 + len(counts))


def moosefs_phase(workdir: Path, size: int, seed: str, counts: list[int], fsync: bool,
                  notes: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The mosafs figures, measured the same way on a private MooseFS cluster; and its
    concurrent writers."""
    fs = MooseFs(workdir, fsync=fsync)
    out: dict[str, Any] = {}
    try:
        started = time.perf_counter()
        fs.start()
        progress(f"MooseFS: ready in {time.perf_counter() - started:.1f}s")
        out["config"] = fs.describe()
        expected = ""
        for name, block, tag in (("write_1m", LARGE_WRITE, "1m"), ("write_4k", SMALL_WRITE, "4k")):
            data = make_data(f"{seed}/{tag}".encode(), size)
            if name == "write_1m":
                expected = digest(data)
            out[name] = _peer_write(fs, fs.mnt / f"{name}.bin", data, block)
            del data
            gc.collect()
            progress(f"MooseFS {name}: OAB {out[name]['oab_mb_s']:.0f} MB/s")
        path = fs.mnt / "write_1m.bin"
        out["write_1m"]["copies"] = fs.copies(path)
        fs.unmount()  # cold: a new mfsmount (empty caches) and no page cache anywhere
        dropped = drop_caches()
        fs.mount()
        dropped = drop_caches() and dropped
        out["read_cold"] = _peer_read(fs, path, size, "cold")
        out["read_cold"]["page_cache_dropped"] = dropped
        out["read_warm"] = _peer_read(fs, path, size, "warm")
        out["read_verified"] = read_file(path, READ_BLOCK, hash_it=True).blake3 == expected
        if not out["read_verified"]:
            raise BenchError(f"{path} read back wrong content")
        (fs.mnt / "writers").mkdir()
        writers = writer_runs(fs.mnt / "writers", counts, size, seed, fs.pids, "MooseFS")
        notes.append("MooseFS: cold read after unmounting mfsmount, dropping the page cache "
                     "and mounting again (the chunkservers keep running)")
    finally:
        with _uninterrupted():
            fs.stop()
    return out, writers


def _peer_write(fs: MooseFs, path: Path, data: bytes, block: int) -> dict[str, Any]:
    assert fs.client is not None
    pid = fs.client.pid
    reset_peak_rss(pid)
    with CpuMeter(fs.pids) as cpu:
        t = write_file(path, data, block)
    return {"bytes": len(data), "write_bytes": block,
            "oab_mb_s": round(t.mb_s(t.closed), 1), "open_s": round(t.opened, 4),
            "last_write_returned_s": round(t.written, 3),
            "close_returned_s": round(t.closed, 3),
            "peak_rss_bytes": memory_status(pid).get("VmHWM", 0), "cpu": cpu.result}


def _peer_read(fs: MooseFs, path: Path, size: int, label: str) -> dict[str, Any]:
    from mosafs.bench.write import timed_read

    return timed_read(fs.pids, path, size, f"MooseFS read {label}")


# -- comparisons and the table ---------------------------------------------------------------

def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else 0.0


def _check(value: float, op: str, target: float, **extra: Any) -> dict[str, Any]:
    passed = {">=": value >= target, "<=": value <= target, "<": value < target}[op]
    return {"value": value, "target": f"{op} {target}", "pass": passed, **extra}


def _by_count(runs: list[dict[str, Any]]) -> dict[int, float]:
    return {int(r["writers"]): float(r["aggregate_mb_s"]) for r in runs}


def writer_ratios(writers: dict[str, Any]) -> dict[str, dict[str, float]]:
    """mosafs' aggregate over the null file system's and MooseFS', by writer count."""
    ours = _by_count(writers.get("mosafs") or [])
    out: dict[str, dict[str, float]] = {}
    for other in ("nullfs", "moosefs"):
        theirs = _by_count(writers.get(other) or [])
        if ours and theirs:
            out[f"mosafs_vs_{other}"] = {str(n): _ratio(ours[n], theirs[n]) for n in ours}
    return out


def comparisons(result: dict[str, Any]) -> dict[str, Any]:
    """Issue 17's targets, each with its value and "pass", for what this run measured."""
    out: dict[str, Any] = {}
    mosafs, peer = result["mosafs"], result.get("moosefs") or {}
    if "write_1m" in peer:
        for name, ours, theirs in (
                ("oab_1m_vs_moosefs", mosafs["write_1m"]["oab_mb_s"], peer["write_1m"]["oab_mb_s"]),
                ("oab_4k_vs_moosefs", mosafs["write_4k"]["oab_mb_s"], peer["write_4k"]["oab_mb_s"]),
                ("cold_read_vs_moosefs", mosafs["read_cold"]["mb_s"], peer["read_cold"]["mb_s"])):
            out[name] = _check(_ratio(ours, theirs), ">=", PEER_TARGETS[name],
                               mosafs_mb_s=ours, moosefs_mb_s=theirs)
    writers = result.get("writers") or {}
    if writers.get("mosafs") and writers.get("nullfs"):
        n = max(writers["counts"])
        ours, null = _by_count(writers["mosafs"])[n], _by_count(writers["nullfs"])[n]
        out[f"writers_{n}_vs_null"] = _check(
            _ratio(ours, null), ">=", WRITERS_VS_NULL, mosafs_mb_s=ours, null_mb_s=null,
            note="the target is for the GPU machine")
    rows = (result.get("series") or {}).get("steps") or []
    if rows:
        out["series_step_1_vs_local_fsync"] = _check(
            rows[0]["ratio_vs_local_fsync"], "<=", SERIES_FIRST_STEP,
            mosafs_s=rows[0]["mosafs_s"], local_fsync_s=rows[0]["local_fsync_s"])
    if len(rows) > 1:
        later = [r["ratio_vs_local_fsync"] for r in rows[1:]]
        out["series_later_steps_vs_local_fsync"] = _check(
            max(later), "<", SERIES_LATER_STEPS, per_step=later,
            note="the largest ratio of the deduplicated steps (2..N): each must be < 1")
    return out


def table_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The table's rows for MooseFS, the concurrent writers and the series."""
    rows: list[tuple[str, str]] = []
    mosafs, peer = result["mosafs"], result.get("moosefs") or {}
    if "skipped" in peer:
        rows.append(("MooseFS peer", f"skipped: {peer['skipped']}"))
    for name, label in (("write_1m", "1 MiB"), ("write_4k", "4 KiB")):
        if name in peer:
            w = peer[name]
            rows.append((f"MooseFS write {w['bytes'] / MiB:.0f} MiB, {label} writes",
                         f"OAB {w['oab_mb_s']:.0f} MB/s (mosafs/MooseFS "
                         f"{_ratio(mosafs[name]['oab_mb_s'], w['oab_mb_s']):.2f})"))
    for name, label in (("read_cold", "cold"), ("read_warm", "warm")):
        if name in peer:
            rows.append((f"MooseFS {label} read", f"{peer[name]['mb_s']:.0f} MB/s (mosafs/"
                         f"MooseFS {_ratio(mosafs[name]['mb_s'], peer[name]['mb_s']):.2f})"))
    writers = result.get("writers") or {}
    for n in writers.get("counts", []):
        got = {fs: _by_count(writers[fs]).get(n) for fs in ("nullfs", "mosafs", "moosefs")
               if writers.get(fs)}
        ratios = writers.get("ratios", {}).get("mosafs_vs_moosefs", {})
        rows.append((f"{n} concurrent writer{'s' if n > 1 else ''}, 1 MiB writes, aggregate",
                     ", ".join(f"{LABELS[fs]} {v:.0f}" for fs, v in got.items()
                               if v is not None) + " MB/s"
                     + (f" (mosafs/MooseFS {ratios[str(n)]:.2f})" if str(n) in ratios else "")))
    for r in (result.get("series") or {}).get("steps", []):
        rows.append((f"series step {r['step']}, {r['bytes'] / MiB:.0f} MiB",
                     f"mosafs {r['mosafs_s']:.2f}s, local disk {r['local_fsync_s']:.2f}s "
                     f"fsync / {r['local_s']:.2f}s not; ratio {r['ratio_vs_local_fsync']:.2f}"
                     + (f", {r['unchanged_chunks']:.0%} chunks unchanged"
                        if "unchanged_chunks" in r and r["step"] > 1 else "")))
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] != "write":
        print("usage: python -m mosafs.bench.phases write PATH BYTES SEED", file=sys.stderr)
        return 2
    return writer_main(argv[1], int(argv[2]), argv[3])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
