"""`mosafs bench series|stripe|clients`: the stdchk and MosaStore evaluations on mosafs.

All three run a Testbed (a manager and benefactors, behind emulated 1 Gbit/s links unless
`--links none`) and benchmark writers (mosafs.bench.writer: the client's write path in a
process of its own), and print one JSON object. Definitions (docs/benchmarks.md):

- OAB: file size / (open until the last write() returned); ASB: file size / (open until
  close() returned: data stored, version committed). MB/s = 10^6 bytes/s.
- series: a workload of S steps written as one checkpoint series per configuration
  (non-CA, CA-CPU, CA-GPU where a GPU exists, CA-oracle; fixed vs CDC; average chunk
  256 KiB, 1 MiB, 4 MiB), the same bytes each time, each on a fresh cluster (nothing
  dedupes across runs). Figures of step 1 (all new) and of the later steps (the
  checkpoints) apart.
- stripe: one benefactor link is the bottleneck of W=1; W=1..4 stripe new data (no
  content addressing, as in stdchk) over 1..4 links.
- clients: N writers at once (1 to 8), each a 100 MiB file, started together.
"""

from __future__ import annotations

import datetime
import json
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mosafs.bench.procs import BenchError, _record, kill_pids
from mosafs.bench.testbed import Links, Testbed
from mosafs.bench.workloads import Workload
from mosafs.bench.write import _work_dir, git_info, machine_info, progress
from mosafs.chunking.spec import DEFAULT_SPEC
from mosafs.procutil import python_command

MiB = 1 << 20
AVERAGES = (256 * 1024, MiB, 4 * MiB)
WRITER_TIMEOUT_S = 3600.0
EMULATION = {"netns": "veth pairs between network namespaces, shaped by tc tbf",
             "ratelimit": "each benefactor takes chunk bytes at the link's rate "
                          "(--ingest-rate), on loopback"}


@dataclass(frozen=True)
class Config:
    """One way of writing: content addressing on or off, the hash backend, the chunker."""

    name: str
    chunker: str
    backend: str = "cpu"      # cpu | gpu | oracle
    content_addressing: bool = True

    def job(self) -> dict[str, Any]:
        return {"hash_backend": self.backend, "content_addressing": self.content_addressing,
                "chunker": self.chunker}


def chunker_spec(kind: str, average: int) -> str:
    return f"fixed:{average}" if kind == "fixed" else \
        f"cdc:{average // 4}:{average}:{average * 4}"


def series_configs(averages: tuple[int, ...], gpu: bool) -> list[Config]:
    out = [Config(f"non-CA fixed {average >> 10}K", chunker_spec("fixed", average), "oracle",
                  False) for average in averages]
    for backend, label in (("cpu", "CA-CPU"), ("gpu", "CA-GPU"), ("oracle", "CA-oracle")):
        if backend == "gpu" and not gpu:
            continue
        for kind in ("fixed", "cdc"):
            for average in averages:
                out.append(Config(f"{label} {kind} {average >> 10}K",
                                  chunker_spec(kind, average), backend))
    return out


@dataclass
class Options:
    quick: bool = False
    links: Links | None = field(default_factory=Links)
    keep: Path | None = None
    command: str = "mosafs bench"


# --- running writers -------------------------------------------------------------------------

