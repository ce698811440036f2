"""`mosafs bench`: the benchmarks.

    mosafs bench write [--quick] [--json] [--size-mib N] [--memory] [--keep DIR]
    mosafs bench hash [--backend auto|cpu|gpu|oracle|all] [--quick] [--json] [--spec SPEC]
    mosafs bench backends [--backends cpu,gpu] [--size-mib N] [--json]

`write` starts real processes (a cluster and a null FUSE file system) and measures the
mount; `hash` measures content addressing (cut points + BLAKE3 ids) in-process on the CPU
and the GPU (mosafs/bench/hash.py says what each figure means). `--backend gpu` where no
GPU is usable is an error with the reason (exit code 2), never a CPU run.

Imports stay light here: the benchmark modules load only when a benchmark runs
(mosafs.bench.hash imports numpy and mosafs.chunking only in its functions).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mosafs.bench import hash as hash_bench


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    w = sub.add_parser(
        "write", help="write and read bandwidth through the mount, against a null FUSE fs",
        description="Write and read bandwidth through a mosafs mount (`mosafs up` with 3 "
                    "benefactors on loopback) against a null pyfuse3 file system, peak RSS "
                    "of the mount, and the ratios to the targets. Runs as root for "
                    "drop_caches and peak-RSS resets. Prints one JSON object with --json.",
        epilog="examples:\n  mosafs bench write --json\n  mosafs bench write --quick\n"
               "  mosafs bench write --memory --keep /tmp/bench-run",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    w.add_argument("--quick", action="store_true",
                   help="small sizes (64 MiB, one null run each) for a smoke test; the figures "
                        "mean little")
    w.add_argument("--json", action="store_true", help="print only the JSON object on stdout")
    w.add_argument("--size-mib", type=int,
                   help="file size for the writes and reads (default 1024; --quick: 64)")
    w.add_argument("--memory", action="store_true",
                   help="also write a large file for the mount's peak RSS "
                        "(default 4096 MiB; --quick: 256)")
    w.add_argument("--memory-mib", type=int, help="size of the --memory file")
    w.add_argument("--repeat", type=int,
                   help="null file system runs per figure, best reported (default 3; --quick: 1)")
    w.add_argument("--keep", type=Path, metavar="DIR",
                   help="run in DIR (empty or absent) and keep data, logs and result.json there")
    w.add_argument("--log-level", default="WARNING")
    w.set_defaults(bench_run=_run_write)

    h = sub.add_parser(
        "hash", help="content addressing (cut points + BLAKE3 ids) on the CPU and the GPU",
        description="Content addressing throughput in GB/s (1e9 bytes per second): the CPU\n"
                    "backend on one core and on all cores; the GPU backend's kernels alone\n"
                    "(data already on the device) and end to end from pinned host memory,\n"
                    "with the stage breakdown (copy in, candidate kernel, selection, hash\n"
                    "kernel, copy out) and the measured host-to-device bandwidth; the oracle\n"
                    "backend (precomputed chunks: the API's ceiling). Runs in this process.\n"
                    "--backend gpu without a usable GPU is an error with the reason, never\n"
                    "a CPU run. Prints one JSON object with --json.",
        epilog="examples:\n  mosafs bench hash --json\n  mosafs bench hash --backend cpu --quick\n"
               "  mosafs bench hash --backend gpu --json\n"
               "  mosafs bench hash --backend all --spec cdc:4096:16384:65536",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    hash_bench.add_arguments(h)
    h.set_defaults(bench_run=hash_bench.run)

    b = sub.add_parser(
        "backends", help="the mount's CPU seconds per GiB written, by hash backend",
        description="For each hash backend, a fresh `mosafs up --hash-backend B` (3 "
                    "benefactors on loopback) writes a new file and then a checkpoint of it "
                    "with a few edits (1 MiB writes); reports the mount process's CPU "
                    "seconds per GiB, wall time and bandwidth, and checks every backend "
                    "made the same chunks. Prints one JSON object with --json.",
        epilog="examples:\n  mosafs bench backends --backends cpu,gpu --json\n"
               "  mosafs bench backends --backends cpu --size-mib 256",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--backends", default="cpu,gpu",
                   help="comma-separated hash backends to compare (default: cpu,gpu)")
    b.add_argument("--size-mib", type=int, default=2048,
                   help="bytes of each written file, MiB (default 2048)")
    b.add_argument("--json", action="store_true", help="print only the JSON object on stdout")
    b.add_argument("--keep", type=Path, metavar="DIR",
                   help="run in DIR (empty or absent) and keep data and logs there")
    b.add_argument("--log-level", default="WARNING")
    b.set_defaults(bench_run=_run_backends)


def run(args: argparse.Namespace) -> int:
    return int(args.bench_run(args))


def _run_write(args: argparse.Namespace) -> int:
    from mosafs.bench.write import Options, format_table, run_benchmark
    from mosafs.errors import ConfigError
    from mosafs.procutil import setup_logging

    setup_logging(args.log_level)
    mib = 1 << 20
    size = (args.size_mib or (64 if args.quick else 1024)) * mib
    memory = None
    if args.memory or args.memory_mib:
        memory = (args.memory_mib or (256 if args.quick else 4096)) * mib
    repeat = args.repeat or (1 if args.quick else 3)
    if size < mib or repeat < 1 or (memory is not None and memory < mib):
        raise ConfigError("--size-mib and --memory-mib must be >= 1, --repeat >= 1")
    options = Options(size=size, memory_size=memory, repeat=repeat, keep=args.keep,
                      quick=args.quick)
    result = run_benchmark(options, command=" ".join(["mosafs", *sys.argv[1:]])
                           if sys.argv[0].endswith("mosafs") else " ".join(sys.argv))
    if not args.json:
        print(format_table(result))
        print()
    json.dump(result, sys.stdout, indent=None if args.json else 2)
    print()
    return 0  # a missed target is a figure, not a failure: see "pass" in the JSON


def _run_backends(args: argparse.Namespace) -> int:
    from mosafs.bench.backends import run_benchmark
    from mosafs.chunking import BACKEND_CHOICES, resolve_backend
    from mosafs.errors import ConfigError
    from mosafs.procutil import setup_logging

    setup_logging(args.log_level)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or any(b not in BACKEND_CHOICES for b in backends):
        raise ConfigError("--backends takes a comma-separated list of "
                          + ", ".join(BACKEND_CHOICES))
    for backend in backends:
        resolve_backend(backend)  # gpu without one: the reason, before anything starts
    if args.size_mib < 1:
        raise ConfigError("--size-mib must be >= 1")
    result = run_benchmark(backends, args.size_mib << 20, args.keep,
                           command=" ".join(["mosafs", "bench", *sys.argv[2:]]))
    json.dump(result, sys.stdout, indent=None if args.json else 2)
    print()
    return 0
