"""`mosafs bench checkpoint`: its parser and runner (the benchmark is
mosafs.bench.checkpoint, or mosafs.bench.checkpoint_ranks with --ranks, loaded only when
it runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mosafs.argtypes import bounded_float, bounded_int
from mosafs.bench.cli_common import MAX_MIB, add_run_options, numbers, print_result


def add_checkpoint_benchmark(sub: Any) -> None:
    c = sub.add_parser(
        "checkpoint", help="mosafs.checkpoint save and load of a state dict against "
                           "torch.save and safetensors on the local disk",
        description="A state dict of --size-mib on --device, saved as a series of steps with "
                    "mosafs.checkpoint.save into a `mosafs up` mount (3 benefactors on "
                    "loopback): step 1 all new, then steps with about --changed of the "
                    "tensors new, one more saved non-blocking, one with every tensor new. "
                    "Per step: the blocking save's seconds, its total, bytes hashed, copied "
                    "from the device to the host and sent; torch.save of the same state to "
                    "the local disk (with fsync) and to the mount. Then load against "
                    "safetensors.torch.load_file from the local disk, every load checked "
                    "equal. Needs torch and safetensors. Prints one JSON object with --json.",
        epilog="examples:\n  mosafs bench checkpoint --json\n"
               "  mosafs bench checkpoint --size-mib 256 --steps 3 --device cpu\n"
               "  mosafs bench checkpoint --changed 0.25 --up-arg=--benefactors=4 "
               "--keep /tmp/ckpt-run",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--size-mib", type=bounded_int(1, MAX_MIB), default=1024,
                   help="bytes of the state dict, MiB (default 1024)")
    c.add_argument("--steps", type=bounded_int(1, 1000), default=5,
                   help="blocking steps: the first all new, the others with --changed new "
                        "(default 5); a non-blocking step and an all-new one follow")
    c.add_argument("--changed", type=bounded_float(0.0, 1.0), default=0.10,
                   help="fraction of the state dict's bytes (whole tensors) changed per "
                        "step (default 0.10)")
    c.add_argument("--device", choices=["cuda", "cpu"],
                   help="where the tensors live (default: cuda where torch sees one, else "
                        "cpu); cuda starts the cluster with --hash-backend gpu")
    c.add_argument("--local-dir", type=Path, metavar="DIR",
                   help="where the local-disk files go (default: beside the cluster's data)")
    c.add_argument("--up-arg", action="append", default=[], metavar="ARG",
                   help="passed to `mosafs up` (repeatable; write --up-arg=--flag=value)")
    c.add_argument("--seed", type=int, default=0,
                   help="the tensors' content and the changed subsets (default 0)")
    c.add_argument("--no-prepare", dest="prepare", action="store_false",
                   help="on a GPU, leave the process's one-time costs (mosafs.checkpoint."
                        "prepare) to the first save instead of paying them before step 1")
    c.add_argument("--quiet-disks", type=bounded_float(0.0, 600.0), metavar="SECONDS",
                   help="before each timed save (mosafs's and torch.save's) wait until "
                        "the machine's disks have been idle 0.5 s, at most SECONDS "
                        "(default 10; 0: no wait); the waits are in the JSON")
    c.add_argument("--ranks", type=numbers(1, 64), metavar="N,N",
                   help="instead: passes of N rank processes (one GPU each, round-robin), "
                        "each saving a --size-mib shard: steps 1..--steps then one all new, "
                        "aggregate GB/s per pass against one rank (mosafs/bench/"
                        "checkpoint_ranks.py); e.g. 1,2")
    add_run_options(c)
    c.set_defaults(bench_run=run_checkpoint)


def run_checkpoint(args: argparse.Namespace) -> int:
    from mosafs.bench.checkpoint import QUIET_S, run_checkpoint
    from mosafs.bench.checkpoint_plan import format_table
    from mosafs.procutil import setup_logging

    setup_logging(args.log_level)
    if args.ranks:
        return run_checkpoint_ranks(args)
    result = run_checkpoint(size_mib=args.size_mib, steps=args.steps, changed=args.changed,
                            device=args.device, local_dir=args.local_dir,
                            up_args=args.up_arg, keep=args.keep, seed=args.seed,
                            prepare=args.prepare,
                            quiet_s=QUIET_S if args.quiet_disks is None else args.quiet_disks,
                            command=" ".join(["mosafs", "bench", *sys.argv[2:]]))
    return print_result(result, args.json, format_table)


def run_checkpoint_ranks(args: argparse.Namespace) -> int:
    from mosafs.bench.checkpoint_ranks import format_table, run_checkpoint_ranks

    result = run_checkpoint_ranks(ranks=list(args.ranks), size_mib=args.size_mib, steps=args.steps,
                                  changed=args.changed, device=args.device,
                                  up_args=args.up_arg, keep=args.keep, seed=args.seed,
                                  command=" ".join(["mosafs", "bench", *sys.argv[2:]]))
    return print_result(result, args.json, format_table)
