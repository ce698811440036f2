"""`mosafs bench ec --parts devices`: chunking + BLAKE3 + `ec:K+M` parity end to end from
pinned host memory (the figure `gpu.end_to_end` of mosafs.bench.ec_coders) on one GPU and
on every visible GPU at once.

Arrangements, each measured with one worker on GPU 0 and with one worker per GPU:

* `process_per_gpu`: a process per GPU (`CUDA_VISIBLE_DEVICES` set to its GPU), each with
  its own runtime and stream, as the ranks of a training job each run their own
  `mosafs.checkpoint` or mount;
* `thread_per_gpu`: one process, a thread per GPU, each with a runtime of its GPU and a
  stream, as one mount writing several files at once;
* `one_stream`: one process, one stream over a runtime of every GPU (its buffers
  round-robin over the devices), as one mount writing one file;
* `hash_only_process_per_gpu`: as `process_per_gpu` without parity (chunking and
  BLAKE3 alone): what the parity's copy back costs the scaling.

A worker warms up (kernels built, parity blocks allocated) with one full-size run, then
runs REPS rounds; every round starts at a barrier, and its aggregate rate is all workers'
bytes over the time from the first worker's start to the last one's end. The median round
is the figure; `scaling` is the N-GPU figure over the one-GPU figure of the same
arrangement (the issue's target: at least 1.8 with two GPUs). `h2d` is the host-to-device
copy bandwidth of each GPU alone and of all at once; `copy_in_and_parity_out` the same
with the 4+2 traffic, M/K of every byte copied in copied back out at the same time, on
one GPU and on all: the ceiling the end-to-end figures run against.

Importing this module is light; CuPy is loaded by the workers.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queues
import statistics
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from mosafs.bench.procs import BenchError
from mosafs.bench.workers import collect, running

MiB = 1 << 20
GiB = 1 << 30
TARGET_SCALING = 1.8       # N GPUs over one, for two GPUs (issue 23)
BARRIER_TIMEOUT_S = 600.0  # a worker that never arrives (it failed) ends the run
EC_MIN_CHUNK = 128 * 1024  # the pools' default threshold: smaller chunks are copies


def gpu_count() -> int:
    """GPUs CuPy sees here; ConfigError (exit code 2) where it cannot run: never a CPU
    figure in a GPU's place."""
    from mosafs.chunking.gpu import gpu_unavailable_reason
    from mosafs.errors import ConfigError

    reason = gpu_unavailable_reason()
    if reason:
        raise ConfigError(f"the devices part needs a GPU: {reason}")
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


# -- one worker: a stream over its pinned buffers, REPS timed rounds ----------------------

def _chunker(devices: list[int], seed: int) -> Any:
    from mosafs.bench.hash import _prefill
    from mosafs.chunking import DEFAULT_SPEC, gpu_runtime, parse_spec
    from mosafs.chunking.gpu import GpuChunker

    spec = parse_spec(DEFAULT_SPEC)
    rt = gpu_runtime.GpuRuntime(gpu_runtime.runtime_for(spec).buffer_size, devices=devices)
    chunker = GpuChunker(spec, rt)
    _prefill(chunker, seed)
    return chunker


def _work(devices: list[int], seed: int, total: int, reps: int,
          parity: tuple[int, int, int] | None, wait: Callable[[], Any],
          put: Callable[[Any], None]) -> None:
    """Warm up, then REPS rounds, each after WAIT(); PUT(('round', i, start, end, bytes,
    chunks)) per round, then PUT(('done',)). Monotonic clocks are the host's: comparable
    between processes."""
    from mosafs.bench.ec_coders import _stream_run

    chunker = _chunker(devices, seed)
    _stream_run(chunker, total, parity)
    for i in range(reps):
        wait()
        start = time.monotonic()
        run = _stream_run(chunker, total, parity)
        end = time.monotonic()
        put(("round", i, start, end, total, run["chunks"], run.get("coded_chunks", 0)))
    put(("done",))


