"""The rank processes of the distributed-checkpoint tests (tests/fuse/test_fuse_checkpoint_dcp.py,
tests/gpu/test_gpu_checkpoint_dcp.py), and how the tests start them.

`python -m tests.dcp_ranks PHASE FOLDER --rank R --world N --port P --device D --out JSON`
joins a gloo process group on 127.0.0.1:P and, with MosafsStorageWriter/Reader on FOLDER:

- `save`: saves `rank_state` (dcp.save);
- `reload`: loads into a zeroed state dict and checks it, saves `rank_state` again, then
  loads and checks once more.

Each check's result goes to JSON ({"rank", "checked": [names], "bad": [names]}); an
exception is a traceback on stderr and exit status 1. Every rank's state dict holds
tensors replicated on all ranks (a 0-d one, bfloat16, int64), a tensor only rank R has
(`rank<R>.weight`: each rank's file carries data of its own; `rank<R>.tied` is the same
tensor under another name), a DTensor sharded over the
ranks (each rank writes its shard) and values that are not tensors (DCP's BYTE_IO items).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from mosafs.procutil import free_port
from tests.harness import NOISE

ROOT = Path(__file__).resolve().parent.parent
EXTRA = {"step": 42, "name": "mosafs", "lrs": [0.1, 0.01], "betas": (0.9, 0.999)}
ZERO_EXTRA = {"step": 0, "name": "", "lrs": [], "betas": ()}
# gloo's connection notices: C++ log lines on stderr, not noise.
GLOO_INFO = re.compile(r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks")


def full_tensors(world: int) -> dict[str, Any]:
    """Every tensor of the checkpoint, whole, on the CPU: the same in every process."""
    import torch

    gen = torch.Generator().manual_seed(1234)
    out = {
        "model.replicated": torch.randn(256, 256, generator=gen),
        "model.scale": torch.tensor(3.5),
        "model.ids": torch.arange(1000, dtype=torch.int64) * 7,
        "model.half": torch.randn(300, generator=gen).to(torch.bfloat16),
        "model.sharded": torch.randn(256 * world, 512, generator=gen),
    }
    for rank in range(world):
        out[f"rank{rank}.weight"] = torch.randn(256, 512, generator=gen) + rank
    return out


def rank_state(rank: int, world: int, device: str, mesh: Any, zero: bool = False
               ) -> dict[str, Any]:
    """Rank RANK's state dict (zeros where ZERO: what a load fills in)."""
    import torch
    from torch.distributed.tensor import DTensor, Shard

    full = full_tensors(world)

    def value(name: str) -> Any:
        t = full[name]
        if name == "model.sharded":
            t = t.chunk(world)[rank]
        t = (torch.zeros_like(t) if zero else t.clone()).to(device)
        if name == "model.sharded":
            return DTensor.from_local(t, mesh, [Shard(0)], run_check=False)
        return t

    model = {name.split(".", 1)[1]: value(name) for name in full if name.startswith("model.")}
    own = value(f"rank{rank}.weight")
    # "tied": the same tensor under a second name (tied weights), saved once per name.
    tied = value(f"rank{rank}.weight") if zero else own
    return {"model": model, f"rank{rank}": {"weight": own, "tied": tied},
            "extra": dict(ZERO_EXTRA if zero else EXTRA)}


def compare(got: dict[str, Any], want: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(every leaf name, the leaves that differ in value, dtype, device or type)."""
    import torch
    from torch.distributed.tensor import DTensor

    checked, bad = [], []
    for top, part in want.items():
        for name, expected in part.items():
            key = f"{top}.{name}"
            checked.append(key)
            found = got.get(top, {}).get(name)
            if isinstance(expected, DTensor):
                ok = isinstance(found, DTensor) and torch.equal(found.to_local(),
                                                                expected.to_local())
            elif isinstance(expected, torch.Tensor):
                ok = (isinstance(found, torch.Tensor) and found.device == expected.device
                      and found.dtype == expected.dtype and torch.equal(found, expected))
            else:
                ok = type(found) is type(expected) and found == expected
            if not ok:
                bad.append(key)
    return checked, bad


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["save", "reload"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    from mosafs.checkpoint.cluster import close_all
    from mosafs.checkpoint.torch import MosafsStorageReader, MosafsStorageWriter

    kind = torch.device(args.device).type
    if kind == "cuda":
        torch.cuda.set_device(args.device)  # every rank on the same GPU: gloo, not NCCL
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=args.rank, world_size=args.world,
                            timeout=timedelta(seconds=60))
    try:
        mesh = init_device_mesh(kind, (args.world,))
        state = rank_state(args.rank, args.world, args.device, mesh)
        report: dict[str, Any] = {"rank": args.rank, "checks": []}

        def load_and_check() -> None:
            fresh = rank_state(args.rank, args.world, args.device, mesh, zero=True)
            dcp.load(fresh, storage_reader=MosafsStorageReader(args.folder))
            checked, bad = compare(fresh, state)
            report["checks"].append({"checked": checked, "bad": bad})

        if args.phase == "reload":
            load_and_check()
        dcp.save(state, storage_writer=MosafsStorageWriter(args.folder))
        if args.phase == "reload":
            load_and_check()
        args.out.write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()
        close_all()


# The test's side.

def run_ranks(phase: str, folder: Path, workdir: Path, *, device: str = "cpu",
              world: int = 2, timeout: float = 120) -> list[dict[str, Any]]:
    """Run PHASE in WORLD rank processes to the end (killed past TIMEOUT seconds); their
    reports. Each must exit 0 with nothing on stderr but gloo's connection notices."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONUNBUFFERED": "1"}
    procs = []
    try:
        for rank in range(world):
            with open(workdir / f"rank{rank}.log", "wb") as sink:
                procs.append(subprocess.Popen(
                    [sys.executable, "-W", "error", "-m", "tests.dcp_ranks", phase,
                     str(folder), "--rank", str(rank), "--world", str(world), "--port",
                     str(port), "--device", device, "--out", str(workdir / f"rank{rank}.json")],
                    cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    reports = []
    for rank, proc in enumerate(procs):
        log = (workdir / f"rank{rank}.log").read_text(errors="replace")
        assert proc.returncode == 0, f"rank {rank} of {phase} exited {proc.returncode}:\n{log}"
        noise = [line for line in log.splitlines()
                 if line.strip() and not GLOO_INFO.search(line)]
        assert not noise, f"rank {rank} of {phase} printed:\n{log}"
        assert not NOISE.search(log)
        reports.append(json.loads((workdir / f"rank{rank}.json").read_text()))
    return reports


if __name__ == "__main__":
    main()
