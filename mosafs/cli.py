"""The `mosafs` console script: one subcommand per process or administrative task.

Each subcommand lives in the module that owns it and exposes `add_arguments(parser)` and
`run(args) -> int`; this file only wires them up, so importing it stays cheap. A
MosafsError ends the command with its exit code and a one-line message; anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from mosafs import __version__
from mosafs.errors import MosafsError

# name -> (module, one-line help, examples)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "up": ("mosafs.up", "run a whole single-machine cluster (manager, benefactors, mount)",
           "  mosafs up /mnt/ckpt\n"
           "  mosafs up /mnt/ckpt --data-dir /var/lib/mosafs --benefactors 4"),
    "manager": ("mosafs.manager.main", "run the metadata manager (gRPC + LMDB)",
                "  mosafs manager --data-dir /var/lib/mosafs/manager --listen 0.0.0.0:7070"),
    "benefactor": ("mosafs.benefactor.main",
                   "run a storage daemon donating a directory",
                   "  mosafs benefactor --data-dir /srv/chunks --manager mgr:7070 "
                   "--listen 0.0.0.0:7071"),
    "mount": ("mosafs.client.main", "mount a mosafs cluster with FUSE",
              "  mosafs mount /mnt/ckpt --manager mgr:7070"),
    "stats": ("mosafs.admin", "dedupe figures of the newest version of a file",
              "  mosafs stats /mnt/ckpt/app.n0.12\n  mosafs stats /mnt/ckpt/app.n0.12 --json"),
    "status": ("mosafs.admin", "benefactors, free space and redundancy of a cluster",
               "  mosafs status\n  mosafs status --json\n  mosafs status /mnt/ckpt\n"
               "  mosafs status --manager mgr:7070"),
    "gc": ("mosafs.admin", "collect garbage now: delete chunks no version references",
           "  mosafs gc\n  mosafs gc --json\n  mosafs gc --manager mgr:7070"),
    "scrub": ("mosafs.admin", "verify every stored chunk now and repair bad copies",
              "  mosafs scrub\n  mosafs scrub --json\n  mosafs scrub --manager mgr:7070"),
    "fsck": ("mosafs.admin", "check the manager's metadata invariants (and repair them)",
             "  mosafs fsck\n  mosafs fsck --json\n  mosafs fsck --repair"),
    "bench": ("mosafs.bench.cli",
              "benchmarks of the mount (write, read, backends) and of content addressing (hash)",
              "  mosafs bench write --json\n  mosafs bench write --quick\n"
              "  mosafs bench write --memory --keep /tmp/bench-run\n"
              "  mosafs bench hash --json\n  mosafs bench hash --backend cpu --quick\n"
              "  mosafs bench hash --backend gpu --json\n"
              "  mosafs bench backends --backends cpu,gpu --json"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mosafs",
        description="mosafs: a distributed file system for checkpoint data.",
        epilog="Run 'mosafs COMMAND --help' for the options and examples of a command.",
    )
    parser.add_argument("--version", action="version", version=f"mosafs {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text, examples) in COMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(
            name, help=help_text, description=help_text.capitalize() + ".",
            epilog="examples:\n" + examples, formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        add = getattr(module, f"add_{name}_arguments", None) or module.add_arguments
        add(p)
        p.set_defaults(run=getattr(module, f"run_{name}", None) or module.run)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        code: Any = args.run(args)
    except MosafsError as exc:
        print(f"mosafs {args.command}: {exc.message}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(int(code or 0))