def _process_main(visible: int, seed: int, total: int, reps: int,
                  parity: tuple[int, int, int] | None, barrier: Any, out: Any) -> None:
    """A process worker: only GPU VISIBLE is visible to it (set before CuPy loads)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(visible)
    try:
        _work([0], seed, total, reps, parity, lambda: barrier.wait(BARRIER_TIMEOUT_S),
              out.put)
    except BaseException:  # reported to the parent, which fails the arrangement
        out.put(("error", traceback.format_exc(limit=8)))
        barrier.abort()


# -- arrangements -----------------------------------------------------------------------

def _collect(out: Any, workers: int, reps: int, alive: Callable[[], bool]) -> list[float]:
    """Per round, the aggregate GB/s; BenchError with a worker's traceback if one failed."""
    rounds: dict[int, list[tuple[float, float, int]]] = {}
    for _, i, start, end, nbytes, *_rest in collect(out, workers, alive):
        rounds.setdefault(i, []).append((start, end, nbytes))
    rates = []
    for i in range(reps):
        got = rounds.get(i, [])
        if len(got) != workers:
            raise BenchError(f"round {i}: {len(got)} of {workers} workers reported")
        span = max(e for _, e, _ in got) - min(s for s, _, _ in got)
        rates.append(sum(n for _, _, n in got) / span / 1e9)
    return rates


def _processes(gpus: list[int], total: int, reps: int,
               parity: tuple[int, int, int] | None) -> list[float]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(gpus))
    out = ctx.Queue()
    procs = [ctx.Process(target=_process_main, daemon=True,
                         args=(g, 11 + n, total, reps, parity, barrier, out))
             for n, g in enumerate(gpus)]
    with running(procs, 30) as alive:
        return _collect(out, len(procs), reps, alive)


def _threads(lanes: list[list[int]], total: int, reps: int,
             parity: tuple[int, int, int] | None) -> list[float]:
    """A thread per entry of LANES, each a runtime over those devices."""
    barrier = threading.Barrier(len(lanes))
    out: queues.Queue[Any] = queues.Queue()

    def main(devices: list[int], seed: int) -> None:
        try:
            _work(devices, seed, total, reps, parity, lambda: barrier.wait(BARRIER_TIMEOUT_S),
                  out.put)
        except BaseException:
            out.put(("error", traceback.format_exc(limit=8)))
            barrier.abort()

    threads = [threading.Thread(target=main, args=(d, 11 + n), daemon=True)
               for n, d in enumerate(lanes)]
    for t in threads:
        t.start()
    try:
        return _collect(out, len(threads), reps, lambda: any(t.is_alive() for t in threads))
    finally:
        for t in threads:
            t.join(timeout=60)


def _figure(rates: list[float]) -> dict[str, Any]:
    return {"median_GBps": round(statistics.median(rates), 2),
            "rounds_GBps": [round(r, 2) for r in rates]}


def _arrangement(name: str, gpus: int, run: Callable[[int], list[float]]) -> dict[str, Any]:
    """One GPU and every GPU of one arrangement; an error is the arrangement's result."""
    out: dict[str, Any] = {}
    try:
        out["one_gpu"] = _figure(run(1))
        out["all_gpus"] = _figure(run(gpus))
    except BenchError as exc:
        out["error"] = exc.message
        return out
    out["scaling"] = round(out["all_gpus"]["median_GBps"] / out["one_gpu"]["median_GBps"], 3)
    return out


def run_devices(*, k: int = 4, m: int = 2, total: int = 32 * GiB, reps: int = 5,
                arrangements: tuple[str, ...] = ("process_per_gpu", "thread_per_gpu",
                                                 "one_stream", "hash_only_process_per_gpu"),
                ) -> dict[str, Any]:
    """Every arrangement asked for, on every visible GPU; the module docstring's figures."""
    gpus = gpu_count()
    parity = (k, m, EC_MIN_CHUNK)
    result: dict[str, Any] = {"gpus": gpus, "shape": f"{k}+{m}", "bytes_per_worker": total,
                              "reps": reps, "min_chunk": EC_MIN_CHUNK,
                              "units": "GB/s = 10^9 bytes of input per second, aggregate"}
    if gpus < 2:
        result["note"] = "one GPU visible: no N-GPU figure to compare"
    # Processes first: the parent has not touched CUDA yet (spawned children would not
    # mind, but its pinned pools would take the host's memory from them).
    runners: dict[str, Callable[[int], list[float]]] = {
        "process_per_gpu": lambda n: _processes(list(range(n)), total, reps, parity),
        "thread_per_gpu": lambda n: _threads([[i] for i in range(n)], total, reps, parity),
        "one_stream": lambda n: _threads([list(range(n))], total, reps, parity),
        "hash_only_process_per_gpu": lambda n: _processes(list(range(n)), total, reps, None),
    }
    for name in arrangements:
        if name not in runners:
            raise BenchError(f"unknown arrangement {name!r}: one of {', '.join(runners)}")
        result[name] = _arrangement(name, gpus, runners[name])
    result["h2d"] = _h2d()
    result["copy_in_and_parity_out"] = {
        "one_gpu_GBps": round(_copy_both_ways([0], 512 * MiB, m / k, 7), 2),
        "all_gpus_GBps": round(_copy_both_ways(list(range(gpus)), 512 * MiB, m / k, 7), 2),
        "units": "GB/s of bytes copied in (host to device), with M/K of them copied out "
                 "at the same time"}
    return result


