"""CPU chunking and hashing throughput, on one core.

    .venv/bin/python benchmarks/chunking_cpu.py [--size-mib 256] [--spec cdc:...] [--repeat 3]

Prints one JSON object. Figures are in GB/s (10^9 bytes per second), best of --repeat runs
after one warm-up run, over deterministic incompressible input (BLAKE3 XOF of a seed):

* gear_scan_every_byte: the compiled gear hash over every byte (counting MASK_L hits);
* cut_finding: the spec's cut points over the whole input (skips ~MIN bytes a chunk;
  cdc specs only);
* blake3: BLAKE3-256 of the input in 1 MiB pieces, one thread;
* stream: cut points + ids + chunk copies through the streaming API fed --feed-mib
  pieces, each feed's chunks dropped before the next: the target figure;
* chunk_all: the same over the whole buffer at once (every chunk's bytes alive together);
* stream_N_threads: N streams at once, one per core, each over 1/N of the input (run
  with the process's original CPU set; the other figures are pinned to one core).

The process pins itself to one core (where the OS allows) so "one core" is what it says.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import blake3
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mosafs.chunking import DEFAULT_SPEC, make_chunker, parse_spec
from mosafs.chunking.gear import GEAR

MiB = 1 << 20


def main() -> None:
    args = parse_args()
    all_cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pinned = pin_to_one_core()
    spec = parse_spec(args.spec)
    data = blake3.blake3(b"mosafs-benchmark").digest(length=args.size_mib * MiB)
    array = np.frombuffer(data, dtype=np.uint8)
    chunker = make_chunker(spec, "cpu", threads=1)
    feed = args.feed_mib * MiB

    def stream() -> int:
        s = chunker.stream()
        view = memoryview(data)
        count = 0
        for offset in range(0, len(data), feed):
            count += len(s.feed(view[offset:offset + feed]))
        return count + len(s.finish())

    # A fixed spec has no scan: the scan figure then uses the default spec's mask.
    scan_mask = (spec if spec.kind == "cdc" else parse_spec(DEFAULT_SPEC)).mask_l
    results: dict[str, float] = {}
    runs: dict[str, Callable[[], Any]] = {
        "gear_scan_every_byte": lambda: scan_every_byte(array, scan_mask),
    }
    if spec.kind == "cdc":
        runs["cut_finding"] = lambda: cut_finding(chunker, array)
    runs |= {
        "blake3": lambda: hash_pieces(data),
        "stream": stream,
        # Last: holding every chunk of the input at once page-faults in fresh memory and
        # leaves glibc's malloc thresholds changed for whatever runs after it.
        "chunk_all": lambda: chunker.chunk_all(data),
    }
    for name, run in runs.items():
        results[name] = round(best_rate(run, len(data), args.repeat), 3)
    if len(all_cpus) > 1:
        # Every core: one stream per core, each over its own share of the input, the way
        # the client chunks several files at once (the scan and BLAKE3 drop the GIL).
        os.sched_setaffinity(0, set(all_cpus))
        workers = len(all_cpus)
        results[f"stream_{workers}_threads"] = round(best_rate(
            lambda: parallel_streams(chunker, data, feed, workers), len(data), args.repeat), 3)
    chunks = chunker.chunk_all(data)
    print(json.dumps({
        "spec": str(spec),
        "input_mib": args.size_mib,
        "feed_mib": args.feed_mib,
        "repeat": args.repeat,
        "unit": "GB/s (1e9 bytes/s), best of repeat after a warm-up",
        "hash_threads": 1,
        "pinned_cpu": pinned,
        "cpus": len(all_cpus),
        "gbps": results,
        "chunks": len(chunks),
        "mean_chunk_bytes": round(len(data) / max(1, len(chunks))),
        "machine": machine(),
    }, indent=1))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=256, help="input size (default 256)")
    parser.add_argument("--spec", default=DEFAULT_SPEC, help=f"chunker (default {DEFAULT_SPEC})")
    parser.add_argument("--feed-mib", type=int, default=1, help="stream piece size (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs (default 3)")
    args = parser.parse_args()
    if args.size_mib < 1 or args.feed_mib < 1 or args.repeat < 1:
        parser.error("--size-mib, --feed-mib and --repeat must be at least 1")
    return args


def parallel_streams(chunker: Any, data: bytes, feed: int, workers: int) -> int:
    share = -(-len(data) // workers)
    view = memoryview(data)

    def one(start: int) -> int:
        s = chunker.stream()
        count = 0
        for offset in range(start, min(start + share, len(data)), feed):
            count += len(s.feed(view[offset:min(offset + feed, start + share)]))
        return count + len(s.finish())

    with ThreadPoolExecutor(workers) as pool:
        return sum(pool.map(one, range(0, len(data), share)))


def scan_every_byte(array: np.ndarray, mask: int) -> int:
    from mosafs.chunking import _kernels

    return int(_kernels.count_hits(array, GEAR, np.uint64(mask)))


def cut_finding(chunker: Any, array: np.ndarray) -> int:
    cuts, _ = chunker._cutter.cuts(array, 0, 0)  # the cutter alone: no copies, no hashing
    return len(cuts)


def hash_pieces(data: bytes) -> int:
    view = memoryview(data)
    for offset in range(0, len(data), MiB):
        blake3.blake3(view[offset:offset + MiB]).digest()
    return len(data)


def best_rate(run: Callable[[], Any], nbytes: int, repeat: int) -> float:
    run()  # warm-up: compiles or loads the numba cache, faults pages in
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return nbytes / best / 1e9


def pin_to_one_core() -> int | None:
    try:
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
    except (AttributeError, OSError):
        return None
    return cpu


def machine() -> dict[str, Any]:
    info = _cpuinfo()
    return {
        "cpu_model": info.get("model name", platform.processor() or "unknown"),
        "cpu_mhz": info.get("cpu mhz", "unknown"),
        "logical_cpus": os.cpu_count(),
        "avx512f": "avx512f" in info.get("flags", "").split(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": _version("numba"),
        "blake3": _version("blake3"),
    }


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields from /proc/cpuinfo (keys lower-cased), or {}."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip().lower()] = value.strip()
    return fields


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    main()
