"""`mosafs bench checkpoint --ranks 1,2`: the aggregate save throughput of several ranks,
each a process saving its own shard with `mosafs.checkpoint.save`, against one rank.

One `mosafs up` cluster serves every pass. A pass with N ranks starts N processes; rank r
sees only GPU r mod G (`CUDA_VISIBLE_DEVICES`, set before torch loads: one rank per GPU,
as a training launcher places them) or works on the CPU. Each rank builds its own state
dict of --size-mib (mosafs.bench.checkpoint_plan.plan_state, its own seed, so no rank's bytes
dedupe against another's or another pass's), warms up (a small save and load), then saves
the series MNT/ckpt-N/model.rR.STEP:

* step 1 `first`: all new;
* steps 2..S `changed`: about CHANGED of the bytes rewritten (whole tensors, in place);
* steps S+1 and S+2 `all_new`: every tensor rewritten.

Every step starts at a barrier of the pass's ranks; its aggregate throughput is the bytes
of every rank's state dict over the time from the first rank's call to the last rank's
return (the host's monotonic clock, the same in every process). Per kind of step the
median over its steps is the figure, and `scaling` is the N-rank figure over the
one-rank figure (issue 23's target: at least 1.8 with two ranks on two GPUs, for the
90 %-unchanged and the all-new steps). Each rank loads its last file back and checks it.
Per pass, `benefactor_puts` gives the benefactors' puts by stage (a local connection's
wait for a serving thread, a blob's wait for a storing thread, a blob's store): how many,
and their mean time.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import statistics
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mosafs.bench import rpcstats, write
from mosafs.bench.checkpoint import check_equal, make_state, optional_import, resolve_device
from mosafs.bench.checkpoint_plan import MiB, changed_tensors, plan_state, step_rng
from mosafs.bench.procs import BenchError, cpu_seconds
from mosafs.bench.workers import collect, running
from mosafs.bench.write import _Mosafs, progress

TARGET_SCALING = 1.8
BARRIER_TIMEOUT_S = 600.0
WARMUP_BYTES = 4 * MiB
KINDS = ("changed", "all_new")  # the kinds of step the target is judged on
PUT_SECONDS = "mosafs_benefactor_put_seconds"  # histogram by stage: local_wait, wait, store


def step_kinds(steps: int) -> list[str]:
    """The series of a rank: "first", STEPS - 1 "changed", two "all_new"."""
    return ["first", *["changed"] * (steps - 1), "all_new", "all_new"]


def rank_seed(seed: int, ranks: int, rank: int) -> int:
    """A state dict of its own for every rank of every pass."""
    return seed * 1_000_000 + ranks * 1000 + rank


# -- a rank -----------------------------------------------------------------------------

def _rank_main(rank: int, ranks: int, gpu: int | None, params: dict[str, Any],
               barrier: Any, out: Any) -> None:
    if gpu is not None:  # before torch and CuPy load: this rank sees its GPU alone
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    try:
        _rank(rank, ranks, params, lambda: barrier.wait(BARRIER_TIMEOUT_S), out.put)
    except BaseException:  # to the parent, which fails the pass
        out.put(("error", f"rank {rank}: {traceback.format_exc(limit=10)}"))
        barrier.abort()


def _rank(rank: int, ranks: int, params: dict[str, Any], wait: Any, put: Any) -> None:
    from mosafs import checkpoint
    from mosafs.checkpoint.cluster import close_all

    torch = optional_import("torch")
    device = params["device"]
    folder = Path(params["folder"])
    plan = plan_state(params["size_mib"] * MiB)
    sd = make_state(torch, plan, device, rank_seed(params["seed"], ranks, rank))
    try:
        small = {"warmup": torch.randn(WARMUP_BYTES // 4, device=device)}
        checkpoint.save(small, folder / f"warmup.r{rank}")
        check_equal(torch, checkpoint.load(folder / f"warmup.r{rank}", device=device),
                    small, "warm-up")
        last = None
        for step, kind in enumerate(step_kinds(params["steps"]), 1):
            _mutate(torch, sd, plan, kind, params, rank, step)
            last = folder / f"model.r{rank}.{step}"
            wait()
            start = time.monotonic()
            result = checkpoint.save(sd, last)
            end = time.monotonic()
            assert isinstance(result, checkpoint.SaveResult)
            put(("step", rank, step, kind, start, end, result.size, result.bytes_sent,
                 result.bytes_to_host, _unchanged(result),
                 {k: round(v, 4) for k, v in result.phases.items()}))
        assert last is not None
        check_equal(torch, checkpoint.load(last, device=device), sd, f"rank {rank} load")
        put(("done", rank))
    finally:
        close_all()


def _mutate(torch: Any, sd: dict[str, Any], plan: Sequence[Any], kind: str,
            params: dict[str, Any], rank: int, step: int) -> None:
    if kind == "first":
        return
    if kind == "all_new":
        changed = list(range(len(plan)))
    else:
        changed = changed_tensors(plan, params["changed"],
                                  step_rng(rank_seed(params["seed"], 0, rank), step))
    for i in changed:
        sd[plan[i].name].add_(1.0)
    if params["device"] == "cuda":
        torch.cuda.synchronize()


def _unchanged(result: Any) -> float | None:
    """Of the file's chunks, those not stored (a GPU save counts its new chunks)."""
    if result.chunks and result.backend == "gpu":
        return round(1 - result.new_chunks / result.chunks, 4)
    return round(1 - result.bytes_sent / result.size, 4) if result.size else None


