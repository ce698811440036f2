"""`mosafs bench metadata` and `mosafs bench standby`: their parsers and runners (the
benchmarks are mosafs.bench.metadata and mosafs.bench.standby, loaded only when one runs).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mosafs.argtypes import bounded_float, bounded_int
from mosafs.bench.cli_common import add_run_options, numbers, print_result


def add_metadata_benchmark(sub: Any) -> None:
    m = sub.add_parser(
        "metadata", help="metadata throughput through the mount: creates, stats, lookups, "
                         "ls -l and commits with many client processes, against MooseFS",
        description="On a `mosafs up` cluster (3 benefactors on loopback, chunker "
                    "fixed:4096), for each client count N client processes: creates of "
                    "empty files (all in one shared directory, then each in its own), stats "
                    "of them (cached, then with the kernel's dentries dropped and the "
                    "attribute timeout waited out), lookups of missing names, and commits "
                    "(close latency of small files of many chunks); then `ls -l` and "
                    "listdir of one large directory, cold and warm. Aggregate ops/s and "
                    "p50/p99 latencies per phase, CPU seconds of the manager and the mount; "
                    "the same creates with 8 clients on a private MooseFS cluster (--peer); "
                    "the issue's targets judged. Runs as root for drop_caches and the "
                    "MooseFS namespace. Prints one JSON object with --json.",
        epilog="examples:\n  mosafs bench metadata --json\n"
               "  mosafs bench metadata --clients 1,8 --files 300 --dir-entries 5000 "
               "--commit-files 50\n"
               "  mosafs bench metadata --peer none --keep /tmp/metadata-run",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("--clients", type=numbers(1, 64), default="1,8,16",
                   help="client process counts, 1..64 each (default 1,8,16; the targets "
                        "are judged at 8)")
    add_metadata_workload(m, files=2000, dir_entries=100_000, commit_files=200)
    m.add_argument("--peer", choices=["auto", "moosefs", "none"], default="auto",
                   help="the MooseFS peer: moosefs (an error where it cannot run: not "
                        "installed, not root), auto (where it is installed; the default), "
                        "none")
    m.add_argument("--no-floor", dest="floor", action="store_false",
                   help="skip the null namespace (mosafs.bench.nullns): the same creates "
                        "and stats with 8 clients on a pyfuse3 file system that does no "
                        "work, the ceiling of any pyfuse3 mount on this machine")
    m.add_argument("--scale-chunks", type=bounded_int(0, 100_000_000), default=10_000_000,
                   help="chunk records of the synthetic manager measured for idle CPU, "
                        "failure reaction and status latency (default 10000000, the "
                        "targets'; 0: skip)")
    m.add_argument("--scale-files", type=bounded_int(0, 10_000_000), default=1_000_000,
                   help="files of the synthetic manager (default 1000000)")
    m.add_argument("--managers", type=bounded_int(1, 5), default=1,
                   help="managers of the cluster (`mosafs up --managers`): 2 or more put a "
                        "standby's durable confirmation on every change (default 1)")
    m.add_argument("--coherent-timeout", type=bounded_float(0, 86400), default=None,
                   metavar="SECONDS",
                   help="the mount's `--coherent-timeout` (default: the mount's own, 60; 0: "
                        "no coherent caches, entries live 1 s)")
    m.add_argument("--scale-idle-s", type=bounded_int(1, 3600), default=30,
                   help="seconds the synthetic manager's idle CPU is measured over "
                        "(default 30)")
    add_run_options(m)
    m.set_defaults(bench_run=run_metadata)


def run_metadata(args: argparse.Namespace) -> int:
    from mosafs.bench.metadata import Options, run_metadata
    from mosafs.bench.metadata_figures import format_table
    from mosafs.procutil import setup_logging

    setup_logging(args.log_level)
    options = Options(clients=tuple(sorted(set(args.clients))), files=args.files,
                      dir_entries=args.dir_entries, commit_files=args.commit_files,
                      commit_chunks=args.commit_chunks, peer=args.peer,
                      tls=not args.insecure, keep=args.keep,
                      scale_chunks=args.scale_chunks, scale_files=args.scale_files,
                      scale_idle_s=args.scale_idle_s, managers=args.managers,
                      coherent_timeout=args.coherent_timeout, floor=args.floor)
    result = run_metadata(options, command=" ".join(["mosafs", "bench", *sys.argv[2:]]))
    return print_result(result, args.json, format_table)


def add_metadata_workload(p: argparse.ArgumentParser, *, files: int, dir_entries: int,
                           commit_files: int) -> None:
    """The sizes of `bench metadata`'s phases, with these defaults, and --insecure."""
    p.add_argument("--files", type=bounded_int(1, 1_000_000), default=files,
                   help="files each client creates (and stats, and looks up missing) per "
                        f"phase (default {files})")
    p.add_argument("--dir-entries", type=bounded_int(1, 10_000_000), default=dir_entries,
                   help=f"entries of the directory listed by `ls -l` (default {dir_entries}; "
                        "the target is judged at 100000)")
    p.add_argument("--commit-files", type=bounded_int(1, 100_000), default=commit_files,
                   help="files each client writes and closes in the commit phase "
                        f"(default {commit_files})")
    p.add_argument("--commit-chunks", type=bounded_int(1, 16384), default=64,
                   help="4 KiB chunks of each of those files (default 64)")
    p.add_argument("--insecure", action="store_true",
                   help="run the cluster plaintext (default: mutual TLS, as `mosafs up`)")


def add_standby_benchmark(sub: Any) -> None:
    from mosafs.bench.standby import MAX_LOSS_PCT

    p = sub.add_parser(
        "standby", help="what one standby manager costs the creates of `bench metadata`",
        description="`mosafs bench metadata` (clients 1 and 8, no MooseFS, no synthetic "
                    "manager) --pairs times with one manager and as many with a standby "
                    "(`mosafs up --managers 2`), alternating in ABBA order: creates/s per "
                    "line and run, their means, the change with the standby, and the "
                    f"target (at most {MAX_LOSS_PCT:g} % fewer on every line). The 8 "
                    "clients' uncached stats, which no manager serves, flag slow runs of "
                    "the machine.",
        epilog="examples:\n  mosafs bench standby --json\n"
               "  mosafs bench standby --pairs 5 --files 1000",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=bounded_int(1, 50), default=3,
                   help="runs with and without the standby (default 3)")
    add_metadata_workload(p, files=500, dir_entries=2000, commit_files=50)
    add_run_options(p)
    p.set_defaults(bench_run=run_standby)


def run_standby(args: argparse.Namespace) -> int:
    from mosafs.bench.standby import format_table, run_standby
    from mosafs.procutil import setup_logging

    setup_logging(args.log_level)
    result = run_standby(args.pairs, files=args.files, dir_entries=args.dir_entries,
                         commit_files=args.commit_files, commit_chunks=args.commit_chunks,
                         tls=not args.insecure, keep=args.keep,
                         command=" ".join(["mosafs", "bench", *sys.argv[2:]]))
    return print_result(result, args.json, format_table)
