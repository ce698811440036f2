"""`mosafs bench`: the benchmarks.

    mosafs bench write [--quick] [--json] [--size-mib N] [--memory] [--keep DIR]
                       [--peer auto|moosefs|none] [--writers N] [--series-mib N]
    mosafs bench hash [--backend auto|cpu|gpu|oracle|all] [--quick] [--json] [--spec SPEC]
    mosafs bench backends [--backends cpu,gpu] [--size-mib N] [--json]
    mosafs bench durability [--files N] [--file-mib N] [--kill-mib N] [--json]
    mosafs bench ec [--parts coders,mount,rebuild,devices] [--layouts L,L] [--quick] [--json]
    mosafs bench series|stripe|clients [--quick] [--json] [--plot DIR]
                                       [--links auto|netns|ratelimit|none]
    mosafs bench checkpoint [--size-mib N] [--steps N] [--changed F] [--device cuda|cpu]
                            [--ranks N,N]
                            [--local-dir DIR] [--keep DIR] [--up-arg ARG ...] [--seed N]
                            [--json]
    mosafs bench metadata [--clients N,N] [--files N] [--dir-entries N] [--commit-files N]
                          [--commit-chunks N] [--peer auto|moosefs|none] [--insecure]
                          [--managers N] [--keep DIR] [--json]
    mosafs bench standby [--pairs N] [--files N] [--dir-entries N] [--commit-files N]
                         [--keep DIR] [--json]

`write` starts real processes (a cluster and a null FUSE file system) and measures the
mount; `series`, `stripe` and `clients` reproduce the stdchk and MosaStore evaluations
(mosafs/bench/storage.py) on a testbed of their own, behind emulated links; `hash`
measures content addressing (cut points + BLAKE3 ids) in-process on the CPU and the GPU
(mosafs/bench/hash.py says what each figure means); `checkpoint` measures
mosafs.checkpoint's save and load of a state dict against torch.save and safetensors on
the local disk (mosafs/bench/checkpoint.py); `metadata` measures creates, stats, lookups,
`ls -l` and commits through the mount with many client processes, against MooseFS' master
(mosafs/bench/metadata.py); `standby` runs `metadata` with and without a standby manager,
in pairs, and judges what the standby costs its creates (mosafs/bench/standby.py).
`--backend gpu` where no GPU is usable is an error with the reason (exit code 2), never a
CPU run; `backends` compares cpu, and gpu where one is usable, unless told which. Each
prints a table for people, or one JSON object with every figure with --json. Sizes and
counts are checked as they are parsed (>= 1, a one-line error with exit code 2), so no
value silently means "the default".

Imports stay light here: the benchmark modules load only when a benchmark runs
(mosafs.bench.hash imports numpy and mosafs.chunking only in its functions).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mosafs.argtypes import bounded_int
from mosafs.bench import hash as hash_bench
from mosafs.bench.cli_checkpoint import add_checkpoint_benchmark
from mosafs.bench.cli_common import MAX_MIB, add_run_options, numbers, print_result
from mosafs.bench.cli_metadata import add_metadata_benchmark, add_standby_benchmark


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    w = sub.add_parser(
        "write", help="write and read bandwidth through the mount, against a null FUSE fs",
        description="Write and read bandwidth through a mosafs mount (`mosafs up` with 3 "
                    "benefactors on loopback) against a null pyfuse3 file system, peak RSS "
                    "of the mount, and the ratios to the targets; concurrent writers (1 and "
                    "N, a file each) on the null fs, mosafs and MooseFS; a checkpoint series "
                    "against the local disk; MooseFS (3 chunkservers, goal 2, in a network "
                    "namespace of its own) measured like mosafs. Runs as root for "
                    "drop_caches, peak-RSS resets and the namespace. Prints one JSON object "
                    "with --json.",
        epilog="examples:\n  mosafs bench write --json\n  mosafs bench write --quick\n"
               "  mosafs bench write --memory --keep /tmp/bench-run\n"
               "  mosafs bench write --peer none --writers 8 --series-mib 256",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    w.add_argument("--quick", action="store_true",
                   help="small sizes (64 MiB, one null run each) for a smoke test; the figures "
                        "mean little")
    w.add_argument("--json", action="store_true", help="print only the JSON object on stdout")
    w.add_argument("--plot", type=Path, metavar="DIR", help="write a PNG figure into DIR")
    w.add_argument("--size-mib", type=bounded_int(1, MAX_MIB),
                   help="file size for the writes and reads (default 1024; --quick: 64)")
    w.add_argument("--memory", action="store_true",
                   help="also write a large file for the mount's peak RSS "
                        "(default 4096 MiB; --quick: 256)")
    w.add_argument("--memory-mib", type=bounded_int(1, MAX_MIB),
                   help="size of the --memory file")
    w.add_argument("--repeat", type=bounded_int(1, 1000),
                   help="null file system runs per figure, best reported (default 3; --quick: 1)")
    w.add_argument("--keep", type=Path, metavar="DIR",
                   help="run in DIR (empty or absent) and keep data, logs and result.json there")
    w.add_argument("--insecure", action="store_true",
                   help="run the cluster plaintext (default: mutual TLS, as `mosafs up`); "
                        "the two runs give the cost of TLS")
    w.add_argument("--chunk-tokens", choices=["on", "off"], default="on",
                   help="off: the cluster issues and checks no chunk access tokens; the two "
                        "runs give their cost (default on)")
    w.add_argument("--peer", choices=["auto", "moosefs", "none"], default="auto",
                   help="the MooseFS peer: moosefs (an error where it cannot run: not "
                        "installed, not root), auto (where mfsmaster, mfschunkserver and "
                        "mfsmount are installed; the default), none")
    w.add_argument("--peer-fsync", action="store_true",
                   help="MooseFS chunkservers fsync each chunk before closing it "
                        "(HDD_FSYNC_BEFORE_CLOSE=1; mosafs' benefactors always do)")
    w.add_argument("--writers", type=bounded_int(1, 64),
                   help="concurrent writers, a file of SIZE/N each (and always 1; "
                        "default 4; --quick: 2)")
    w.add_argument("--series-mib", type=bounded_int(1, 1024),
                   help="bytes of each checkpoint series step, MiB (default 1024; --quick: 16)")
    w.add_argument("--series-steps", type=bounded_int(1, 100),
                   help="checkpoint series steps (default 4; --quick: 3)")
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
        epilog="examples:\n  mosafs bench backends\n  mosafs bench backends --json\n"
               "  mosafs bench backends --backends cpu,gpu --size-mib 256",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--backends",
                   help="comma-separated hash backends to compare (default: cpu, and gpu "
                        "where one is usable; gpu named here without one is an error)")
    b.add_argument("--size-mib", type=bounded_int(1, MAX_MIB), default=2048,
                   help="bytes of each written file, MiB (default 2048)")
    add_run_options(b)
    b.set_defaults(bench_run=_run_backends)


    d = sub.add_parser(
        "durability", help="close to full redundancy (optimistic), and failure detection and "
                           "re-replication after a SIGKILL",
        description="On `mosafs up` clusters (3 benefactors, R=2): the time from close() to "
                    "full redundancy for files written to an optimistic pool (p50, p90, p99; "
                    "polled every 10 ms), and, on the default pessimistic pool, the time to "
                    "detect a SIGKILLed benefactor and the re-replication throughput after "
                    "it. Prints one JSON object with --json.",
        epilog="examples:\n  mosafs bench durability --json\n"
               "  mosafs bench durability --files 20 --kill-mib 128",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--files", type=bounded_int(1, 100_000), default=100,
                   help="files written to the optimistic pool (default 100)")
    d.add_argument("--file-mib", type=bounded_int(1, 4096), default=4,
                   help="size of each, MiB (default 4)")
    d.add_argument("--kill-mib", type=bounded_int(64, 1 << 20), default=512,
                   help="MiB written before a benefactor is killed (default 512)")
    add_run_options(d)
    d.set_defaults(bench_run=_run_durability)

    _add_ec_benchmark(sub)
    _add_storage_benchmarks(sub)
    add_checkpoint_benchmark(sub)
    add_metadata_benchmark(sub)
    add_standby_benchmark(sub)


def _add_ec_benchmark(sub: Any) -> None:
    e = sub.add_parser(
        "ec", help="erasure coding: coders (CPU, GPU), writes and reads through the mount "
                   "by redundancy, degraded reads, rebuild",
        description="Erasure coding (docs/erasure.md): encode and decode GB/s of the coders "
                    "on one core, all cores and the GPU (kernel alone, and end to end from "
                    "pinned memory with chunking and hashing); write and cold read through "
                    "a mount of `mosafs up` (N benefactors on loopback) for each redundancy, "
                    "the bytes stored per byte written, and a read with as many benefactors "
                    "SIGKILLed as the redundancy tolerates; the rebuild time of one dead "
                    "benefactor against the number of survivors. Runs as root "
                    "(drop_caches). Prints one JSON object with --json.",
        epilog="examples:\n  mosafs bench ec --json\n  mosafs bench ec --quick\n"
               "  mosafs bench ec --parts coders --json\n"
               "  mosafs bench ec --parts devices --json\n"
               "  mosafs bench ec --parts mount --layouts ec:4+2,replicas:3 --size-mib 256",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--quick", action="store_true",
                   help="small sizes (64 MiB, short coder runs): a smoke test")
    e.add_argument("--parts", default="coders,mount,rebuild",
                   help="which parts, comma-separated (default coders,mount,rebuild; "
                        "`devices`, one GPU against every visible GPU, is asked for alone)")
    e.add_argument("--layouts", default=",".join(_EC_LAYOUTS),
                   help=f"redundancies measured through the mount (default "
                        f"{','.join(_EC_LAYOUTS)})")
    e.add_argument("--size-mib", type=bounded_int(1, MAX_MIB), default=None,
                   help="bytes written per redundancy, MiB (default 1024; --quick: 64)")
    e.add_argument("--benefactors", type=bounded_int(2, 64), default=11,
                   help="benefactors of the mount's cluster (default 11: ec:8+2 and one "
                        "more)")
    e.add_argument("--no-gpu", action="store_true", help="leave the GPU coder out")
    e.add_argument("--rebuild-mbit", type=bounded_int(1, 100_000), default=200,
                   help="each benefactor's emulated link in the rebuild part, Mbit/s "
                        "(default 200; slow enough that links, not CPUs, bound it: 20 on 2 "
                        "cores)")
    add_run_options(e)
    e.set_defaults(bench_run=_run_ec)


_EC_LAYOUTS = ("replicas:2", "replicas:3", "ec:4+2", "ec:8+2")
_EC_PARTS = ("coders", "mount", "rebuild", "devices")


def _run_ec(args: argparse.Namespace) -> int:
    from mosafs.bench.ec import Options, format_table, run_ec_benchmark, width
    from mosafs.errors import ConfigError
    from mosafs.procutil import setup_logging

    setup_logging(args.log_level)
    parts = tuple(p for p in args.parts.split(",") if p)
    if not parts or any(p not in _EC_PARTS for p in parts):
        raise ConfigError(f"--parts takes some of {','.join(_EC_PARTS)}, got {args.parts!r}")
    layouts = tuple(x for x in args.layouts.split(",") if x)
    for layout in layouts:  # width(): a one-line ConfigError for a bad one
        if width(layout) > args.benefactors:
            raise ConfigError(f"{layout} needs {width(layout)} benefactors, more than "
                              f"--benefactors {args.benefactors}")
    options = Options(size=_given(args.size_mib, 64 if args.quick else 1024) << 20,
                      benefactors=args.benefactors, layouts=layouts, parts=parts,
                      quick=args.quick, gpu=not args.no_gpu, keep=args.keep,
                      rebuild_mbit=args.rebuild_mbit)
    result = run_ec_benchmark(options, command=" ".join(sys.argv))
    if not args.json:
        print(format_table(result))
        print()
    json.dump(result, sys.stdout, indent=None if args.json else 2)
    print()
    return 0  # a missed target is a figure, not a failure: see "targets" in the JSON


STORAGE_EPILOG = ("Definitions: OAB = size / (open until the last write returned); ASB = "
                  "size / (open until close returned). Links: each benefactor behind a "
                  "veth pair shaped by tc tbf between network namespaces the benchmark "
                  "makes and deletes (root and iproute2), or a benefactor-side ingest "
                  "limit where namespaces cannot be made; --links none runs on loopback.")


def _storage_parser(sub: Any, name: str, help_text: str, examples: str) -> Any:
    p = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:]
                       + ". " + STORAGE_EPILOG, epilog="examples:\n" + examples,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="small sizes and fewer configurations: a smoke test")
    p.add_argument("--plot", type=Path, metavar="DIR", help="write PNG figures into DIR")
    p.add_argument("--links", choices=["auto", "netns", "ratelimit", "none"], default="auto",
                   help="each benefactor behind an emulated link: netns (network namespaces "
                        "and tc), ratelimit (the benefactor limits what it takes), auto "
                        "(netns where it can be made, else ratelimit; the default), or none "
                        "(plain loopback)")
    p.add_argument("--link-rate", type=bounded_int(1_000_000, 100_000_000_000),
                   default=1_000_000_000, metavar="BITS_PER_S",
                   help="rate of each emulated link (default 1000000000: 1 Gbit/s)")
    add_run_options(p)
    p.set_defaults(bench_run=_run_storage, storage=name)
    return p


def _add_storage_benchmarks(sub: Any) -> None:
    from mosafs.bench.workloads import KINDS

    s = _storage_parser(
        sub, "series", "checkpoint series written non-CA, CA-CPU, CA-GPU and CA-oracle with "
        "fixed and CDC chunks of 256 KiB, 1 MiB and 4 MiB average",
        "  mosafs bench series --json --plot /tmp/figures\n"
        "  mosafs bench series --quick\n"
        "  mosafs bench series --workload similar --size-mib 64 --steps 3 --links none")
    s.add_argument("--workload", choices=KINDS, default="checkpoint")
    s.add_argument("--size-mib", type=bounded_int(1, 1024), help="file size (default 256; "
                   "--quick: 16)")
    s.add_argument("--steps", type=bounded_int(1, 100), help="files in the series "
                   "(default 5; --quick: 3)")
    s.add_argument("--change", type=float, default=0.15,
                   help="checkpoint: fraction of pages rewritten per step (default 0.15)")
    s.add_argument("--regions", type=bounded_int(1, 100_000), default=8,
                   help="checkpoint: contiguous runs of rewritten pages (default 8)")
    s.add_argument("--insertions", type=bounded_int(0, 1000), default=4,
                   help="checkpoint: insertions per step (default 4)")
    s.add_argument("--stripe-width", type=bounded_int(1, 3), default=1,
                   help="benefactors each file stripes over (default 1: one 1 Gbit/s link "
                        "carries a writer's data, as the client NIC in stdchk)")
    s.add_argument("--configs", help="comma-separated names to run, e.g. "
                   "'non-CA fixed 1024K,CA-CPU cdc 1024K' (default: all)")
    t = _storage_parser(
        sub, "stripe", "one writer of new data striped over W = 1..4 benefactors, each "
        "behind its own link", "  mosafs bench stripe --json --plot /tmp/figures\n"
        "  mosafs bench stripe --quick --widths 1,2")
    t.add_argument("--size-mib", type=bounded_int(1, 1024),
                   help="file size (default 1024; --quick: 32)")
    t.add_argument("--widths", type=numbers(1, 16), default="1,2,3,4",
                   help="stripe widths, 1..16 each (default 1,2,3,4)")
    c = _storage_parser(
        sub, "clients", "N concurrent writers (1 to 8) of 100 MiB files: aggregate "
        "throughput, manager transactions per second, errors",
        "  mosafs bench clients --json --plot /tmp/figures\n"
        "  mosafs bench clients --quick --writers 1,2")
    c.add_argument("--size-mib", type=bounded_int(1, 1024),
                   help="file size (default 100; --quick: 16)")
    c.add_argument("--writers", type=numbers(1, 64), default="1,2,4,8",
                   help="writer counts, 1..64 each (default 1,2,4,8)")


def _run_storage(args: argparse.Namespace) -> int:
    from mosafs.bench import storage
    from mosafs.bench.testbed import Links, links_unavailable
    from mosafs.bench.workloads import Workload
    from mosafs.errors import ConfigError
    from mosafs.procutil import setup_logging

    setup_logging(args.log_level)
    mode = args.links
    if mode == "auto":
        mode = "ratelimit" if links_unavailable() else "netns"
    if mode == "netns" and (reason := links_unavailable()):
        raise ConfigError(f"{reason}; or run with --links ratelimit or none")
    if args.plot:
        from mosafs.bench.plots import _pyplot

        _pyplot()  # missing matplotlib: say so before the run, not after
    options = storage.Options(
        quick=args.quick, links=None if mode == "none" else Links(args.link_rate, mode),
        keep=args.keep, command=" ".join(["mosafs", "bench", *sys.argv[2:]]))
    mib = 1 << 20
    if args.storage == "series":
        workload = Workload(args.workload, _given(args.size_mib, 16 if args.quick else 256)
                            * mib, _given(args.steps, 3 if args.quick else 5), args.change,
                            args.regions, args.insertions).check()
        configs = None
        if args.configs:
            wanted = [c.strip() for c in args.configs.split(",") if c.strip()]
            known = {c.name: c for c in storage.series_configs(storage.AVERAGES, gpu=True)}
            unknown = [c for c in wanted if c not in known]
            if unknown:
                raise ConfigError(f"unknown configuration {unknown[0]!r}; known: "
                                  + ", ".join(known))
            configs = [known[c] for c in wanted]
            if any(c.backend == "gpu" for c in configs):
                from mosafs.chunking import resolve_backend

                resolve_backend("gpu")  # asked for by name: no GPU is an error
        result = storage.run_series(options, workload, stripe_width=args.stripe_width,
                                    configs=configs)
    elif args.storage == "stripe":
        result = storage.run_stripe(options, _given(args.size_mib, 32 if args.quick else 1024)
                                    * mib, args.widths)
    else:
        result = storage.run_clients(options, _given(args.size_mib, 16 if args.quick else 100)
                                     * mib, args.writers)
    if args.plot:
        from mosafs.bench.plots import plot

        result["figures"] = [str(p) for p in plot(result, args.plot)]
    return print_result(result, args.json, storage.format_table)


def run(args: argparse.Namespace) -> int:
    return int(args.bench_run(args))


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


def _run_write(args: argparse.Namespace) -> int:
    from mosafs.bench.write import Options
    from mosafs.bench.write_run import format_table, run_benchmark
    from mosafs.procutil import setup_logging

    setup_logging(args.log_level)
    mib = 1 << 20
    # Sizes and counts given are >= 1 (their argparse types); None: the default.
    size = _given(args.size_mib, 64 if args.quick else 1024) * mib
    memory = None
    if args.memory or args.memory_mib is not None:
        memory = _given(args.memory_mib, 256 if args.quick else 4096) * mib
    repeat = _given(args.repeat, 1 if args.quick else 3)
    options = Options(size=size, memory_size=memory, repeat=repeat, keep=args.keep,
                      quick=args.quick, tls=not args.insecure, peer=args.peer,
                      chunk_tokens=args.chunk_tokens == "on",
                      peer_fsync=args.peer_fsync,
                      writers=_given(args.writers, 2 if args.quick else 4),
                      series_size=_given(args.series_mib, 16 if args.quick else 1024) * mib,
                      series_steps=_given(args.series_steps, 3 if args.quick else 4))
    result = run_benchmark(options, command=" ".join(["mosafs", *sys.argv[1:]])
                           if sys.argv[0].endswith("mosafs") else " ".join(sys.argv))
    if args.plot:
        from mosafs.bench.plots import plot

        result["figures"] = [str(p) for p in plot(result, args.plot)]
    if not args.json:
        print(format_table(result))
        print()
    json.dump(result, sys.stdout, indent=None if args.json else 2)
    print()
    return 0  # a missed target is a figure, not a failure: see "pass" in the JSON


def _run_durability(args: argparse.Namespace) -> int:
    from mosafs.bench.durability import Options, format_table, run_benchmark, to_json
    from mosafs.procutil import setup_logging

    setup_logging(args.log_level)
    result = run_benchmark(Options(files=args.files, file_mib=args.file_mib,
                                   kill_mib=args.kill_mib, keep=args.keep))
    print(to_json(result) if args.json else format_table(result))
    return 0


def _run_backends(args: argparse.Namespace) -> int:
    from mosafs.bench.backends import format_table, run_benchmark
    from mosafs.procutil import setup_logging

    setup_logging(args.log_level)
    backends, skipped = _backends(args.backends)
    result = run_benchmark(backends, args.size_mib << 20, args.keep,
                           command=" ".join(["mosafs", "bench", *sys.argv[2:]]))
    result["skipped"] = skipped
    return print_result(result, args.json, format_table)


def _backends(text: str | None) -> tuple[list[str], dict[str, str]]:
    """The hash backends to compare, and those left out with the reason. Named ones must
    all run here (gpu without one: the reason, before anything starts); by default cpu,
    and gpu where one is usable, as `bench hash` does."""
    from mosafs.chunking import BACKEND_CHOICES, resolve_backend
    from mosafs.errors import ConfigError

    if text is None:
        from mosafs.chunking.gpu import GpuBackend

        reason = GpuBackend.unavailable_reason()
        return (["cpu"], {"gpu": reason}) if reason else (["cpu", "gpu"], {})
    backends = [b.strip() for b in text.split(",") if b.strip()]
    if not backends or any(b not in BACKEND_CHOICES for b in backends):
        raise ConfigError("--backends takes a comma-separated list of "
                          + ", ".join(BACKEND_CHOICES))
    for backend in backends:
        resolve_backend(backend)
    return backends, {}