# -- a pass -----------------------------------------------------------------------------

def _cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of the cluster's processes, by role (benefactors summed)."""
    out: dict[str, float] = {}
    for role, pid in pids.items():
        used = cpu_seconds(pid)
        key = "benefactors" if role.startswith("benefactor") else role
        out[key] = out.get(key, 0.0) + (used or 0.0)
    return out


def _pass(ranks: int, gpus: int, params: dict[str, Any], pids: dict[str, int],
          benefactors: list[str]) -> dict[str, Any]:
    """N rank processes through their series; the figures, and the cluster's CPU seconds
    by role over the pass (the ranks' start-up and warm-up included), and the mean time
    of each stage of the benefactors' puts (from their /metrics pages BENEFACTORS)."""
    before = _cpu(pids)
    stages = rpcstats.totals(benefactors, PUT_SECONDS, "stage")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(ranks)
    out = ctx.Queue()
    placed = [r % gpus if gpus else None for r in range(ranks)]
    procs = [ctx.Process(target=_rank_main, args=(r, ranks, placed[r], params, barrier, out),
                         daemon=True, name=f"rank-{r}") for r in range(ranks)]
    with running(procs, 60) as alive:
        rows = [item[1:] for item in collect(out, len(procs), alive)]
    after = _cpu(pids)
    puts = rpcstats.means(stages, rpcstats.totals(benefactors, PUT_SECONDS, "stage"))
    return {"ranks": ranks, "gpus_of_ranks": placed, **_aggregate(rows, ranks),
            "cluster_cpu_s": {k: round(after[k] - before.get(k, 0.0), 2) for k in after},
            "benefactor_puts": puts}


def _aggregate(rows: list[tuple[Any, ...]], ranks: int) -> dict[str, Any]:
    """Per step: the wall time from the first call to the last return and the aggregate
    GB/s; per kind, the median over its steps."""
    by_step: dict[int, list[tuple[Any, ...]]] = {}
    for row in rows:
        by_step.setdefault(row[1], []).append(row)
    steps = []
    for step in sorted(by_step):
        got = by_step[step]
        if len(got) != ranks:
            raise BenchError(f"step {step}: {len(got)} of {ranks} ranks reported")
        wall = max(r[4] for r in got) - min(r[3] for r in got)
        size = sum(r[5] for r in got)
        unchanged = [r[8] for r in got if r[8] is not None]
        steps.append({"step": step, "kind": got[0][2], "wall_s": round(wall, 4),
                      "rank_s": [round(r[4] - r[3], 4) for r in sorted(got)],
                      "bytes": size, "GBps": round(size / wall / 1e9, 3),
                      "bytes_sent": sum(r[6] for r in got),
                      "bytes_to_host": sum(r[7] for r in got),
                      "unchanged_chunks": min(unchanged) if unchanged else None,
                      "phases": [r[9] for r in sorted(got)]})
    kinds = {kind: round(statistics.median(s["GBps"] for s in steps if s["kind"] == kind), 3)
             for kind in ("first", "changed", "all_new") if any(s["kind"] == kind for s in steps)}
    return {"steps": steps, "median_GBps": kinds}


