"""`mosafs bench checkpoint`: `mosafs.checkpoint.save` and `load` of a state dict shaped
like a model's (plan_state) against `torch.save` to the local disk and to the mount, and
against `safetensors` loads from the local disk, in one run on a `mosafs up` cluster.

The steps are files of one series (MNT/ckpt/model.r0.STEP, the default series pattern
APP.NODE.STEP: each save dedupes against the step before): step 1 all new; steps 2..N
with a seeded random subset of whole tensors, about CHANGED of the bytes, changed in
place on the device; one more such step saved with blocking=False; one with every tensor
new. Each step's save is followed by torch.save of the same state to the local disk
(open, save, flush, fsync, close) and to the mount (MNT/ckpt/torch.r0.STEP; close
commits). torch and safetensors are imported when a run starts, not before.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import importlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mosafs.bench import write
from mosafs.bench.procs import BenchError
from mosafs.bench.timing import quiet_disks
from mosafs.bench.write import _Mosafs, progress

MiB = 1 << 20
VOCAB = 16384           # rows of an embedding: 64 MiB of float32 at hidden size 1024
REST_PIECE = 16 * MiB   # the bytes no layer fills, in tensors of at most this size
SMALL = 64 * 1024       # smaller tensors change with the next larger one in the file
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
ST_DTYPES = {"float32": "F32", "bfloat16": "BF16"}  # safetensors' names
WARMUP_BYTES = 4 * MiB
# Before each timed save, the longest wait for the machine's disks to go idle, so that no
# save pays for I/O the step or the run before it left (a deleted work directory); the
# JSON records each wait (docs/benchmarks.md, "Disks idle before each timed save").
QUIET_S = 10.0
# The issue's targets, for a 1 GiB state dict on a GPU with 10 % of it changed per step.
DEDUP_VS_LOCAL_MAX = 0.15   # blocking save / torch.save to the local disk
TO_HOST_SLACK = 1.1         # bytes_to_host <= 1.1 x bytes_sent + header
NONBLOCKING_MAX_S = 0.05    # save(blocking=False) returns within
ALL_NEW_VS_LOCAL_MAX = 1.0  # all-new steps: blocking save / torch.save to the local disk
LOAD_SPEED_MIN = 0.8        # load speed / safetensors.torch.load_file's, local disk
ISSUE_SIZE, ISSUE_CHANGED = 1024 * MiB, 0.10
UNCHANGED_CHUNKS_MIN = 0.90  # the condition of the dedup target: of the file's chunks


# -- the pure parts: the state dict, the changed subsets, verdicts, the table -----------------

@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]
    dtype: str  # a key of DTYPE_BYTES

    @property
    def nbytes(self) -> int:
        return DTYPE_BYTES[self.dtype] * math.prod(self.shape)


def _layer(i: int, h: int) -> list[TensorPlan]:
    """One transformer block at hidden size H: 4 H^2 float32 matrices, 8 H^2 and 4 H^2
    bfloat16 ones (4, 16 and 8 MiB at H = 1024), and three small vectors."""
    p = f"layers.{i:03d}."
    return [TensorPlan(p + "attention_norm.weight", (h,), "float32"),
            *(TensorPlan(p + f"attention.{w}.weight", (h, h), "float32")
              for w in ("wq", "wk", "wv", "wo")),
            TensorPlan(p + "attention.wo.bias", (h,), "float32"),
            TensorPlan(p + "ffn_norm.weight", (h,), "float32"),
            TensorPlan(p + "feed_forward.w13.weight", (8 * h, h), "bfloat16"),
            TensorPlan(p + "feed_forward.w2.weight", (h, 4 * h), "bfloat16")]


def plan_state(total: int) -> list[TensorPlan]:
    """Tensors adding up to TOTAL bytes (less under 4), shaped like a model's state dict."""
    h = 1024 if total >= 256 * MiB else 256
    big = VOCAB * h * 4
    embeddings = total >= 8 * big  # two of them, an eighth of the state dict at most
    specs = [TensorPlan("tok_embeddings.weight", (VOCAB, h), "float32")] if embeddings else []
    layer = sum(t.nbytes for t in _layer(0, h))
    for i in range(max(0, total - 2 * big * embeddings - 4 * h) // layer):
        specs += _layer(i, h)
    specs.append(TensorPlan("norm.weight", (h,), "float32"))
    if embeddings:
        specs.append(TensorPlan("output.weight", (VOCAB, h), "float32"))
    rest = (total - sum(t.nbytes for t in specs)) // 4
    for i, start in enumerate(range(0, rest, REST_PIECE // 4)):
        specs.append(TensorPlan(f"rest.{i:03d}.weight",
                                (min(REST_PIECE // 4, rest - start),), "float32"))
    return specs


def file_order(plan: Sequence[TensorPlan]) -> tuple[list[int], int]:
    """PLAN's indices in the order a safetensors file holds them (by dtype, then name),
    and the file's header bytes (its length prefix included)."""
    from mosafs.checkpoint.format import TensorSpec, layout

    found = layout([TensorSpec(t.name, ST_DTYPES[t.dtype], t.shape, t.nbytes) for t in plan])
    index = {t.name: i for i, t in enumerate(plan)}
    return [index[e.spec.name] for e in found.entries], len(found.header)


def change_groups(plan: Sequence[TensorPlan]) -> list[list[int]]:
    """Indices of PLAN in runs that change together: each tensor of at least SMALL bytes
    with the small ones just before it in the file; small ones at the end join the last.
    A norm changing alone would cost a whole chunk (1 MiB on average) for a few KiB, which
    no training step does (a layer's norms train with its matrices)."""
    groups: list[list[int]] = []
    pending: list[int] = []
    for i in file_order(plan)[0]:
        pending.append(i)
        if plan[i].nbytes >= SMALL:
            groups.append(pending)
            pending = []
    if pending and groups:
        groups[-1] += pending
    elif pending:
        groups.append(pending)
    return groups


def choose(sizes: Sequence[int], fraction: float, rng: random.Random) -> list[int]:
    """Indices (sorted) of a random subset whose SIZES add up to about FRACTION of the
    total: in a shuffled order, each is taken where it brings the sum closer to it."""
    target = fraction * sum(sizes)
    order = list(range(len(sizes)))
    rng.shuffle(order)
    taken: list[int] = []
    total = 0
    for i in order:
        if abs(total + sizes[i] - target) < abs(total - target):
            taken.append(i)
            total += sizes[i]
    return sorted(taken)


def changed_tensors(plan: Sequence[TensorPlan], fraction: float, rng: random.Random) -> list[int]:
    """Indices (sorted) of the tensors one step rewrites: about FRACTION of the bytes."""
    groups = change_groups(plan)
    sizes = [sum(plan[i].nbytes for i in g) for g in groups]
    return sorted(i for g in choose(sizes, fraction, rng) for i in groups[g])


def step_kinds(steps: int) -> list[str]:
    """The series: "first" (all new), STEPS - 1 "changed", "nonblocking", "all_new"."""
    return ["first", *["changed"] * (steps - 1), "nonblocking", "all_new"]


def step_rng(seed: int, step: int) -> random.Random:
    return random.Random(f"mosafs-bench-checkpoint/{seed}/{step}")


def ratio(a: float | None, b: float | None, digits: int | None = 3) -> float | None:
    return None if a is None or not b else a / b if digits is None else round(a / b, digits)


def _judge(values: Sequence[float | None], target: str, ok: Any,
           **figures: Any) -> dict[str, Any]:
    """A target over VALUES (one per step, unrounded): the worst; pass where OK holds for
    every one; None where there is none."""
    known = [v for v in values if v is not None]
    worst = (min if target.startswith(">") else max)(known, default=None)
    return {"value": _round(worst), "target": target,
            "pass": all(v is not None and ok(v) for v in values) if values else None,
            "values": [_round(v) for v in values], **figures}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def verdicts(steps: Sequence[dict[str, Any]], loads: dict[str, Any] | None, *,
             device: str, header_bytes: int) -> dict[str, Any]:
    """The issue's targets on a run's figures. "pass" is None where there is nothing to
    judge (no such step; bytes to the host where the tensors are on the host)."""
    dedup = [s for s in steps if s["kind"] == "changed"]
    new = [s for s in steps if s["kind"] in ("first", "all_new")]
    nb = [s["nonblocking"] for s in steps if s.get("nonblocking")]
    host = [{"step": s["step"], "bytes_to_host": s["bytes_to_host"],
             "limit_bytes": int(TO_HOST_SLACK * s["bytes_sent"]) + header_bytes}
            for s in dedup if device == "cuda"]
    speed = [ratio(loads["cold"]["local_s"], loads["cold"]["mosafs_s"], None)] if loads else []
    out = {
        "dedup_save_vs_torch_local": _judge(
            [ratio(s["save_blocking_s"], s["torch_save_local_s"], None) for s in dedup],
            f"<= {DEDUP_VS_LOCAL_MAX}", lambda v: v <= DEDUP_VS_LOCAL_MAX,
            steps=[s["step"] for s in dedup],
            unchanged_chunks=[s.get("unchanged_chunks") for s in dedup],
            note=_condition_note(dedup)),
        "dedup_bytes_to_host": _judge(
            [ratio(h["bytes_to_host"], h["limit_bytes"], None) for h in host],
            f"<= 1 (bytes_to_host / ({TO_HOST_SLACK} x bytes_sent + header))",
            lambda v: v <= 1.0, per_step=host, header_bytes=header_bytes,
            note=None if device == "cuda" else "tensors on the host: none copied from a GPU"),
        "nonblocking_return_s": _judge(
            [n["returned_s"] for n in nb], f"<= {NONBLOCKING_MAX_S} s",
            lambda v: v <= NONBLOCKING_MAX_S, total_s=[n["total_s"] for n in nb]),
        "all_new_save_vs_torch_local": _judge(
            [ratio(s["save_blocking_s"], s["torch_save_local_s"], None) for s in new],
            f"<= {ALL_NEW_VS_LOCAL_MAX}", lambda v: v <= ALL_NEW_VS_LOCAL_MAX,
            steps=[s["step"] for s in new]),
        "load_speed_vs_safetensors_local": _judge(
            speed, f">= {LOAD_SPEED_MIN}", lambda v: v >= LOAD_SPEED_MIN,
            note="safetensors.torch.load_file seconds / mosafs.checkpoint.load seconds, "
                 "cold"),
    }
    judged = [t["pass"] for t in out.values() if t["pass"] is not None]
    return {**out, "pass": all(judged) if judged else None}


def _condition_note(dedup: Sequence[dict[str, Any]]) -> str | None:
    """The issue's condition for the dedup target is 90 % of the chunks unchanged; a
    step rewriting 10 % of the bytes in whole tensors leaves fewer (the chunks across each
    changed tensor's ends are new too): say so where a step missed it."""
    short = [s["step"] for s in dedup
             if s.get("unchanged_chunks") is not None
             and s["unchanged_chunks"] < UNCHANGED_CHUNKS_MIN]
    if not short:
        return None
    return (f"steps {short} left fewer than {UNCHANGED_CHUNKS_MIN:.0%} of their chunks "
            f"unchanged (the issue's condition); --changed sets the bytes rewritten")


def format_table(result: dict[str, Any]) -> str:
    """The human summary: a line per step, the loads, the verdicts."""
    p = result["params"]
    lines = [f"{result['benchmark']}: {p['state_dict_bytes'] / MiB:.0f} MiB state dict, "
             f"{p['tensors']} tensors on {p['device']}, {p['changed']:.0%} changed per step",
             "", f"{'step':>4} {'kind':<11} {'changed':>7} {'save s':>7} {'total s':>7} "
             f"{'local s':>7} {'mount s':>7} {'ratio':>6} {'hashed':>7} {'to host':>7} "
             f"{'sent':>7}  (MiB)"]
    for r in result["steps"]:
        lines.append(
            f"{r['step']:>4} {r['kind']:<11} {r['changed_fraction']:>7.1%} "
            f"{_num(r['save_blocking_s']):>7} {_num(r['total_s']):>7} "
            f"{_num(r['torch_save_local_s']):>7} {_num(r['torch_save_mount_s']):>7} "
            f"{_num(r['ratio_vs_local']):>6} {r['bytes_hashed'] / MiB:>7.1f} "
            f"{r['bytes_to_host'] / MiB:>7.1f} {r['bytes_sent'] / MiB:>7.1f}")
        if r.get("nonblocking"):
            nb = r["nonblocking"]
            lines.append(f"     non-blocking: returned in {nb['returned_s']:.4f}s, saved in "
                         f"{nb['total_s']:.3f}s")
    loads = result.get("loads") or {}
    lines += [f"load {kind}: mosafs {loads[kind]['mosafs_s']:.3f}s, safetensors local "
              f"{loads[kind]['local_s']:.3f}s" for kind in ("cold", "warm") if kind in loads]
    if loads:
        lines.append(f"page cache dropped before cold loads: {loads['page_cache_dropped']}")
    lines.append("")
    verdict = {True: "PASS", False: "FAIL", None: "n/a"}
    lines += [f"{name}: {_num(t['value'])} (target {t['target']}) {verdict[t['pass']]}"
              for name, t in result["targets"].items() if name != "pass"]
    lines.append(f"overall: {verdict[result['targets']['pass']]}")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}" if x < 10 else f"{x:.1f}"


# -- torch ------------------------------------------------------------------------------------

def _import(what: str) -> Any:
    try:
        return importlib.import_module(what)
    except ImportError:
        raise BenchError(f"needs {what.split('.')[0]}, which is not installed "
                         f"(e.g. `pip install torch safetensors`)") from None


def resolve_device(torch: Any, device: str | None) -> str:
    """DEVICE, or cuda where torch sees one, else cpu; a GPU that cannot run is an error."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        from mosafs.chunking.gpu import gpu_unavailable_reason

        if not torch.cuda.is_available():
            raise BenchError("--device cuda: torch sees no CUDA device")
        reason = gpu_unavailable_reason()
        if reason:
            raise BenchError(f"--device cuda: mosafs' GPU backend cannot run: {reason}")
    return device


def _sync(torch: Any, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def make_state(torch: Any, plan: Sequence[TensorPlan], device: str,
               seed: int) -> dict[str, Any]:
    gen = torch.Generator(device=device).manual_seed(seed)
    return {t.name: torch.randn(t.shape, generator=gen, dtype=getattr(torch, t.dtype),
                                device=device) for t in plan}


def _torch_save(torch: Any, sd: dict[str, Any], path: Path, *, fsync: bool) -> float:
    """Seconds from open to close: torch.save, flush, fsync (the local disk's durability;
    the mount's close commits), close."""
    start = time.perf_counter()
    with open(path, "wb") as f:
        try:
            torch.save(sd, f)
        except RuntimeError as exc:  # torch's zip writer hides a Ctrl-C in its write
            if isinstance(exc.__context__, KeyboardInterrupt):
                raise exc.__context__ from None
            raise
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    return time.perf_counter() - start


def check_equal(torch: Any, loaded: dict[str, Any], sd: dict[str, Any], what: str) -> None:
    if set(loaded) != set(sd):
        raise BenchError(f"{what}: loaded names differ from the state dict's")
    for name, t in sd.items():
        if not torch.equal(loaded[name], t):
            raise BenchError(f"{what}: tensor {name} loaded back different")


# -- the run ----------------------------------------------------------------------------------

@dataclass
class _Run:
    torch: Any
    device: str
    plan: list[TensorPlan]
    sd: dict[str, Any]
    changed: float
    seed: int
    local: Path
    m: _Mosafs  # the cluster
    prepare: bool = True  # on a GPU: mosafs.checkpoint.prepare before step 1
    quiet_s: float = QUIET_S  # the longest wait for idle disks before a timed save

    @property
    def folder(self) -> Path:
        """MNT/ckpt: the steps' files."""
        return self.m.mnt / "ckpt"


def run_checkpoint(*, size_mib: int = 1024, steps: int = 5, changed: float = 0.10,
                   device: str | None = None, local_dir: Path | None = None,
                   up_args: Sequence[str] = (), keep: Path | None = None, seed: int = 0,
                   prepare: bool = True, quiet_s: float = QUIET_S,
                   command: str = "mosafs bench checkpoint") -> dict[str, Any]:
    """The whole benchmark; the result as one JSON-able dict. Cleans up whatever happens.
    PREPARE: on a GPU, the process's one-time costs are paid before step 1
    (mosafs.checkpoint.prepare, timed apart in `warmup_s`), as a training job would at
    start; without, step 1 pays them. QUIET_S: before each timed save,
    mosafs's and `torch.save`'s, the wait at most for the machine's disks to be idle
    (mosafs.bench.timing.quiet_disks; 0: no wait)."""
    torch = _import("torch")
    device = resolve_device(torch, device)
    prepare = prepare and device != "cpu"
    started = time.perf_counter()
    plan = plan_state(size_mib * MiB)
    header = file_order(plan)[1]
    up = _up_args(up_args, device)
    result: dict[str, Any] = {
        "benchmark": "mosafs bench checkpoint",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command, "machine": _machine(torch, device),
        "params": {"size_mib": size_mib, "state_dict_bytes": sum(t.nbytes for t in plan),
                   "header_bytes": header, "tensors": len(plan), "steps": steps,
                   "changed": changed, "device": device, "seed": seed, "up_args": up,
                   "prepare": prepare, "quiet_s": quiet_s,
                   "as_issue": (size_mib * MiB == ISSUE_SIZE and changed <= ISSUE_CHANGED
                                and device == "cuda"),
                   "units": "seconds; bytes; ratio_vs_local = save_blocking_s / "
                            "torch_save_local_s"},
    }
    with (write._signals_interrupt(),
          write._work_dir(keep, prefix="mosafs-bench-checkpoint-") as workdir,
          _local_dir(local_dir, workdir, keep=keep is not None) as local):
        progress(f"work directory {workdir}, local directory {local}")
        m = _Mosafs(workdir, [a for a in up if a != "--insecure"], tls="--insecure" not in up)
        run = _Run(torch, device, plan, make_state(torch, plan, device, seed), changed, seed,
                   local, m, prepare, quiet_s)
        _sync(torch, device)
        result.update(_with_cluster(run, steps))
        result["targets"] = verdicts(result["steps"], result["loads"], device=device,
                                     header_bytes=header)
        result["notes"] = _notes(result)
        result["processes"] = write._check_all_stopped()
        result["elapsed_s"] = round(time.perf_counter() - started, 1)
        if keep is not None:
            (workdir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _with_cluster(run: _Run, steps: int) -> dict[str, Any]:
    """Start the cluster, run the steps and loads, stop it (the library's client first)."""
    from mosafs.checkpoint.cluster import close_all

    try:
        run.m.start()
        run.folder.mkdir()
        out: dict[str, Any] = {"warmup_s": _warm_up(run)}
        out["steps"] = [_step(run, i, kind) for i, kind in enumerate(step_kinds(steps), 1)]
        out["loads"] = _loads(run, run.folder / f"model.r0.{len(out['steps'])}")
        return out
    finally:
        close_all()
        run.m.stop()


def _warm_up(run: _Run) -> dict[str, float]:
    """Untimed in the figures: a file written through the mount, and a small save and
    load (the library's client, its connections, the GPU kernels)."""
    from mosafs import checkpoint

    start = time.perf_counter()
    (run.m.mnt / "warmup.bin").write_bytes(os.urandom(WARMUP_BYTES))  # close commits
    out = {"mount_write_s": round(time.perf_counter() - start, 3)}
    small = {"warmup": run.torch.randn(WARMUP_BYTES // 4, device=run.device)}
    start = time.perf_counter()
    checkpoint.save(small, run.m.mnt / "warmup.safetensors")
    handle = checkpoint.save(small, run.m.mnt / "warmup.safetensors", blocking=False)
    assert isinstance(handle, checkpoint.SaveHandle)
    handle.wait()
    check_equal(run.torch, checkpoint.load(run.m.mnt / "warmup.safetensors",
                                           device=run.device), small, "warm-up")
    out["library_save_load_s"] = round(time.perf_counter() - start, 3)
    if run.prepare:
        start = time.perf_counter()
        parts = checkpoint.prepare(run.device)
        out["prepare_s"] = round(time.perf_counter() - start, 3)
        out.update({f"prepare_{k}": round(v, 3) for k, v in parts.items()})
    # Untimed, as between steps: the warm-up's writes, the cluster's start and whatever
    # the run before left (a deleted work directory) are on disk before step 1 is timed.
    os.sync()
    return out


def _mutate(run: _Run, step: int, kind: str) -> list[int]:
    """The tensors STEP changes (in place, on the device); all of them at step 1."""
    if kind in ("first", "all_new"):
        changed = list(range(len(run.plan)))
    else:
        changed = changed_tensors(run.plan, run.changed, step_rng(run.seed, step))
    if kind != "first":
        for i in changed:
            run.sd[run.plan[i].name].add_(1.0)
    _sync(run.torch, run.device)
    return changed


def _step(run: _Run, step: int, kind: str) -> dict[str, Any]:
    changed = _mutate(run, step, kind)
    changed_bytes = sum(run.plan[i].nbytes for i in changed)
    disk_wait_s = quiet_disks(limit_s=run.quiet_s)
    row: dict[str, Any] = {
        "step": step, "kind": kind, "changed_tensors": len(changed),
        "changed_bytes": changed_bytes,
        "changed_fraction": round(changed_bytes / sum(t.nbytes for t in run.plan), 4),
        "disk_wait_s": disk_wait_s,
        **_save(run, run.folder / f"model.r0.{step}", blocking=kind != "nonblocking")}
    figures = row["save"]
    # Of the file's chunks, those the step did not store (by count where the save counts
    # its new chunks, the GPU path; else by bytes).
    row["unchanged_chunks"] = (
        round(1 - figures["new_chunks"] / figures["chunks"], 4)
        if figures.get("chunks") and figures.get("backend") == "gpu"
        else round(1 - row["sent_fraction"], 4) if row["sent_fraction"] is not None else None)
    os.sync()  # untimed: no dirty page of one save is written back during the next
    row.update(_torch_saves(run, step))
    row["ratio_vs_local"] = ratio(row["save_blocking_s"], row["torch_save_local_s"])
    progress(f"step {step} ({kind}, {row['changed_fraction']:.1%} changed): save "
             f"{_num(row['save_blocking_s'])}s (total {row['total_s']:.3f}s, "
             f"{row['bytes_sent'] / MiB:.1f} MiB sent), torch.save local "
             f"{row['torch_save_local_s']:.3f}s, mount {row['torch_save_mount_s']:.3f}s")
    return row


def _save(run: _Run, path: Path, *, blocking: bool) -> dict[str, Any]:
    """mosafs.checkpoint.save of the state as PATH: the caller's wait (blocking), or the
    call's return and the total (non-blocking, waited for); the save's figures."""
    from mosafs import checkpoint

    start = time.perf_counter()
    done = checkpoint.save(run.sd, path, blocking=blocking)
    returned = time.perf_counter() - start
    row: dict[str, Any] = {"name": path.name, "save_blocking_s": None}
    if isinstance(done, checkpoint.SaveHandle):
        handle, done = done, done.wait()
        row["nonblocking"] = {"returned_s": round(returned, 4),
                              "blocked_s": round(handle.result_so_far.blocked_s, 4),
                              "total_s": round(done.total_s, 4)}
    else:
        row["save_blocking_s"] = round(returned, 4)
    figures = done.as_dict()
    return {**row, **{k: figures[k] for k in ("bytes_hashed", "bytes_to_host", "bytes_sent")},
            "total_s": round(done.total_s, 4),
            "sent_fraction": round(done.bytes_sent / done.size, 4) if done.size else None,
            "save": figures}


def _torch_saves(run: _Run, step: int) -> dict[str, Any]:
    """torch.save of the state to the local disk (fsync) and to the mount; what the mount
    stored new of it."""
    local = run.local / f"torch.r0.{step}.pt"
    out: dict[str, Any] = {
        "torch_disk_wait_s": quiet_disks(limit_s=run.quiet_s),
        "torch_save_local_s": round(_torch_save(run.torch, run.sd, local, fsync=True), 4),
        "torch_file_bytes": local.stat().st_size}
    for old in run.local.glob("torch.r0.*.pt"):  # the disk holds one at a time
        if old != local:
            old.unlink()
    os.sync()
    mounted = run.folder / f"torch.r0.{step}"  # a series of its own
    out["torch_save_mount_s"] = round(_torch_save(run.torch, run.sd, mounted, fsync=False), 4)
    assert run.m.stats is not None
    out["torch_mount_new_bytes"] = write._wait_committed(
        run.m.stats, mounted.stat().st_ino, out["torch_file_bytes"])["new_bytes"]
    return out


def _loads(run: _Run, last: Path) -> dict[str, Any]:
    """Cold then warm: mosafs.checkpoint.load of LAST, and safetensors.torch.load_file of
    the same state written to the local disk; each checked equal to the state."""
    from mosafs import checkpoint
    from mosafs.bench.timing import drop_caches

    st = _import("safetensors.torch")
    local = run.local / "model.safetensors"
    st.save_file(run.sd, str(local))
    out: dict[str, Any] = {"file": last.name, "local_file": str(local),
                           "file_bytes": local.stat().st_size}
    loaders = {"mosafs": lambda: checkpoint.load(last, device=run.device),
               "local": lambda: st.load_file(str(local), device=run.device)}
    dropped = []
    for kind in ("cold", "warm"):
        got: dict[str, Any] = {}
        for where, loader in loaders.items():
            if kind == "cold":
                dropped.append(drop_caches())  # syncs first; False where not root
            else:
                # Warm means each reader's own bytes in the page cache: the cold pass
                # dropped mosafs' chunk files again before the local load.
                warming = loader()
                del warming
            _sync(run.torch, run.device)
            start = time.perf_counter()
            loaded = loader()
            _sync(run.torch, run.device)
            got[f"{where}_s"] = round(time.perf_counter() - start, 4)
            check_equal(run.torch, loaded, run.sd, f"load from {where}")
            del loaded
            gc.collect()
        got["speed_ratio"] = ratio(got["local_s"], got["mosafs_s"])
        out[kind] = got
        progress(f"load {kind}: mosafs {got['mosafs_s']:.3f}s, safetensors local "
                 f"{got['local_s']:.3f}s")
    out["page_cache_dropped"] = all(dropped)
    out["verified"] = True  # check_equal raised otherwise
    return out


# -- context ----------------------------------------------------------------------------------

def _notes(result: dict[str, Any]) -> list[str]:
    notes = ["torch_save_mount_s follows the mosafs save of the same step: chunks that save "
             "stored are not sent again (the manager's chunk index; torch_mount_new_bytes)"]
    if not result["params"]["as_issue"]:
        notes.append("the targets are the issue's for 1 GiB on a GPU, at most 10 % changed "
                     "per step; this run differs in size, fraction or device")
    if result["params"]["device"] == "cpu":
        notes.append("on cpu, safetensors.torch.load_file maps the file without copying "
                     "it: a warm load there costs next to nothing; load copies into tensors")
    if not result["loads"]["page_cache_dropped"]:
        notes.append("the page cache could not be dropped (not root): the cold loads are "
                     "cold for mosafs' chunk cache only")
    return notes


def _up_args(up_args: Sequence[str], device: str) -> list[str]:
    """The `mosafs up` arguments: the caller's, and --hash-backend gpu on cuda unless the
    caller chose a backend (the mount's torch.save then chunks on the GPU too)."""
    up = list(up_args)
    if device == "cuda" and not any(a.startswith("--hash-backend") for a in up):
        up += ["--hash-backend", "gpu"]
    return up


def _machine(torch: Any, device: str) -> dict[str, Any]:
    return {**write.machine_info(), "torch": torch.__version__,
            "safetensors": _import("safetensors").__version__,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None}


@contextlib.contextmanager
def _local_dir(parent: Path | None, workdir: Path, *, keep: bool) -> Iterator[Path]:
    """The local disk's files: in WORKDIR by default (the disk of the cluster's data),
    else in a new directory in PARENT, removed afterwards unless KEEP."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    local = Path(tempfile.mkdtemp(prefix="local-", dir=parent or workdir))
    try:
        yield local
    finally:
        if parent is not None and not keep:
            shutil.rmtree(local, ignore_errors=True)
