"""`mosafs bench`: benchmarks that start real processes. One so far:

    mosafs bench write [--quick] [--json] [--size-mib N] [--memory] [--keep DIR]

Imports stay light here: the benchmark modules load only when a benchmark runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


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


def run(args: argparse.Namespace) -> int:
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
