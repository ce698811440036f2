"""Measurements of the GPU runtime's pieces for `mosafs bench hash`: pinned copy bandwidth
and each kernel alone (benchmark code, kept apart from mosafs.chunking.gpu_runtime, whose
internals it drives). Imports CuPy at module import, like the runtime."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from mosafs.chunking.gpu_runtime import (
    ALIGN,
    D2H,
    H2D,
    HIST,
    READ_SLACK,
    DevArray,
    GpuRuntime,
    HostArray,
    cupy,
    digests,
    launch_candidates,
    launch_hash,
    runtime,
)
from mosafs.chunking.gpu_select import select_cuts, tree_plan
from mosafs.chunking.spec import ChunkerSpec


def bench_copy(nbytes: int, reps: int, devices: Sequence[int] | None = None) -> dict[str, Any]:
    """Pinned host <-> device copy bandwidth (GB/s): each device alone (median of reps,
    timed with events), and every device at once (wall clock, host-synchronized)."""
    ids = list(range(int(cupy.cuda.runtime.getDeviceCount()))) if devices is None \
        else list(devices)
    bufs = []
    for i in ids:
        with cupy.cuda.Device(i):
            mem = cupy.cuda.alloc_pinned_memory(nbytes)
            host = np.frombuffer(mem, dtype=np.uint8, count=nbytes)
            host[::4096] = 1  # touch every page
            dev = cupy.empty(nbytes, dtype=cupy.uint8)
            bufs.append((i, mem, host, dev, cupy.cuda.Stream(non_blocking=True)))
    per: list[dict[str, Any]] = []
    for i, _mem, host, dev, stream in bufs:
        cupy.cuda.runtime.setDevice(i)
        row: dict[str, Any] = {"device": i}
        for name, kind, dst, src in (("h2d_GBps", H2D, int(dev.data.ptr), int(host.ctypes.data)),
                                     ("d2h_GBps", D2H, int(host.ctypes.data), int(dev.data.ptr))):
            times = []
            for _ in range(reps + 1):
                a, b = cupy.cuda.Event(), cupy.cuda.Event()
                a.record(stream)
                cupy.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, stream.ptr)
                b.record(stream)
                b.synchronize()
                times.append(cupy.cuda.get_elapsed_time(a, b) / 1e3)
            row[name] = round(nbytes / float(np.median(times[1:])) / 1e9, 2)
        per.append(row)
    result: dict[str, Any] = {"bytes": nbytes, "per_device": per}
    if len(bufs) > 1:
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            for i, _mem, host, dev, stream in bufs:
                cupy.cuda.runtime.setDevice(i)
                cupy.cuda.runtime.memcpyAsync(int(dev.data.ptr), int(host.ctypes.data), nbytes,
                                              H2D, stream.ptr)
            for _i, _mem, _host, _dev, stream in bufs:
                stream.synchronize()
            times.append(time.perf_counter() - t)
        result["all_devices_h2d_GBps"] = round(len(bufs) * nbytes / float(np.median(times)) / 1e9,
                                               2)
    return result


def bench_kernels(spec: ChunkerSpec, nbytes: int, reps: int, seed: int = 1) -> dict[str, Any]:
    """The kernels with the data already on device 0 (random bytes, one buffer of nbytes):
    candidate kernel, selection on the host (candidates out, sort, select, tree plan),
    BLAKE3 kernels, and the whole sequence; GB/s over nbytes, medians of reps. Checks a
    sample of the ids against the blake3 package."""
    import blake3

    if nbytes >= 1 << 31:
        raise ValueError("bench_kernels: at most 2 GiB - 1 in one buffer")
    rt = runtime()
    slot = rt.acquire(0)
    try:
        dev = slot.device
        dev.activate()
        host = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
        buf = cupy.empty(ALIGN + nbytes + READ_SLACK, dtype=cupy.uint8)
        buf[ALIGN:ALIGN + nbytes].set(host)
        cupy.cuda.runtime.deviceSynchronize()
        base = int(buf.data.ptr) + ALIGN
        cap = nbytes // 16 + 4096
        out = cupy.empty(1 + cap, dtype=cupy.uint32)
        want = min(cap, 2 * nbytes // max(1, spec.avg_size // 4) + 4096)
        host_c = HostArray(np.uint32, 1 + want)
        stream = slot.stream

        def timed(fn: Any) -> float:
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            a.record(stream)
            fn()
            b.record(stream)
            b.synchronize()
            return float(cupy.cuda.get_elapsed_time(a, b)) / 1e3

        def candidates() -> None:
            if spec.kind == "cdc":
                launch_candidates(slot, base, 0, 0, nbytes, 0, spec, int(out.data.ptr), cap)

        stages: dict[str, list[float]] = {
            "candidate_kernel": [], "selection": [], "hash_kernel": [], "total": [],
            "selection.candidates_out": [], "selection.select": [], "selection.plan": []}
        nchunks = 0
        ids: list[bytes] = []
        starts: list[int] = []
        cuts: list[int] = []
        for rep in range(reps + 1):
            t0 = time.perf_counter()
            tc = timed(candidates)
            t1 = time.perf_counter()
            if spec.kind == "cdc":
                cupy.cuda.runtime.memcpy(host_c.ptr, int(out.data.ptr), 4 * (1 + want), D2H)
                count = int(host_c.array[0])
                if count > want:
                    raise RuntimeError("bench_kernels: more candidates than random data has")
                cands = np.sort(host_c.array[1:1 + count])
            else:
                cands = np.zeros(0, dtype=np.uint32)
            t1a = time.perf_counter()
            cuts, _ = select_cuts(cands, nbytes, 0, spec, True)
            t1b = time.perf_counter()
            starts = [0, *cuts[:-1]]
            offs = np.array(starts, dtype=np.int64)
            plan = tree_plan(offs, np.array(cuts, dtype=np.int64) - offs)
            t2 = time.perf_counter()
            th = timed(lambda plan=plan: launch_hash(slot, base, plan))
            t3 = time.perf_counter()
            nchunks = len(cuts)
            if rep == 0:
                ids = digests(slot, nchunks)
                continue  # warm-up
            stages["candidate_kernel"].append(tc)
            stages["selection"].append(t2 - t1)
            stages["selection.candidates_out"].append(t1a - t1)
            stages["selection.select"].append(t1b - t1a)
            stages["selection.plan"].append(t2 - t1b)
            stages["hash_kernel"].append(th)
            stages["total"].append(t3 - t0)
        med = {k: float(np.median(v)) for k, v in stages.items()}
        sample = sorted({0, nchunks // 2, nchunks - 1})
        checked = all(ids[i] == blake3.blake3(host[starts[i]:cuts[i]].tobytes()).digest()
                      for i in sample)
        pipelined, same = _bench_pipelined(rt, spec, base, nbytes, reps, ids)
        med["total_pipelined"] = pipelined
        return {
            "spec": str(spec), "bytes": nbytes, "chunks": nchunks, "device": dev.name,
            "GBps": {k: round(nbytes / v / 1e9, 1) if v > 0 else None for k, v in med.items()},
            "seconds": {k: round(v, 6) for k, v in med.items()},
            "ids_checked": checked and same,
            "note": "selection = candidates to host + sort + select + tree plan (host); "
                    "hash_kernel includes the plan's and digests' copies (a few KiB); "
                    "total = the whole sequence on one buffer, host-synchronized; "
                    f"total_pipelined = the same buffer as {_PARTS} parts on their own "
                    "streams, the host selecting one part while the GPU runs the others "
                    "(as the runtime overlaps buffers)",
        }
    finally:
        rt.release(slot)


_PARTS = 4


def _bench_pipelined(rt: GpuRuntime, spec: ChunkerSpec, base: int, nbytes: int, reps: int,
                     want: list[bytes]) -> tuple[float, bool]:
    """Median seconds to chunk and hash device bytes [base, base + nbytes) as _PARTS parts
    in flight at once; and whether the ids equal `want` (the one-buffer run's)."""
    slots = [rt.acquire(0) for _ in range(_PARTS)]
    try:
        bounds = [(i * nbytes // _PARTS) & ~63 for i in range(_PARTS)] + [nbytes]
        caps = [(b - a) // 16 + 4096 for a, b in itertools.pairwise(bounds)]
        wants = [min(c, 2 * (b - a) // max(1, spec.avg_size // 4) + 4096)
                 for c, (a, b) in zip(caps, itertools.pairwise(bounds), strict=True)]
        outs = [DevArray(np.uint32, 1 + c) for c in caps]
        hosts = [HostArray(np.uint32, 1 + w) for w in wants]
        times = []
        same = True
        for rep in range(reps + 1):
            t0 = time.perf_counter()
            for i, slot in enumerate(slots):
                slot.device.activate()
                if spec.kind == "cdc":
                    launch_candidates(slot, base, 0, bounds[i], bounds[i + 1],
                                      min(HIST, bounds[i] & ~63), spec, outs[i].ptr, caps[i])
                    cupy.cuda.runtime.memcpyAsync(hosts[i].ptr, outs[i].ptr, 4 * (1 + wants[i]),
                                                  D2H, slot.stream.ptr)
                slot.cand_ev.record(slot.stream)
            start = 0
            counts = []
            for i, slot in enumerate(slots):
                slot.cand_ev.synchronize()
                cands = np.zeros(0, dtype=np.uint32)
                if spec.kind == "cdc":
                    count = int(hosts[i].array[0])
                    if count > wants[i]:
                        raise RuntimeError("bench_kernels: more candidates than random data has")
                    cands = np.sort(hosts[i].array[1:1 + count])
                first = start
                cuts, start = select_cuts(cands, bounds[i + 1], start, spec, i == _PARTS - 1)
                counts.append(len(cuts))
                if cuts:
                    offs = np.array([first, *cuts[:-1]], dtype=np.int64)
                    launch_hash(slot, base, tree_plan(offs, np.array(cuts, dtype=np.int64) - offs))
            for i, slot in enumerate(slots):
                if counts[i]:
                    slot.hash_ev.synchronize()
            seconds = time.perf_counter() - t0
            got = [d for i, slot in enumerate(slots) for d in digests(slot, counts[i])]
            same = same and got == want
            if rep:
                times.append(seconds)
        return float(np.median(times)), same
    finally:
        for slot in slots:
            rt.release(slot)
