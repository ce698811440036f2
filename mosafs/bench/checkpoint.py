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
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mosafs.bench import write
from mosafs.bench.checkpoint_plan import (
    ISSUE_CHANGED,
    ISSUE_SIZE,
    WARMUP_BYTES,
    MiB,
    TensorPlan,
    changed_tensors,
    file_order,
    num,
    plan_state,
    ratio,
    step_kinds,
    step_rng,
    verdicts,
)
from mosafs.bench.procs import BenchError
from mosafs.bench.timing import quiet_disks
from mosafs.bench.write import _Mosafs, progress

# Before each timed save, the longest wait for the machine's disks to go idle, so that no
# save pays for I/O the step or the run before it left (a deleted work directory); the
# JSON records each wait (docs/benchmarks.md, "Disks idle before each timed save").
QUIET_S = 10.0
# -- torch ------------------------------------------------------------------------------------

def optional_import(what: str) -> Any:
    """The module WHAT, or a BenchError naming what to install."""
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
    torch = optional_import("torch")
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
             f"{num(row['save_blocking_s'])}s (total {row['total_s']:.3f}s, "
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

    st = optional_import("safetensors.torch")
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
            "safetensors": optional_import("safetensors").__version__,
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
