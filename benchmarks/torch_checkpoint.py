"""A training job's checkpoints through mosafs against the local disk: torch.save of a state
dict every step, most of it unchanged between steps, then a cold torch.load of the last one.

    .venv/bin/python benchmarks/torch_checkpoint.py [--size-mib 1024] [--steps 5]
        [--changed 0.10] [--device cpu|cuda] [--keep DIR] [--up-arg=--hash-backend=gpu ...]
        [--local-dir DIR] [--seed N]

Prints one JSON object on stdout and a short table on stderr. Run it as root: it drops the
page cache before the cold loads. Needs PyTorch (not a dependency of mosafs).

What it does:
- a state dict shaped like a model's (a few 64 MiB embeddings, layers of 4-16 MiB float32
  and bfloat16 matrices, small norms and biases), random content from a seeded
  torch.Generator, on --device (a training job's tensors live on the GPU: torch.save copies
  each to the host);
- `mosafs up` (mosafs.bench.procs.UpCluster) on a fresh data directory, with --up-arg;
  an untimed 4 MiB warm-up file written to it and to the local directory (a new mount's
  first connections are no part of step 1; its seconds are reported);
- each step: from step 2 on, a seeded random subset of whole tensors, about --changed of the
  bytes, is rewritten; then `torch.save(sd, f)` into MNT/ckpt/model.0.<step>.pt and into the
  local directory, f from open(path, "wb"), then flush + fsync + close, timed open -> close
  (mosafs commits at close, durable at close with the default pessimistic semantics; the
  local disk is durable only after the fsync). The two saves alternate which goes first.
  Per step also: CPU seconds of every cluster process, and what mosafs stored new (its
  version stats' new bytes; deduped_fraction = the rest of the file's bytes);
- loads: the cluster is stopped, the page cache dropped, the cluster started again on the
  same data (the client's chunk cache is empty), the warm-up file read back; then
  torch.load(map_location=device) of the last step's file, cold (the page cache dropped
  just before), from the local disk and from mosafs; then once more each (warm); every
  load checked tensor by tensor (torch.equal) against the state dict saved.
- targets (the project's, for the GPU machine): each deduplicated step (2..N) saved in less
  time than the same save to the local disk, the first (all new) at most 1.5x; loads are
  reported, with no target.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import logging
import os
import random
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mosafs.bench.checkpoint_plan import TensorPlan as TensorSpec  # one tensor record for both
from mosafs.bench.checkpoint_plan import choose as choose_changed  # one rule for both benchmarks
from mosafs.bench.procs import BenchError
from mosafs.bench.timing import CpuMeter, drop_caches
from mosafs.bench.write import (
    _check_all_stopped,
    _Mosafs,
    _signals_interrupt,
    _wait_committed,
    _work_dir,
    git_info,
    machine_info,
    progress,
)
from mosafs.errors import MosafsError

log = logging.getLogger("mosafs.bench")

MiB = 1 << 20
FIRST_STEP_MAX = 1.5    # mosafs / local disk, step 1 (nothing to dedupe against): at most
DEDUP_STEP_MAX = 1.0    # mosafs / local disk, each later step: below
VOCAB = 16384           # rows of an embedding: 64 MiB of float32 at hidden size 1024
REST_PIECE = 16 * MiB   # the bytes no layer fills, in tensors of at most this size
WARMUP_NAME = "warmup.bin"
WARMUP_BYTES = 4 * MiB
# The figures (GPU machine, 1.07 GB state dict, 90 % of chunks unchanged), seconds.
REFERENCE = {"local_save_s": "0.9-1.1", "mosafs_first_step_s": 4.5,
             "mosafs_dedup_step_s": "2.1-2.4", "local_load_s": "0.4-0.7",
             "mosafs_load_s": "2.2-2.6"}


# -- the pure parts: the state dict's layout, the changed subset, verdicts, the table ---------

def _layer(i: int, h: int) -> list[TensorSpec]:
    """One transformer block at hidden size H: 40 H^2 bytes of matrices (4 of 4 H^2 float32,
    16 and 8 H^2 of bfloat16 MLP) and three small vectors."""
    p = f"layers.{i}."
    return [
        TensorSpec(p + "attention_norm.weight", (h,), "float32"),
        *(TensorSpec(p + f"attention.{w}.weight", (h, h), "float32")
          for w in ("wq", "wk", "wv", "wo")),
        TensorSpec(p + "attention.wo.bias", (h,), "float32"),
        TensorSpec(p + "ffn_norm.weight", (h,), "float32"),
        TensorSpec(p + "feed_forward.w13.weight", (8 * h, h), "bfloat16"),
        TensorSpec(p + "feed_forward.w2.weight", (h, 4 * h), "bfloat16"),
    ]


def model_layout(total: int) -> list[TensorSpec]:
    """Tensors adding up to about TOTAL bytes, shaped like a model's state dict: up to four
    VOCAB x H float32 embeddings (64 MiB at H = 1024), as many layers as fit, a final norm
    and one float32 tensor for the rest. Every tensor is its own storage, so torch.save
    writes each as one contiguous record."""
    h = 1024 if total >= 256 * MiB else 256
    big = VOCAB * h * 4
    n_big = min(4, total // (4 * big))
    layer_bytes = sum(t.nbytes for t in _layer(0, h))
    n_layers = max(0, total - n_big * big - 4 * h) // layer_bytes
    specs: list[TensorSpec] = []
    if n_big:
        specs.append(TensorSpec("tok_embeddings.weight", (VOCAB, h), "float32"))
    for i in range(n_layers):
        specs += _layer(i, h)
    specs.append(TensorSpec("norm.weight", (h,), "float32"))
    specs += [TensorSpec(f"extra_embeddings.{i}.weight", (VOCAB, h), "float32")
              for i in range(max(0, n_big - 2))]
    if n_big >= 2:
        specs.append(TensorSpec("output.weight", (VOCAB, h), "float32"))
    rest = (total - sum(t.nbytes for t in specs)) // 4
    for i, start in enumerate(range(0, rest, REST_PIECE // 4)):  # no tensor beyond 16 MiB
        specs.append(TensorSpec(f"rest.{i}.weight", (min(REST_PIECE // 4, rest - start),),
                                "float32"))
    return specs


def change_groups(layout: Sequence[TensorSpec]) -> list[list[int]]:
    """Indices of LAYOUT in runs that change together: each tensor of at least 1 MiB with
    the small ones (norms, biases) just before it; small ones at the end join the last run.

    A step rewrites whole runs: a small tensor changing on its own would cost a whole
    content-defined chunk (1 MiB on average) or two for a few KiB of change, which no
    frozen-layer training does (a layer's norms train with its matrices)."""
    groups: list[list[int]] = []
    pending: list[int] = []
    for i, spec in enumerate(layout):
        pending.append(i)
        if spec.nbytes >= MiB:
            groups.append(pending)
            pending = []
    if pending:
        if groups:
            groups[-1] += pending
        else:
            groups.append(pending)
    return groups


def changed_tensors(layout: Sequence[TensorSpec], fraction: float,
                    rng: random.Random) -> list[int]:
    """Indices (sorted) of the tensors one step rewrites: runs of change_groups adding up to
    about FRACTION of the bytes."""
    groups = change_groups(layout)
    sizes = [sum(layout[i].nbytes for i in g) for g in groups]
    return sorted(i for g in choose_changed(sizes, fraction, rng) for i in groups[g])


def step_rng(seed: int, step: int) -> random.Random:
    """The subset of step STEP depends on the seed and the step alone (same run, same
    subsets, whatever the device)."""
    return random.Random(f"torch-checkpoint/{seed}/{step}")


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b > 0 else None


def verdicts(local_s: Sequence[float], mosafs_s: Sequence[float]) -> dict[str, Any]:
    """The targets on the per-step save seconds: step 1 at most FIRST_STEP_MAX times the
    local disk, every later (deduplicated) step below DEDUP_STEP_MAX times. "pass" is None
    where there is nothing to judge (no later step)."""
    ratios = [ratio(m, loc) for loc, m in zip(local_s, mosafs_s, strict=True)]
    out: dict[str, Any] = {}
    if ratios:
        first = ratios[0]
        out["first_step_vs_local"] = {
            "value": first, "target": f"<= {FIRST_STEP_MAX}",
            "pass": first is not None and first <= FIRST_STEP_MAX,
            "mosafs_s": mosafs_s[0], "local_s": local_s[0]}
    later = ratios[1:]
    out["dedup_steps_vs_local"] = {
        "value": max((r for r in later if r is not None), default=None),
        "target": f"< {DEDUP_STEP_MAX} each", "per_step": later,
        "pass": all(r is not None and r < DEDUP_STEP_MAX for r in later) if later else None,
        "note": "the largest ratio of steps 2..N; each must be below the target"}
    judged = [v["pass"] for v in out.values()]
    out["pass"] = None if None in judged or not judged else all(judged)
    return out


def format_table(result: dict[str, Any]) -> str:
    """The human summary: a line per step, the loads, the verdicts."""
    lines = [f"{'step':>4} {'changed':>8} {'local s':>8} {'mosafs s':>9} {'ratio':>6} "
             f"{'new MiB':>8} {'deduped':>8} {'cluster cpu s':>13}"]
    for r in result["steps"]:
        new = r.get("new_bytes")
        deduped = r.get("deduped_fraction")
        lines.append(
            f"{r['step']:>4} {r['changed_fraction']:>8.1%} {r['local_s']:>8.2f} "
            f"{r['mosafs_s']:>9.2f} {_num(r['ratio']):>6} "
            f"{'-' if new is None else f'{new / MiB:.0f}':>8} "
            f"{'-' if deduped is None else f'{deduped:.1%}':>8} "
            f"{r['mosafs_cpu']['cluster_cpu_s']:>13.2f}")
    loads = result.get("loads") or {}
    for kind in ("cold", "warm"):
        if kind in loads:
            ld = loads[kind]
            lines.append(f"load {kind}: local {ld['local_s']:.2f}s, mosafs {ld['mosafs_s']:.2f}s,"
                         f" ratio {_num(ld['ratio'])}")
    for name, t in result["targets"].items():
        if name == "pass":
            continue
        verdict = {True: "PASS", False: "FAIL", None: "n/a"}[t["pass"]]
        lines.append(f"{name}: {_num(t['value'])} (target {t['target']}) {verdict}")
    overall = {True: "PASS", False: "FAIL", None: "not judged"}[result["targets"]["pass"]]
    lines.append(f"overall: {overall}")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


# -- torch ------------------------------------------------------------------------------------

def import_torch() -> Any:
    """torch, imported here so that the pure parts above (and their tests) need none."""
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise SystemExit("torch_checkpoint.py: needs PyTorch, which is not installed "
                         "(e.g. `.venv/bin/pip install torch`)") from None
    return torch


def build_state_dict(torch: Any, layout: list[TensorSpec], device: str,
                     gen: Any) -> dict[str, Any]:
    return {s.name: torch.randn(s.shape, generator=gen, dtype=getattr(torch, s.dtype),
                                device=device) for s in layout}


def rewrite(sd: dict[str, Any], names: list[str], gen: Any) -> None:
    """New content for whole tensors, in place: a training step's update of those."""
    for name in names:
        sd[name].normal_(generator=gen)


def synchronize(torch: Any, device: str) -> None:
    """Wait for the device's queued work: none of it may spill into a timed interval."""
    if device == "cuda":
        torch.cuda.synchronize()


def timed_save(torch: Any, sd: dict[str, Any], path: Path, device: str) -> float:
    """Seconds from open to close returned: torch.save into a file of ours, flush, fsync
    (the local disk's durability; on mosafs the close commits), close."""
    synchronize(torch, device)
    start = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(sd, f)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - start


def timed_load(torch: Any, path: Path, device: str) -> tuple[float, dict[str, Any]]:
    synchronize(torch, device)
    start = time.perf_counter()
    loaded = torch.load(path, map_location=device, weights_only=True)
    synchronize(torch, device)
    return time.perf_counter() - start, loaded


def check_equal(torch: Any, loaded: dict[str, Any], sd: dict[str, Any], path: Path) -> None:
    if list(loaded) != list(sd):
        raise BenchError(f"{path}: loaded keys differ from the saved state dict")
    for name, t in sd.items():
        if not torch.equal(loaded[name], t):
            raise BenchError(f"{path}: tensor {name} loaded back different")


# -- the run ------------------------------------------------------------------------------------

def warm_up(path: Path, *, write: bool) -> float:
    """Untimed in the results' figures: write (fsync, close) or read back a small file of
    random bytes, so that a new mount's first connections to its benefactors, and the like,
    are not counted in step 1 or in the cold load (a training job's mount has served
    files before); its chunks are no checkpoint's. Its seconds are reported."""
    start = time.perf_counter()
    if write:
        with open(path, "wb") as f:
            f.write(os.urandom(WARMUP_BYTES))
            f.flush()
            os.fsync(f.fileno())
    else:
        path.read_bytes()
    return round(time.perf_counter() - start, 3)


@dataclass
class Options:
    size: int
    steps: int
    changed: float
    device: str | None
    keep: Path | None
    up_args: list[str]
    local_dir: Path | None
    seed: int


class Cluster(_Mosafs):
    """The benchmark's `mosafs up` (mosafs.bench.write's), and version stats of a path."""

    def __init__(self, workdir: Path, up_args: list[str]) -> None:
        super().__init__(workdir, up_args, tls="--insecure" not in up_args)

    def version_stats(self, path: Path) -> dict[str, Any]:
        assert self.stats is not None
        st = os.stat(path)
        return _wait_committed(self.stats, st.st_ino, st.st_size)


def run(opts: Options, command: str) -> dict[str, Any]:
    torch = import_torch()
    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda: torch sees no CUDA device")
    started = time.perf_counter()
    layout = model_layout(opts.size)
    result: dict[str, Any] = {
        "benchmark": "torch_checkpoint",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": {**machine_info(), **_torch_info(torch, device)},
        "git": _git_info(),
        "params": {
            "size_bytes": opts.size, "state_dict_bytes": sum(s.nbytes for s in layout),
            "tensors": len(layout), "tensor_bytes": _size_histogram(layout),
            "steps": opts.steps, "changed": opts.changed, "device": device,
            "seed": opts.seed, "up_args": opts.up_args,
            "units": "seconds; sizes in bytes; ratio = mosafs / local disk"},
        "reference_issue_gpu": REFERENCE,
        "notes": [],
    }
    with (_signals_interrupt(), _work_dir(opts.keep, prefix="mosafs-torch-bench-") as workdir,
          _local_dir(opts.local_dir, workdir, keep=opts.keep is not None) as local):
        progress(f"work directory {workdir}, local directory {local}")
        result["params"]["filesystems"] = {"work": _filesystem(workdir),
                                           "local": _filesystem(local)}
        gen = torch.Generator(device=device).manual_seed(opts.seed)
        sd = build_state_dict(torch, layout, device, gen)
        synchronize(torch, device)
        cluster = Cluster(workdir, opts.up_args)
        try:
            cluster.start()
            folder = cluster.cluster.mountpoint / "ckpt"
            folder.mkdir()
            result["warmup_write_s"] = {
                "local": warm_up(local / WARMUP_NAME, write=True),
                "mosafs": warm_up(cluster.cluster.mountpoint / WARMUP_NAME, write=True)}
            result["steps"] = [
                _step(torch, step, sd, layout, gen, opts, device, folder, local, cluster)
                for step in range(1, opts.steps + 1)]
            last = f"model.0.{opts.steps}.pt"
            result["loads"] = _loads(torch, sd, device, local / last, folder / last, cluster,
                                     result["notes"])
        finally:
            cluster.stop()
        result["targets"] = verdicts([r["local_s"] for r in result["steps"]],
                                     [r["mosafs_s"] for r in result["steps"]])
        result["processes"] = _check_all_stopped()
        result["elapsed_s"] = round(time.perf_counter() - started, 1)
        result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        if opts.keep is not None:
            (workdir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _step(torch: Any, step: int, sd: dict[str, Any], layout: list[TensorSpec], gen: Any,
          opts: Options, device: str, folder: Path, local: Path,
          cluster: Cluster) -> dict[str, Any]:
    changed = list(range(len(layout)))  # step 1: everything is new to both
    if step > 1:
        changed = changed_tensors(layout, opts.changed, step_rng(opts.seed, step))
        rewrite(sd, [layout[i].name for i in changed], gen)
    name = f"model.0.{step}.pt"
    # Alternate which save goes first: neither always meets the other's writeback.
    order = ("local", "mosafs") if step % 2 else ("mosafs", "local")
    seconds: dict[str, float] = {}
    cpu: dict[str, dict[str, Any]] = {}
    for where in order:
        path = local / name if where == "local" else folder / name
        pids: Callable[[], dict[str, int]] = (
            (lambda: {}) if where == "local" else cluster.cluster.pids)
        with CpuMeter(pids) as meter:
            seconds[where] = timed_save(torch, sd, path, device)
        cpu[where] = meter.result
        os.sync()  # untimed: no dirty page of this save is written back during the next
    size = os.stat(local / name).st_size
    changed_bytes = sum(layout[i].nbytes for i in changed)
    row: dict[str, Any] = {
        "step": step, "name": name, "file_bytes": size, "order": list(order),
        "changed_tensors": len(changed), "changed_bytes": changed_bytes,
        "changed_fraction": round(changed_bytes / sum(s.nbytes for s in layout), 4),
        "local_s": round(seconds["local"], 3), "mosafs_s": round(seconds["mosafs"], 3),
        "ratio": ratio(seconds["mosafs"], seconds["local"]),
        "local_mb_s": round(size / seconds["local"] / 1e6, 1),
        "mosafs_mb_s": round(size / seconds["mosafs"] / 1e6, 1),
        "local_cpu": cpu["local"],
        "mosafs_cpu": {**cpu["mosafs"], "cluster_cpu_s": round(sum(
            v for k, v in cpu["mosafs"]["cpu_s"].items() if k != "bench"), 2)},
    }
    row.update(_stored(cluster, folder / name))
    progress(f"step {step}: local {seconds['local']:.2f}s, mosafs {seconds['mosafs']:.2f}s "
             f"(ratio {_num(row['ratio'])}, {len(changed)} tensors changed)")
    return row


def _stored(cluster: Cluster, path: Path) -> dict[str, Any]:
    """What mosafs stored new for PATH's version, and the share of the file it found stored
    already (its stats' shared_chunks count only chunks shared with an earlier version of
    the same file: 0 for a new file every step). An error is noted, not fatal: the timing
    is what counts."""
    try:
        s = cluster.version_stats(path)
    except MosafsError as exc:
        return {"stats_error": exc.message}
    return {"stats": s, "new_bytes": s["new_bytes"],
            "deduped_fraction": round(1 - s["new_bytes"] / s["size"], 4)
            if s["size"] else None}


def _loads(torch: Any, sd: dict[str, Any], device: str, local: Path, mosafs: Path,
           cluster: Cluster, notes: list[str]) -> dict[str, Any]:
    """Cold loads (a restarted cluster, the page cache dropped before each), then warm ones
    (again, at once); each checked against SD, untimed."""
    cluster.stop()
    dropped = drop_caches()
    cluster.start()
    out_warmup = warm_up(cluster.cluster.mountpoint / WARMUP_NAME, write=False)
    if not dropped:
        notes.append("the page cache could not be dropped (not root): the cold loads are "
                     "cold for the client's chunk cache only")
    out: dict[str, Any] = {"file": mosafs.name, "page_cache_dropped": dropped,
                           "warmup_read_s": out_warmup}
    for kind in ("cold", "warm"):
        got: dict[str, Any] = {}
        for where, path in (("local", local), ("mosafs", mosafs)):
            if kind == "cold":
                drop_caches()
            pids: Callable[[], dict[str, int]] = (
                (lambda: {}) if where == "local" else cluster.cluster.pids)
            with CpuMeter(pids) as meter:
                seconds, loaded = timed_load(torch, path, device)
            check_equal(torch, loaded, sd, path)
            del loaded
            gc.collect()
            got[f"{where}_s"] = round(seconds, 3)
            got[f"{where}_cpu"] = meter.result
            progress(f"load {kind} from {where}: {seconds:.2f}s")
        got["ratio"] = ratio(got["mosafs_s"], got["local_s"])
        out[kind] = got
    out["verified"] = True  # check_equal raised otherwise
    return out


# -- context ----------------------------------------------------------------------------------

def _torch_info(torch: Any, device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _git_info() -> dict[str, Any]:
    # `git status` may refresh the index (a lock): never while others commit in this tree.
    os.environ.setdefault("GIT_OPTIONAL_LOCKS", "0")
    return git_info()


def _size_histogram(layout: list[TensorSpec]) -> dict[str, int]:
    """How many tensors of each size class: what the chunks see."""
    out: dict[str, int] = {}
    for s in layout:
        key = ("< 1 MiB" if s.nbytes < MiB else
               f"{s.nbytes // MiB} MiB {s.dtype}" if s.nbytes % MiB == 0 else "other")
        out[key] = out.get(key, 0) + 1
    return out


def _filesystem(path: Path) -> dict[str, str]:
    """The mount holding PATH (/proc/self/mountinfo): the local figures mean little on a
    tmpfs."""
    best: dict[str, str] = {}
    target = str(path.resolve())
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            mount = fields[4]
            rest = fields[fields.index("-") + 1:]
            inside = target == mount or target.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best.get("mount", "")):
                best = {"mount": mount, "fstype": rest[0], "source": rest[1]}
    return best


@contextlib.contextmanager
def _local_dir(parent: Path | None, workdir: Path, *, keep: bool) -> Iterator[Path]:
    """The local disk's checkpoints: WORKDIR/local by default (the same disk as the cluster's
    data), else a new directory in PARENT, removed afterwards unless --keep."""
    if parent is None:
        local = workdir / "local"
        local.mkdir()
        yield local
        return
    parent.mkdir(parents=True, exist_ok=True)
    local = Path(tempfile.mkdtemp(prefix="mosafs-torch-local-", dir=parent))
    try:
        yield local
    finally:
        if not keep:
            shutil.rmtree(local, ignore_errors=True)


# -- the command line -------------------------------------------------------------------------

def parse_args(argv: list[str]) -> Options:
    parser = argparse.ArgumentParser(prog="torch_checkpoint.py",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024,
                        help="bytes of the state dict, in MiB (default 1024)")
    parser.add_argument("--steps", type=int, default=5, help="checkpoints saved (default 5)")
    parser.add_argument("--changed", type=float, default=0.10,
                        help="fraction of the state dict's bytes rewritten each step "
                             "(default 0.10)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None,
                        help="where the tensors live (default: cuda when there is one)")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="work directory to keep (data, logs, checkpoints, result.json)")
    parser.add_argument("--up-arg", action="append", default=[], metavar="ARG",
                        help="passed to `mosafs up` (repeatable), e.g. "
                             "--up-arg=--hash-backend=gpu")
    parser.add_argument("--local-dir", type=Path, metavar="DIR",
                        help="where the local-disk saves go (default: beside the cluster's "
                             "data in the work directory)")
    parser.add_argument("--seed", type=int, default=0, help="content and subsets (default 0)")
    args = parser.parse_args(argv)
    if args.size_mib < 1 or args.steps < 1:
        parser.error("--size-mib and --steps must be at least 1")
    if not 0.0 <= args.changed <= 1.0:
        parser.error("--changed must be between 0 and 1")
    return Options(size=args.size_mib * MiB, steps=args.steps, changed=args.changed,
                   device=args.device, keep=args.keep, up_args=args.up_arg,
                   local_dir=args.local_dir, seed=args.seed)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    opts = parse_args(argv)
    try:
        result = run(opts, shlex.join(["benchmarks/torch_checkpoint.py", *argv]))
    except MosafsError as exc:  # a process that did not start, a load that read back wrong
        hint = "" if opts.keep else " (the work directory is gone: --keep DIR keeps its logs)"
        print(f"torch_checkpoint.py: {exc.message}{hint}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: everything was stopped on the way
        print("torch_checkpoint.py: interrupted", file=sys.stderr)
        return 130
    print(format_table(result), file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