def _h2d() -> dict[str, Any]:
    from mosafs.bench.gpu_kernels import bench_copy

    copy = bench_copy(256 * MiB, 9)
    return {"per_gpu_GBps": [d["h2d_GBps"] for d in copy["per_device"]],
            "all_gpus_GBps": copy.get("all_devices_h2d_GBps")}


def _copy_both_ways(gpus: list[int], nbytes: int, back: float, reps: int) -> float:
    """GB/s of NBYTES copied in to every GPU of GPUS while BACK x NBYTES is copied out of
    each, all at once (pinned host buffers, a stream per direction and GPU); median."""
    import cupy
    import numpy as np

    out_bytes = int(nbytes * back)
    lanes = []
    for i in gpus:
        with cupy.cuda.Device(i):
            src = np.frombuffer(cupy.cuda.alloc_pinned_memory(nbytes), np.uint8, nbytes)
            dst = np.frombuffer(cupy.cuda.alloc_pinned_memory(out_bytes), np.uint8,
                                out_bytes)
            src[::4096] = 1
            dst[::4096] = 1
            lanes.append((i, src, dst, cupy.empty(nbytes, cupy.uint8),
                          cupy.empty(out_bytes, cupy.uint8),
                          cupy.cuda.Stream(non_blocking=True),
                          cupy.cuda.Stream(non_blocking=True)))
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        for i, src, dst, dev_in, dev_out, s_in, s_out in lanes:
            cupy.cuda.runtime.setDevice(i)
            cupy.cuda.runtime.memcpyAsync(int(dev_in.data.ptr), int(src.ctypes.data), nbytes,
                                          cupy.cuda.runtime.memcpyHostToDevice, s_in.ptr)
            cupy.cuda.runtime.memcpyAsync(int(dst.ctypes.data), int(dev_out.data.ptr),
                                          out_bytes, cupy.cuda.runtime.memcpyDeviceToHost,
                                          s_out.ptr)
        for lane in lanes:
            lane[5].synchronize()
            lane[6].synchronize()
        times.append(time.perf_counter() - start)
    return len(lanes) * nbytes / statistics.median(times[1:]) / 1e9


def verdict(devices: dict[str, Any]) -> dict[str, Any]:
    """The issue's target on the devices part, judged on `process_per_gpu` (a training
    job's ranks are processes, one per GPU); the other arrangements are reported beside
    it. None where fewer than two GPUs were measured."""
    if devices.get("gpus", 0) < 2:
        return {"value": None, "target": f">= {TARGET_SCALING}", "met": None,
                "note": "fewer than two GPUs"}
    rows = {name: row for name, row in devices.items()
            if isinstance(row, dict) and ("one_gpu" in row or "error" in row)}
    judged = {name: {"scaling": row.get("scaling"), "target": f">= {TARGET_SCALING}",
                     "met": row.get("scaling") is not None
                     and row["scaling"] >= TARGET_SCALING,
                     **({"error": row["error"]} if "error" in row else {})}
              for name, row in rows.items()}
    judged_on = judged.get("process_per_gpu", {})
    return {"value": judged_on.get("scaling"), "target": f">= {TARGET_SCALING}",
            "met": bool(judged_on.get("met")), "judged_on": "process_per_gpu",
            "arrangements": judged}