class Writers:
    """Writer processes on a testbed: started, waited for, their results read."""

    def __init__(self, bed: Testbed, workdir: Path) -> None:
        self.bed = bed
        self.workdir = workdir
        self.count = 0

    def start(self, job: dict[str, Any]) -> tuple[subprocess.Popen[bytes], Path]:
        self.count += 1
        job_path = self.workdir / f"writer-{self.count}.job.json"
        out_path = self.workdir / f"writer-{self.count}.result.json"
        job_path.write_text(json.dumps({"manager": self.bed.address, **job}))
        log_path = self.workdir / f"writer-{self.count}.log"
        with open(log_path, "wb") as log_file:
            popen = subprocess.Popen(
                [*self.bed.prefix(self.bed.client_ns),
                 *python_command("mosafs.bench.writer", str(job_path), str(out_path))],
                stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        _record(f"writer-{self.count}", popen.pid)
        return popen, out_path

    def wait(self, popen: subprocess.Popen[bytes], out_path: Path) -> dict[str, Any]:
        try:
            status = popen.wait(timeout=WRITER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_pids([popen.pid])
            raise BenchError(f"a writer ran past {WRITER_TIMEOUT_S:.0f}s") from None
        if status != 0 or not out_path.exists():
            log = out_path.with_suffix("").with_suffix(".log")
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise BenchError(f"writer exited with status {status}:\n{tail}")
        return dict(json.loads(out_path.read_text()))

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        return self.wait(*self.start(job))


@contextmanager
def _testbed(workdir: Path, benefactors: int, options: Options,
             manager_args: tuple[str, ...] = ()) -> Iterator[Testbed]:
    links = options.links
    progress(f"starting a manager and {benefactors} benefactors"
             + (f" behind {links.rate_bit / 1e9:g} Gbit/s links ({links.mode})" if links
                else " on loopback"))
    with Testbed(workdir, benefactors, links=options.links,
                 manager_args=("--gc-grace", "3600", *manager_args)) as bed:
        yield bed


def _header(name: str, options: Options, params: dict[str, Any]) -> dict[str, Any]:
    links = options.links
    return {
        "benchmark": f"mosafs bench {name}",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": options.command,
        "machine": machine_info(),
        "git": git_info(),
        "params": {**params, "quick": options.quick,
                   "links": {"rate_bit_s": links.rate_bit, "per": "benefactor",
                             "mode": links.mode, "emulation": EMULATION[links.mode]}
                   if links else None,
                   "units": "MB/s = 10^6 bytes/s; sizes in bytes; CPU in seconds"},
    }


def _mean(values: list[float]) -> float:
    return round(statistics.fmean(values), 1) if values else 0.0


def _summary(files: list[dict[str, Any]]) -> dict[str, Any]:
    """OAB/ASB and friends over FILES (empty: zeros)."""
    size = sum(f["size"] for f in files)
    return {
        "files": len(files),
        "oab_mb_s": _mean([f["oab_mb_s"] for f in files]),
        "asb_mb_s": _mean([f["asb_mb_s"] for f in files]),
        # Detected similarity: the share of the bytes written that were found stored and
        # not sent (0 for non-CA, which sends everything).
        "similarity": round(1 - sum(f["new_bytes"] for f in files) / size, 3) if size else 0.0,
        "bytes_sent": sum(f["new_bytes"] for f in files),
        "client_cpu_s": round(sum(f["cpu_s"] for f in files), 2),
    }


def _gpu_available() -> str | None:
    from mosafs.chunking.gpu import GpuBackend

    return GpuBackend.unavailable_reason()


# --- series ----------------------------------------------------------------------------------

def run_series(options: Options, workload: Workload, *, stripe_width: int = 1,
               configs: list[Config] | None = None) -> dict[str, Any]:
    gpu_reason = _gpu_available()
    if configs is None:
        averages = (MiB,) if options.quick else AVERAGES
        configs = series_configs(averages, gpu=gpu_reason is None)
    result = _header("series", options, {
        "workload": workload.to_json(), "designed_similarity": workload.similarity,
        "stripe_width": stripe_width, "benefactors": 3, "replication": 1,
        "gpu": "available" if gpu_reason is None else f"skipped: {gpu_reason}"})
    runs = []
    with _work_dir(options.keep) as workdir:
        for i, config in enumerate(configs):
            progress(f"series {i + 1}/{len(configs)}: {config.name}")
            # A cluster of its own for each configuration: every one writes the same bytes
            # (comparable figures) and finds nothing a run before it stored.
            with _testbed(workdir / f"bed-{i}", 3, options, (
                    "--stripe-width", str(stripe_width), "--chunker", config.chunker)) as bed:
                run = Writers(bed, workdir / f"bed-{i}").run({
                    **config.job(), "workload": workload.to_json(), "folder": "series",
                    "name_template": "app.n0.{step}"})
                stored = bed.stored_bytes()
            files = sorted(run["files"], key=lambda f: f["step"])
            runs.append({
                "config": config.name, "chunker": config.chunker, "hash_backend":
                    run["hash_backend"], "content_addressing": config.content_addressing,
                "first": _summary(files[:1]), "later": _summary(files[1:]),
                "bytes_written": sum(f["size"] for f in files),
                "bytes_sent": sum(f["new_bytes"] for f in files), "bytes_stored": stored,
                "client_cpu_s": round(sum(f["cpu_s"] for f in files), 2),
                "errors": run["errors"], "steps": files})
    result["runs"] = runs
    result["targets"] = series_targets(runs)
    return result


def _asb_ratio(runs: list[dict[str, Any]], name: str,
               reference: str) -> tuple[float, dict[str, Any]] | None:
    """ASB of run NAME over run REFERENCE's (checkpoint steps), and NAME's run."""
    run = next((r for r in runs if r["config"] == name), None)
    ref = next((r for r in runs if r["config"] == reference), None)
    if run is None or ref is None or not ref["later"]["asb_mb_s"]:
        return None
    return run["later"]["asb_mb_s"] / ref["later"]["asb_mb_s"], run


def series_targets(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """CA ASB >= 2x non-CA on the checkpoints (similarity >= 70%); CA-GPU within 10% of
    CA-oracle, with CA-CPU's gap. Compared at 1 MiB chunks (CDC for CA)."""
    out: dict[str, Any] = {}
    for label in ("CA-CPU", "CA-GPU"):
        found = _asb_ratio(runs, f"{label} cdc 1024K", "non-CA fixed 1024K")
        if found is not None:
            ratio, run = found
            similarity = run["later"]["similarity"]
            out[f"{label.lower()}_asb_vs_non_ca"] = {
                "ratio": round(ratio, 2), "target": 2.0, "similarity": similarity,
                "pass": ratio >= 2.0 and similarity >= 0.7}
        found = _asb_ratio(runs, f"{label} cdc 1024K", "CA-oracle cdc 1024K")
        if found is not None:
            ratio = found[0]
            key = f"{label.lower()}_vs_oracle"
            out[key] = {"ratio": round(ratio, 3), "gap": round(1 - ratio, 3)}
            if label == "CA-GPU":
                out[key].update(target=0.9, **{"pass": ratio >= 0.9})
    return out


# --- stripe ----------------------------------------------------------------------------------

def run_stripe(options: Options, size: int,
               widths: tuple[int, ...] = (1, 2, 3, 4)) -> dict[str, Any]:
    workload = Workload("different", size, 2, seed="mosafs-bench-stripe")
    config = Config("non-CA fixed 1024K", chunker_spec("fixed", MiB), "oracle", False)
    result = _header("stripe", options, {
        "workload": workload.to_json(), "benefactors": max(widths), "replication": 1,
        "chunker": config.chunker, "content_addressing": False})
    runs = []
    with _work_dir(options.keep) as workdir, \
            _testbed(workdir / "bed", max(widths), options,
                     ("--chunker", config.chunker)) as bed:
        writers = Writers(bed, workdir)
        for width in widths:
            progress(f"stripe width {width}")
            bed.admin("pool", "set", "default", "--stripe-width", str(width))
            run = writers.run({**config.job(), "folder": f"stripe/{width}",
                               "workload": replace(workload, seed=f"{workload.seed}/{width}")
                               .to_json(), "name_template": "data.{step}"})
            runs.append({"stripe_width": width, **_summary(run["files"]),
                         "errors": run["errors"]})
    result["runs"] = runs
    one = next((r for r in runs if r["stripe_width"] == 1), None)
    four = next((r for r in runs if r["stripe_width"] == 4), None)
    if one and four and one["asb_mb_s"]:
        ratio = four["asb_mb_s"] / one["asb_mb_s"]
        result["targets"] = {"w4_vs_w1_asb": {"ratio": round(ratio, 2), "target": 3.5,
                                              "pass": ratio >= 3.5}}
    return result


# --- clients ---------------------------------------------------------------------------------

def run_clients(options: Options, size: int,
                counts: tuple[int, ...] = (1, 2, 4, 8)) -> dict[str, Any]:
    result = _header("clients", options, {
        "file_bytes": size, "writers": list(counts), "benefactors": 3, "stripe_width": 3,
        "replication": 1, "workload": "different (every writer its own bytes)",
        "hash_backend": "cpu", "chunker": "the default pool's"})
    runs = []
    with _work_dir(options.keep) as workdir, _testbed(workdir / "bed", 3, options) as bed:
        writers = Writers(bed, workdir)
        for count in counts:
            progress(f"{count} concurrent writers")
            runs.append(_concurrent(bed, writers, count, size))
    result["runs"] = runs
    one = next((r for r in runs if r["writers"] == 1), None)
    eight = next((r for r in runs if r["writers"] == 8), None)
    if one and eight:
        result["targets"] = {"eight_writers": {
            "errors": eight["errors"], "aggregate_mb_s": eight["aggregate_mb_s"],
            "one_writer_mb_s": one["aggregate_mb_s"],
            "pass": not eight["errors"] and eight["aggregate_mb_s"] >= one["aggregate_mb_s"]}}
    return result


def _concurrent(bed: Testbed, writers: Writers, count: int, size: int) -> dict[str, Any]:
    start_at = time.time() + 3.0 + 0.5 * count  # every writer set up before the first byte
    before = bed.status()["metadata_write_transactions"]
    started = [writers.start({
        "hash_backend": "cpu", "content_addressing": True, "chunker": DEFAULT_SPEC,
        "workload": Workload("different", size, 1, seed=f"clients/{count}/{i}").to_json(),
        "folder": f"clients/{count}", "name_template": f"writer-{i}.{{step}}",
        "start_at": start_at}) for i in range(count)]
    results, failures = [], []
    for popen, out in started:
        try:
            results.append(writers.wait(popen, out))
        except BenchError as exc:
            failures.append(str(exc).splitlines()[0])
    files = [f for r in results for f in r["files"]]
    errors = failures + [e for r in results for e in r["errors"]]
    if not files:
        return {"writers": count, "aggregate_mb_s": 0.0, "errors": errors}
    first = min(f["start_wall"] for f in files)
    last = max(f["end_wall"] for f in files)
    transactions = bed.status()["metadata_write_transactions"] - before
    return {
        "writers": count, "files": len(files), "bytes": sum(f["size"] for f in files),
        "elapsed_s": round(last - first, 3),
        "aggregate_mb_s": round(sum(f["size"] for f in files) / (last - first) / 1e6, 1),
        "per_writer_asb_mb_s": [round(f["asb_mb_s"], 1) for f in files],
        "manager_write_transactions": transactions,
        "manager_transactions_per_s": round(transactions / (last - first), 1),
        "client_cpu_s": round(sum(f["cpu_s"] for f in files), 2),
        "errors": errors,
    }


# --- the table printed without --json --------------------------------------------------------

def format_table(result: dict[str, Any]) -> str:
    """RESULT of series, stripe or clients for people: what was run, a row per run, and
    the targets (`--json` gives every figure, steps included)."""
    name = result["benchmark"].rsplit(" ", 1)[-1]
    headers, rows = {"series": _series_rows, "stripe": _stripe_rows,
                     "clients": _clients_rows}[name](result["runs"])
    lines = [_setting(result), "", *_columns(headers, rows), "", *_targets(result)]
    if result.get("figures"):
        lines.append("figures: " + ", ".join(result["figures"]))
    lines.append("MB/s = 10^6 bytes/s; --json prints every figure (each step, CPU, bytes)")
    return "\n".join(lines)


def _setting(result: dict[str, Any]) -> str:
    params = result["params"]
    links = params.get("links")
    where = (f"{links['rate_bit_s'] / 1e9:g} Gbit/s links per benefactor ({links['mode']})"
             if links else "loopback")
    workload = params.get("workload")
    what = (f"{workload['kind']} workload, {workload['steps']} x {_mib(workload['size'])}"
            if isinstance(workload, dict) else f"files of {_mib(params['file_bytes'])}")
    gpu = f"; GPU {params['gpu']}" if "gpu" in params else ""
    return f"{result['benchmark']}: {what}, {where}{'; quick' if params['quick'] else ''}{gpu}"


def _series_rows(runs: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    headers = ["configuration", "chunker", "step 1 ASB", "later ASB", "later OAB",
               "similarity", "sent", "stored", "errors"]
    rows = [[r["config"], r["chunker"], _rate(r["first"]["asb_mb_s"]),
             _rate(r["later"]["asb_mb_s"]) if r["later"]["files"] else "-",
             _rate(r["later"]["oab_mb_s"]) if r["later"]["files"] else "-",
             f"{r['later']['similarity']:.0%}" if r["later"]["files"] else "-",
             _mib(r["bytes_sent"]), _mib(r["bytes_stored"]), str(len(r["errors"]))]
            for r in runs]
    return headers, rows


def _stripe_rows(runs: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    headers = ["stripe width", "files", "OAB", "ASB", "client CPU s", "errors"]
    rows = [[str(r["stripe_width"]), str(r["files"]), _rate(r["oab_mb_s"]),
             _rate(r["asb_mb_s"]), f"{r['client_cpu_s']:.1f}", str(len(r["errors"]))]
            for r in runs]
    return headers, rows


def _clients_rows(runs: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    headers = ["writers", "aggregate", "per writer ASB", "manager tx/s", "errors"]
    rows = []
    for r in runs:
        each = r.get("per_writer_asb_mb_s") or []
        spread = f"{min(each):.0f}..{max(each):.0f} MB/s" if each else "-"
        rows.append([str(r["writers"]), _rate(r["aggregate_mb_s"]), spread,
                     f"{r.get('manager_transactions_per_s', 0):.1f}", str(len(r["errors"]))])
    return headers, rows


def _columns(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Aligned columns: the first left-aligned, the figures right-aligned."""
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()
    return [line(headers), *map(line, rows)]


def _targets(result: dict[str, Any]) -> list[str]:
    targets = result.get("targets") or {}
    if not targets:
        return ["targets: none measured (the runs they compare were not all made)"]
    lines = ["targets:"]
    for name, figures in targets.items():
        shown = ", ".join(f"{k} {v}" for k, v in figures.items() if k != "pass")
        verdict = ("  PASS" if figures["pass"] else "  FAIL") if "pass" in figures else ""
        lines.append(f"  {name}: {shown}{verdict}")
    return lines


def _rate(mb_s: float) -> str:
    return f"{mb_s:.0f} MB/s"


def _mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= MiB else f"{n} bytes"
