"""The coder part of a future `mosafs bench ec`: erasure-coding speed of the coders
(DESIGN §10), in GB/s of chunk bytes (10^9 bytes of input per second), as one JSON-able
dict.

    from mosafs.bench.ec_coders import run_ec_coder_benchmark
    result = run_ec_coder_benchmark(quick=False)      # every figure below
    .venv/bin/python -m mosafs.bench.ec_coders [--quick] [--no-gpu] [--threads N]

Figures, for 4+2 and 8+2:

* isal (CPU, ctypes ISA-L): encode and decode of 1 MiB chunks on one thread, and on N
  threads at once (N = the CPUs this process may use; every call releases the GIL, so
  this is the all-cores figure); decode with 1 and with M data fragments lost (the
  arithmetic path; with none lost decode is a copy). Each figure is the best of
  `repeat` timed runs of `seconds` each.
* gpu (where one is usable), input already on the device, timed with CUDA events over
  `reps` calls after a warm-up. `kernel_*`: the kernels alone (launches prepared once
  with prepare_encode / prepare_rebuild, queued back to back): one 1 MiB chunk
  (launch-bound), a batch of B x 1 MiB chunks in one launch, the batch with the
  coefficients as kernel parameters instead of compiled in, one 64 MiB chunk, and the
  rebuild of 1 and of M data fragments of that chunk (decode's arithmetic; rated per
  byte of the chunk). `encode_device_*`, `decode_device_*`: the same through the API,
  host overhead per call included. `encode_to_host_batch`: the batch encoded and its
  parity copied back into pinned memory, wall clock. The batch's last chunk is checked
  against ISA-L (`verified`). `kernel_ragged_64MiB_GBps`: the GPU chunk stream's
  parity kernel alone (mosafs.erasure.gpu_batch): a 64 MiB buffer of chunks of random
  lengths (256 KiB to 4 MiB, as the default chunker cuts) at unaligned offsets, all in
  one launch, GB/s of the chunks' bytes.
* gpu.end_to_end: chunking + BLAKE3 + parity from pinned host memory, the figure of
  the issue's target (0.85 of the same run's host-to-device bandwidth, `over_h2d`, for
  4+2): a pipelined GPU stream of the default chunker over pinned buffers that already
  hold random data (`pinned_buffer()` + `feed_pinned_batch`, as mosafs.bench.hash's
  end-to-end figure), with the stream's parity stage (`parity=(K, M, 128 KiB)`: every
  chunk of at least the pools' default threshold coded, its parity copied back into
  pinned memory); chunk bounds, ids and parity out, no per-chunk bytes. The median of
  7 runs (`quick`: 2) after a full-size warm-up, for 4+2, 8+2 and without parity
  (`hash_only`), interleaved, over the H2D bandwidth (`h2d_GBps`: the higher of the
  measurements just before and just after, `h2d_before_GBps` and `h2d_after_GBps`: it
  drifts on a shared host); a profiled 4+2 run gives the stages' GPU times (they
  overlap). `verified`: a stream's parity equals ISA-L's for every chunk of 256 MiB
  (`quick`: 64 MiB).
* isal.gil_...: whether another Python thread runs during one long encode call
  (`gil_check`); isal.thread_scaling_...: 8+2 encode on one and on all threads for
  1, 4 and 16 MiB chunks (how much the per-call GIL hand-over costs).

Importing this module is light (numpy only); coders and CuPy are loaded when run.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import json
import os
import platform
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

MiB = 1 << 20
GiB = 1 << 30
SHAPES = ((4, 2), (8, 2))
CHUNK_BYTES = MiB
EC_MIN_CHUNK = 128 << 10
"""The pools' default threshold (mosafs.manager.pools.DEFAULT_EC_MIN_CHUNK): shorter
chunks are stored as copies, so the GPU stream codes only chunks of at least this."""
TARGET_E2E_OVER_H2D = 0.85


def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def random_bytes(nbytes: int, seed: int = 7) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes()


def _gbps(nbytes: float, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 3) if seconds > 0 else float("inf")


def best_rate(fn: Callable[[], Any], nbytes: int, *, seconds: float, repeat: int) -> float:
    """GB/s of NBYTES per call of FN: best of REPEAT runs of about SECONDS each."""
    fn()  # warm-up: tables, plans, first-touch of buffers
    best = 0.0
    for _ in range(repeat):
        calls = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            fn()
            calls += 1
            now = time.perf_counter()
            if now >= deadline:
                break
        best = max(best, _gbps(calls * nbytes, now - start))
    return best


def threaded_rate(make_fn: Callable[[], Callable[[], Any]], nbytes: int, threads: int, *,
                  seconds: float, repeat: int) -> float:
    """GB/s of NBYTES per call, all THREADS together: each calls its own make_fn() for
    SECONDS; best of REPEAT runs. Scales with the threads only if the calls drop the GIL."""
    fns = [make_fn() for _ in range(threads)]
    for fn in fns:
        fn()
    best = 0.0
    for _ in range(repeat):
        counts = [0] * threads
        barrier = threading.Barrier(threads + 1)
        deadline = [0.0]
        pool = [threading.Thread(target=_spin, args=(fn, barrier, deadline, counts, i))
                for i, fn in enumerate(fns)]
        for t in pool:
            t.start()
        deadline[0] = time.perf_counter() + seconds
        start = time.perf_counter()
        barrier.wait()
        for t in pool:
            t.join()
        best = max(best, _gbps(sum(counts) * nbytes, time.perf_counter() - start))
    return best


def _spin(fn: Callable[[], Any], barrier: threading.Barrier, deadline: list[float],
          counts: list[int], i: int) -> None:
    barrier.wait()
    while time.perf_counter() < deadline[0]:
        fn()
        counts[i] += 1


def gil_check(fn: Callable[[], Any], repeat: int = 5) -> dict[str, Any]:
    """Does FN (one long call, 10 ms or more) let other Python threads run meanwhile?
    This thread stamps the time at every turn of a loop while another thread makes the
    call. A call that holds the GIL stops this loop for its whole duration (the switch
    interval applies only between bytecodes); one that drops it leaves only the
    operating system's time slices as gaps. The smallest longest-gap of REPEAT calls
    tells, even on a machine whose cores are busy with other work."""
    fn()  # warm-up
    best: tuple[float, float] = (float("inf"), 0.0)
    for _ in range(repeat):
        stall, call_s = _longest_stall(fn)
        if stall / call_s < best[0] / max(best[1], 1e-9):
            best = (stall, call_s)
    stall, call_s = best
    return {"call_ms": round(call_s * 1e3, 2), "longest_stall_ms": round(stall * 1e3, 2),
            "gil_released": stall < 0.5 * call_s}


def _longest_stall(fn: Callable[[], Any]) -> tuple[float, float]:
    """(longest gap between this thread's loop turns during one call of FN made by
    another thread, the call's duration), in seconds."""
    span = [0.0, 0.0]

    def call() -> None:
        span[0] = time.perf_counter()
        fn()
        span[1] = time.perf_counter()

    stamps: list[float] = []
    worker = threading.Thread(target=call)
    worker.start()
    while worker.is_alive():
        stamps.append(time.perf_counter())
    worker.join()
    inside = [span[0]] + [t for t in stamps if span[0] < t < span[1]] + [span[1]]
    return max(b - a for a, b in itertools.pairwise(inside)), span[1] - span[0]


# --- CPU -------------------------------------------------------------------------------

def cpu_figures(coder: Any, k: int, m: int, *, threads: int, seconds: float,
                repeat: int) -> dict[str, Any]:
    """Encode and decode GB/s of one coder (host API) for K+M on 1 MiB chunks."""
    chunk = random_bytes(CHUNK_BYTES, seed=k * 10 + m)
    frags = [bytes(f) for f in coder.fragments(chunk, k, m)]

    def encoder() -> Callable[[], Any]:
        mine = random_bytes(CHUNK_BYTES, seed=threading.get_ident() % 1000)
        out = np.empty((m, len(frags[0])), dtype=np.uint8)

        def encode() -> Any:
            return coder.encode(mine, k, m, out=out)
        return encode

    def decoder(lost: int) -> Callable[[], Any]:
        kept = {i: f for i, f in enumerate(frags) if i >= lost}

        def decode() -> Any:
            return coder.decode(kept, k, m, CHUNK_BYTES)
        return decode

    row: dict[str, Any] = {
        "encode_GBps_1_thread": best_rate(encoder(), CHUNK_BYTES, seconds=seconds,
                                          repeat=repeat),
        "encode_GBps_all_threads": threaded_rate(encoder, CHUNK_BYTES, threads,
                                                 seconds=seconds, repeat=repeat),
    }
    for lost, label in ((1, "1_lost"), (m, f"{m}_lost")):
        row[f"decode_GBps_{label}_1_thread"] = best_rate(
            decoder(lost), CHUNK_BYTES, seconds=seconds, repeat=repeat)
        row[f"decode_GBps_{label}_all_threads"] = threaded_rate(
            functools.partial(decoder, lost), CHUNK_BYTES, threads, seconds=seconds,
            repeat=repeat)
    row["encode_thread_scaling"] = round(
        row["encode_GBps_all_threads"] / row["encode_GBps_1_thread"], 2)
    return row


def thread_scaling(coder: Any, *, threads: int, seconds: float, repeat: int,
                   quick: bool) -> dict[str, Any]:
    """8+2 encode GB/s on one thread and on THREADS, per chunk size. Every call hands the
    GIL over twice; where threads queue for it, each hand-over costs a thread wake-up
    (tens of microseconds on a VM), so the larger the chunk per call the better N
    threads scale."""
    out: dict[str, Any] = {}
    for mib in (1, 4) if quick else (1, 4, 16):
        nbytes = mib * MiB

        def encoder(nbytes: int = nbytes) -> Callable[[], Any]:
            data = random_bytes(nbytes, seed=threading.get_ident() % 1000)
            return functools.partial(coder.encode, data, 8, 2)

        one = best_rate(encoder(), nbytes, seconds=seconds, repeat=repeat)
        many = threaded_rate(encoder, nbytes, threads, seconds=seconds, repeat=repeat)
        out[f"{mib}MiB"] = {"1_thread": one, "all_threads": many,
                            "scaling": round(many / one, 2)}
    return out


# --- GPU -------------------------------------------------------------------------------

def _cupy() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CuPy may warn about CUDA paths on import
        return importlib.import_module("cupy")


def _event_seconds(cupy: Any, fn: Callable[[], Any], reps: int) -> float:
    """Seconds per call of FN (which queues work on the current stream), CUDA events."""
    fn()
    cupy.cuda.get_current_stream().synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return float(cupy.cuda.get_elapsed_time(start, end)) / 1e3 / reps


def gpu_figures(coder: Any, k: int, m: int, *, batch: int, big: int,
                reps: int) -> dict[str, Any]:
    """Figures of the GPU coder for K+M (see the module docstring)."""
    from mosafs.erasure.isal import IsalCoder

    cupy = _cupy()
    rng = np.random.default_rng(k * 10 + m)
    host = rng.integers(0, 256, (batch, CHUNK_BYTES), dtype=np.uint8)
    chunks = cupy.asarray(host)
    large = cupy.asarray(rng.integers(0, 256, big, dtype=np.uint8))
    big_size = -(-big // (64 * k)) * 64
    row: dict[str, Any] = {"batch": f"{batch} x 1 MiB", "big_chunk_MiB": big // MiB}

    def rate(nbytes: int, fn: Callable[[], Any]) -> float:
        return _gbps(nbytes, _event_seconds(cupy, fn, reps))

    # The kernels alone: launches prepared once, queued back to back.
    one, _ = coder.prepare_encode(chunks[0], k, m)
    row["kernel_encode_1MiB_GBps"] = rate(CHUNK_BYTES, one)
    baked, parity_batch = coder.prepare_encode(chunks, k, m)
    row["kernel_encode_batch_GBps"] = rate(batch * CHUNK_BYTES, baked)
    params, _ = coder.prepare_encode(chunks, k, m, baked=False)
    row["kernel_encode_batch_params_GBps"] = rate(batch * CHUNK_BYTES, params)
    whole, parity = coder.prepare_encode(large, k, m)
    row["kernel_encode_big_GBps"] = rate(big, whole)
    frags = {j: large[j * big_size:(j + 1) * big_size] for j in range(k)
             if (j + 1) * big_size <= big}
    frags.update({k + i: parity[i] for i in range(m)})
    for lost in sorted({1, m}):
        rebuild, _ = coder.prepare_rebuild({i: f for i, f in frags.items() if i >= lost},
                                           k, m, range(lost))
        # GB/s of the chunk: decoding it is this kernel plus copying the other fragments
        row[f"kernel_rebuild_{lost}_lost_big_GBps"] = rate(big, rebuild)
    # Through the API, per call (host overhead included).
    row["encode_device_1MiB_GBps"] = rate(CHUNK_BYTES, functools.partial(
        coder.encode_device, chunks[0], k, m))
    row["encode_device_batch_GBps"] = rate(batch * CHUNK_BYTES, functools.partial(
        coder.encode_device, chunks, k, m))
    for lost in sorted({1, m}):
        row[f"decode_device_{lost}_lost_big_GBps"] = rate(big, functools.partial(
            coder.decode_device, {i: f for i, f in frags.items() if i >= lost}, k, m, big))
    pinned = cupy.cuda.alloc_pinned_memory(parity_batch.nbytes)
    dest = np.frombuffer(pinned, np.uint8, parity_batch.nbytes).reshape(parity_batch.shape)
    coder.encode_to_host(chunks, k, m, out=dest)
    start = time.perf_counter()
    for _ in range(reps):
        coder.encode_to_host(chunks, k, m, out=dest)
    row["encode_to_host_batch_GBps"] = _gbps(reps * batch * CHUNK_BYTES,
                                             time.perf_counter() - start)
    want = IsalCoder(coder.isal).encode(host[-1], k, m)
    baked()
    cupy.cuda.get_current_stream().synchronize()
    row["verified"] = bool((dest[-1] == want).all() and (parity_batch[-1].get() == want).all())
    rate_ragged, ragged_ok = ragged_kernel_figure(k, m, reps)
    row["kernel_ragged_64MiB_GBps"] = rate_ragged
    row["verified"] = row["verified"] and ragged_ok
    return row


def ragged_kernel_figure(k: int, m: int, reps: int, nbytes: int = 64 * MiB) -> tuple[float, bool]:
    """GB/s of the GPU stream's parity kernel alone over NBYTES of chunks of random lengths
    (256 KiB to 4 MiB) from an odd offset on (one launch, plan already on the device, as
    the stream runs it), and whether a sample of chunks' parity equals ISA-L's."""
    from mosafs.erasure.gpu_batch import ragged_encoder, ragged_plan
    from mosafs.erasure.isal import IsalCoder

    cupy = _cupy()
    rng = np.random.default_rng(k * 100 + m)
    lengths = _chunk_lengths(rng, nbytes - 64)
    offsets = 13 + np.concatenate([[0], np.cumsum(lengths)[:-1]])
    host = rng.integers(0, 256, nbytes + 256, dtype=np.uint8)
    buffer = cupy.asarray(host)
    plan = ragged_plan(offsets, lengths, k, m)
    meta = cupy.asarray(plan.meta)
    parity = cupy.empty(plan.parity_bytes, dtype=cupy.uint8)
    encoder = ragged_encoder(int(buffer.device.id), k, m)
    stream = cupy.cuda.get_current_stream()

    def launch() -> None:
        encoder.launch(int(buffer.data.ptr), int(meta.data.ptr), plan, int(parity.data.ptr),
                       stream)

    rate = _gbps(int(lengths.sum()), _event_seconds(cupy, launch, reps))
    got = parity.get()
    coder = IsalCoder()
    ok = True
    for n in sorted({0, plan.count // 2, plan.count - 1}):
        start, size, at = int(plan.parity_offsets[n]), int(plan.sizes[n]), int(offsets[n])
        want = coder.encode(host[at:at + int(lengths[n])], k, m)
        ok = ok and bool((got[start:start + m * size].reshape(m, size) == want).all())
    return rate, ok


def _chunk_lengths(rng: np.random.Generator, total: int) -> npt.NDArray[np.int64]:
    """Lengths of 256 KiB to 4 MiB (any byte count) filling TOTAL bytes."""
    lengths: list[int] = []
    left = total
    while left > 0:
        n = min(left, int(rng.integers(256 << 10, 4 << 20)))
        lengths.append(n)
        left -= n
    return np.array(lengths, dtype=np.int64)


# --- GPU end to end: chunking + BLAKE3 + parity from pinned memory ----------------------

def _stream_run(chunker: Any, total: int, parity: tuple[int, int, int] | None,
                profile: Any = None) -> dict[str, Any]:
    """One pipelined stream over TOTAL bytes of pinned buffers (their current bytes):
    chunk bounds, ids and parity out, each batch released once counted."""
    stream = chunker.stream(pipelined=True, keep_data=False, profile=profile, parity=parity)
    counts = {"chunks": 0, "coded_chunks": 0, "parity_bytes": 0}
    done = 0
    start = time.perf_counter()
    while done < total:
        view = stream.pinned_buffer()
        n = min(view.shape[0], total - done)
        _count(stream.feed_pinned_batch(n), counts)
        done += n
    _count(stream.finish_batch(), counts)
    seconds = time.perf_counter() - start
    return {"bytes": total, "seconds": round(seconds, 4), **counts,
            "GBps": round(total / seconds / 1e9, 2)}


def _count(batches: list[Any], counts: dict[str, int]) -> None:
    for batch in batches:
        counts["chunks"] += len(batch)
        par = batch.parity
        if par is not None:
            coded = par.at >= 0
            counts["coded_chunks"] += int(coded.sum())
            counts["parity_bytes"] += par.m * int(par.size[coded].sum())
        batch.release()


def _interleaved_runs(chunker: Any, total: int,
                      configs: dict[str, tuple[int, int, int] | None],
                      reps: int) -> dict[str, list[dict[str, Any]]]:
    """Each config (parity or None) warmed up at full size (kernels built, parity blocks
    allocated, clocks up), then REPS rounds of one timed run of each, interleaved so that
    a slow spell of the shared host falls on all of them."""
    for parity in configs.values():
        _stream_run(chunker, total, parity)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for _ in range(reps):
        for name, parity in configs.items():
            runs[name].append(_stream_run(chunker, total, parity))
    return runs


def _summary(runs: list[dict[str, Any]], h2d: float) -> dict[str, Any]:
    """The median run's GB/s, and over H2D: the figure judged."""
    rates = [r["GBps"] for r in runs]
    median = statistics.median(rates)
    last = runs[-1]
    return {"median_GBps": round(median, 2), "runs_GBps": rates,
            "over_h2d": round(median / h2d, 3), "best_over_h2d": round(max(rates) / h2d, 3),
            "chunks": last["chunks"], "coded_chunks": last["coded_chunks"],
            "parity_bytes": last["parity_bytes"]}


def _breakdown(chunker: Any, total: int, parity: tuple[int, int, int]) -> dict[str, Any]:
    """One more run with CUDA events per buffer: each stage's summed GPU time."""
    from mosafs.chunking.gpu_stream import Profile

    profile = Profile()
    run = _stream_run(chunker, total, parity, profile)
    stages = profile.as_dict()
    return {"wall_GBps_with_events": run["GBps"], "buffers": profile.segments,
            "stage_seconds": {k: round(v, 4) for k, v in stages.items() if k.endswith("_s")},
            "note": "GPU times from CUDA events per buffer, summed; the stages overlap "
                    "(copy in runs beside the kernels of earlier buffers). parity_s: the "
                    "ragged parity kernel and the parity's copy out"}


def _verify_stream(chunker: Any, k_m: tuple[tuple[int, int], ...], nbytes: int) -> bool:
    """Every chunk's parity from the stream (Chunk objects, bytes kept) equals ISA-L's."""
    from mosafs.erasure.isal import IsalCoder

    coder = IsalCoder()
    data = np.random.default_rng(5).integers(0, 256, nbytes, dtype=np.uint8)
    for k, m in k_m:
        stream = chunker.stream(pipelined=True, parity=(k, m, EC_MIN_CHUNK))
        chunks = stream.feed(data) + stream.finish()
        for c in chunks:
            if c.length < EC_MIN_CHUNK:
                if c.parity is not None:
                    return False
                continue
            want = coder.encode(c.data, k, m)
            if c.parity is None or any(bytes(p) != w.tobytes()
                                       for p, w in zip(c.parity, want, strict=True)):
                return False
    return True


def gpu_end_to_end(k_m: tuple[tuple[int, int], ...], *, total: int, reps: int,
                   quick: bool) -> dict[str, Any]:
    """gpu.end_to_end of the module docstring."""
    from mosafs.bench.gpu_kernels import bench_copy
    from mosafs.bench.hash import _prefill
    from mosafs.chunking import DEFAULT_SPEC, gpu_runtime, parse_spec
    from mosafs.chunking.gpu import GpuChunker

    spec = parse_spec(DEFAULT_SPEC)
    rt = gpu_runtime.GpuRuntime(gpu_runtime.runtime_for(spec).buffer_size, devices=[0])
    chunker = GpuChunker(spec, rt)
    _prefill(chunker, 11)
    copy_bytes = (64 if quick else 256) * MiB
    before = bench_copy(copy_bytes, 9)["per_device"][0]
    configs: dict[str, tuple[int, int, int] | None] = {"hash_only": None}
    configs.update({f"{k}+{m}": (k, m, EC_MIN_CHUNK) for k, m in k_m})
    runs = _interleaved_runs(chunker, total, configs, reps)
    first = f"{k_m[0][0]}+{k_m[0][1]}"
    breakdown = _breakdown(chunker, total, (*k_m[0], EC_MIN_CHUNK))
    after = bench_copy(copy_bytes, 9)["per_device"][0]["h2d_GBps"]
    # The copy bandwidth drifts on a shared host (49 to 53 GB/s before and after one
    # run): rated against the faster measurement, the ratio is never flattered.
    h2d = max(before["h2d_GBps"], after)
    out: dict[str, Any] = {"spec": str(spec), "bytes": total, "buffer_bytes": rt.buffer_size,
                           "min_chunk": EC_MIN_CHUNK, "h2d_GBps": h2d,
                           "h2d_before_GBps": before["h2d_GBps"], "h2d_after_GBps": after,
                           "d2h_GBps": before["d2h_GBps"]}
    out.update({name: _summary(found, h2d) for name, found in runs.items()})
    out[first]["breakdown"] = breakdown
    out["over_h2d"] = out[first]["over_h2d"]
    out["target_over_h2d"] = TARGET_E2E_OVER_H2D
    out["met"] = out["over_h2d"] >= TARGET_E2E_OVER_H2D
    out["verified"] = _verify_stream(chunker, k_m, (64 if quick else 256) * MiB)
    return out


def _gpu_section(k_m: tuple[tuple[int, int], ...], quick: bool) -> dict[str, Any]:
    from mosafs.erasure.registry import coder_unavailable_reason, make_coder

    reason = coder_unavailable_reason("gpu")
    if reason is not None:
        return {"skipped": reason}
    coder = make_coder("gpu")
    cupy = _cupy()
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    out: dict[str, Any] = {"library": coder.library,
                           "multiprocessors": int(props["multiProcessorCount"])}
    for k, m in k_m:
        out[f"{k}+{m}"] = gpu_figures(coder, k, m, batch=16 if quick else 64,
                                      big=16 * MiB if quick else 64 * MiB,
                                      reps=5 if quick else 20)
    out["end_to_end"] = gpu_end_to_end(k_m, total=(1 if quick else 8) * GiB,
                                       reps=2 if quick else 7, quick=quick)
    return out


# --- the whole benchmark ---------------------------------------------------------------

def run_ec_coder_benchmark(*, quick: bool = False, threads: int | None = None,
                           gpu: bool = True, seconds: float | None = None,
                           repeat: int | None = None) -> dict[str, Any]:
    """Every figure of the module docstring, as a JSON-able dict. QUICK: short runs (a
    smoke test); GPU=False leaves the GPU out."""
    from mosafs.erasure.isal import IsalCoder

    threads = threads or cpu_count()
    seconds = seconds if seconds is not None else (0.05 if quick else 0.3)
    repeat = repeat if repeat is not None else (1 if quick else 3)
    coder = IsalCoder()
    isal: dict[str, Any] = {"library": coder.library}
    for k, m in SHAPES:
        isal[f"{k}+{m}"] = cpu_figures(coder, k, m, threads=threads, seconds=seconds,
                                       repeat=repeat)
    long_chunk = random_bytes(32 * MiB)
    isal["gil_32MiB_8+2_encode"] = gil_check(functools.partial(coder.encode, long_chunk, 8, 2))
    isal["thread_scaling_8+2_encode"] = thread_scaling(coder, threads=threads, seconds=seconds,
                                                       repeat=repeat, quick=quick)
    return {
        "machine": {"cpus": cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version()},
        "units": "GB/s of chunk bytes (10^9 B/s of input)",
        "chunk_bytes": CHUNK_BYTES,
        "threads": threads,
        "seconds_per_run": seconds,
        "repeat": repeat,
        "isal": isal,
        "gpu": _gpu_section(SHAPES, quick) if gpu else {"skipped": "not asked for"},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Erasure coder speed (JSON on stdout).")
    parser.add_argument("--quick", action="store_true", help="short runs: a smoke test")
    parser.add_argument("--no-gpu", action="store_true", help="leave the GPU out")
    parser.add_argument("--threads", type=int, default=None, help="threads for the "
                        "all-cores figures (default: the CPUs this process may use)")
    args = parser.parse_args(argv)
    result = run_ec_coder_benchmark(quick=args.quick, threads=args.threads,
                                    gpu=not args.no_gpu)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