# -- the run ----------------------------------------------------------------------------

def run_checkpoint_ranks(*, ranks: Sequence[int] = (1, 2), size_mib: int = 1024,
                         steps: int = 3, changed: float = 0.07, device: str | None = None,
                         up_args: Sequence[str] = (), keep: Path | None = None,
                         seed: int = 0,
                         command: str = "mosafs bench checkpoint --ranks") -> dict[str, Any]:
    """Every pass of RANKS on one cluster; the result as one JSON-able dict."""
    torch = optional_import("torch")
    device = resolve_device(torch, device)
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    started = time.perf_counter()
    up = list(up_args)
    result: dict[str, Any] = {
        "benchmark": "mosafs bench checkpoint --ranks",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": {**write.machine_info(), "torch": torch.__version__, "gpus": gpus,
                    "gpu": torch.cuda.get_device_name() if gpus else None},
        "params": {"ranks": list(ranks), "size_mib_per_rank": size_mib, "steps": steps,
                   "changed": changed, "device": device, "seed": seed, "up_args": up,
                   "units": "seconds; bytes; GB/s = 10^9 bytes of state dicts per second, "
                            "all ranks together"},
    }
    with (write._signals_interrupt(),
          write._work_dir(keep, prefix="mosafs-bench-ranks-") as workdir):
        progress(f"work directory {workdir}")
        m = _Mosafs(workdir, [a for a in up if a != "--insecure"], tls="--insecure" not in up)
        try:
            m.start()
            benefactors = list((m.cluster.ready.get("metrics") or {})
                               .get("benefactors", {}).values())
            passes = []
            for n in ranks:
                folder = m.mnt / f"ckpt-{n}"
                folder.mkdir()
                params = {"device": device, "folder": str(folder), "size_mib": size_mib,
                          "steps": steps, "changed": changed, "seed": seed}
                passes.append(_pass(n, gpus, params, m.pids(), benefactors))
                progress(f"{n} rank(s): {passes[-1]['median_GBps']} GB/s by kind of step")
        finally:
            m.stop()
        result["passes"] = passes
        result["targets"] = verdicts(passes)
        result["processes"] = write._check_all_stopped()
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    return result


def verdicts(passes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per kind judged, the scaling of the largest pass over the one-rank pass."""
    one = next((p for p in passes if p["ranks"] == 1), None)
    most = max(passes, key=lambda p: p["ranks"], default=None)
    if one is None or most is None or most["ranks"] < 2:
        return {"pass": None, "note": "needs a one-rank pass and one of two ranks or more"}
    out: dict[str, Any] = {}
    for kind in KINDS:
        a, b = one["median_GBps"].get(kind), most["median_GBps"].get(kind)
        scaling = round(b / a, 3) if a and b else None
        out[f"{kind}_{most['ranks']}_ranks_over_1"] = {
            "value": scaling, "target": f">= {TARGET_SCALING}",
            "met": scaling is not None and scaling >= TARGET_SCALING}
    out["pass"] = all(t["met"] for t in out.values())
    return out


def format_table(result: dict[str, Any]) -> str:
    lines = [f"{result['benchmark']}: {result['params']['size_mib_per_rank']} MiB per rank on "
             f"{result['params']['device']}", "",
             f"{'ranks':>5} {'step':>4} {'kind':<8} {'wall s':>7} {'GB/s':>7} "
             f"{'sent MiB':>9} {'unchanged':>9}"]
    for p in result["passes"]:
        for s in p["steps"]:
            unchanged = "-" if s["unchanged_chunks"] is None else f"{s['unchanged_chunks']:.1%}"
            lines.append(f"{p['ranks']:>5} {s['step']:>4} {s['kind']:<8} {s['wall_s']:>7.3f} "
                         f"{s['GBps']:>7.3f} {s['bytes_sent'] / MiB:>9.1f} {unchanged:>9}")
    lines.append("")
    for name, t in result["targets"].items():
        if isinstance(t, dict):
            lines.append(f"{name}: {t['value']} ({t['target']}): "
                         f"{'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines)
