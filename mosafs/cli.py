"""The `mosafs` console script: one subcommand per process or administrative task.

Each subcommand lives in the module that owns it and exposes `add_arguments(parser)` (or
`add_NAME_arguments`) and `run(args) -> int` (or `run_NAME`); a command with actions
(`policy set`, `pool create`, ...) names them in GROUPS, each with its own help and
examples. This file only wires them up. A MosafsError ends the command with its exit code
and a one-line message, as does a bad argument (exit code 2) or an operating-system error
(exit code 1); output into a pipe whose reader has gone ends quietly with exit code 141;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from mosafs import __version__
from mosafs.errors import MosafsError

# gRPC's own C-core log lines (one per failed TLS handshake and reconnect attempt, at INFO)
# would go to stderr beside ours: it speaks only of errors, and mosafs logs what it means.
# Read once when grpc is first imported, which is after this line.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

# name -> (module, one-line help, examples)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "up": ("mosafs.up", "run a whole single-machine cluster (manager, benefactors, mount)",
           "  mosafs up /mnt/ckpt\n"
           "  mosafs up /mnt/ckpt --data-dir /var/lib/mosafs --benefactors 4"),
    "manager": ("mosafs.manager.main", "run the metadata manager (gRPC + LMDB)",
                "  mosafs manager --data-dir /var/lib/mosafs/manager --listen 0.0.0.0:7070"),
    "benefactor": ("mosafs.benefactor.main",
                   "run a storage daemon donating a directory, or administer benefactors",
                   "  mosafs benefactor --data-dir /srv/chunks --manager mgr:7070 "
                   "--listen 0.0.0.0:7071\n"
                   "  mosafs benefactor --data-dir /srv/ssd --manager mgr:7070 --pool fast\n"
                   "  mosafs benefactor list\n  mosafs benefactor drain 3f2a9c"),
    "mount": ("mosafs.client.main", "mount a mosafs cluster with FUSE",
              "  mosafs mount /mnt/ckpt --manager mgr:7070"),
    "stats": ("mosafs.admin.cluster", "dedupe figures of the newest version of a file",
              "  mosafs stats /mnt/ckpt/app.n0.12\n  mosafs stats /mnt/ckpt/app.n0.12 --json"),
    "versions": ("mosafs.admin.versions", "list the versions of a file",
                 "  mosafs versions /mnt/ckpt/model.pt\n"
                 "  mosafs versions /mnt/ckpt/model.pt --json"),
    "restore": ("mosafs.admin.versions", "restore an older version of a file",
                "  mosafs restore /mnt/ckpt/model.pt --version 3 --to /tmp/model.v3.pt\n"
                "  mosafs restore /mnt/ckpt/model.pt --version 3 --in-place"),
    "policy": ("mosafs.admin.policy", "pruning policies and series patterns of folders",
               "  mosafs policy set /mnt/ckpt --keep-last 2\n"
               "  mosafs policy show /mnt/ckpt\n  mosafs policy apply /mnt/ckpt --dry-run"),
    "pool": ("mosafs.admin.pools", "pools of benefactors and their settings",
             "  mosafs pool create fast --replication 2 --stripe-width 2\n"
             "  mosafs pool assign /mnt/ckpt/fast fast\n  mosafs pool list"),
    "certs": ("mosafs.admin.tls", "certificates for mutual TLS: a CA and one per process",
              "  mosafs certs init --dir /etc/mosafs/tls\n"
              "  mosafs certs issue manager --role manager --dir /etc/mosafs/tls\n"
              "  mosafs certs list --dir /etc/mosafs/tls"),
    "status": ("mosafs.admin.cluster", "benefactors, free space and redundancy of a cluster",
               "  mosafs status\n  mosafs status --json\n  mosafs status /mnt/ckpt\n"
               "  mosafs status --manager mgr:7070"),
    "gc": ("mosafs.admin.cluster", "collect garbage now: delete chunks no version references",
           "  mosafs gc\n  mosafs gc --json\n  mosafs gc --manager mgr:7070"),
    "scrub": ("mosafs.admin.cluster", "verify every stored chunk now and repair bad copies",
              "  mosafs scrub\n  mosafs scrub --json\n  mosafs scrub --manager mgr:7070"),
    "fsck": ("mosafs.admin.cluster", "check the manager's metadata invariants (and repair them)",
             "  mosafs fsck\n  mosafs fsck --json\n  mosafs fsck --repair"),
    "backup": ("mosafs.admin.backup",
               "a metadata backup kept in the cluster (and recorded on every benefactor)",
               "  mosafs backup\n  mosafs backup --json\n  mosafs backup --every 6h\n"
               "  mosafs backup --manager mgr:7070"),
    "bench": ("mosafs.bench.cli",
              "benchmarks: the mount (write, backends), content addressing (hash), and the "
              "stdchk/MosaStore evaluations (series, stripe, clients)",
              "  mosafs bench write --json\n  mosafs bench write --quick\n"
              "  mosafs bench write --memory --keep /tmp/bench-run\n"
              "  mosafs bench hash --json\n  mosafs bench hash --backend cpu --quick\n"
              "  mosafs bench hash --backend gpu --json\n"
              "  mosafs bench backends --json\n"
              "  mosafs bench series --json --plot /tmp/figures\n"
              "  mosafs bench stripe --quick\n  mosafs bench clients --links none --json"),
}
# Commands with actions: name -> (module, its dict of action -> (help, examples), prefix
# of the action functions tried before the plain `add_ACTION_arguments`/`run_ACTION`).
GROUPS: dict[str, tuple[str, str, str]] = {
    "policy": ("mosafs.admin.policy", "SUBCOMMANDS", ""),
    "pool": ("mosafs.admin.pools", "POOL_SUBCOMMANDS", ""),
    "benefactor": ("mosafs.admin.pools", "BENEFACTOR_SUBCOMMANDS", "benefactor_"),
    "certs": ("mosafs.admin.tls", "SUBCOMMANDS", ""),
}


COMMAND_PARSERS: dict[str, argparse.ArgumentParser] = {}


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr and exit code 2 (the usage is in --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _subparser(sub: Any, name: str, help_text: str, examples: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".",
        epilog="examples:\n" + examples, formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser


def _function(module: Any, kind: str, name: str, prefix: str = "") -> Any:
    """module.KIND_PREFIXNAME..., e.g. run_benefactor_list, else run_list."""
    template = "add_{}_arguments" if kind == "add" else "run_{}"
    for candidate in (prefix + name, name) if prefix else (name,):
        found = getattr(module, template.format(candidate), None)
        if found is not None:
            return found
    return None


def _add_group(parser: argparse.ArgumentParser, name: str, *, optional: bool) -> None:
    module_name, table, prefix = GROUPS[name]
    module = importlib.import_module(module_name)
    actions = parser.add_subparsers(dest="action", metavar="[ACTION]" if optional else "ACTION",
                                    required=not optional)
    for action, (help_text, examples) in getattr(module, table).items():
        p = _subparser(actions, action, help_text, examples)
        _function(module, "add", action, prefix)(p)
        p.set_defaults(run=_function(module, "run", action, prefix))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ONLY (a command's name), only that command's options
    are added, so that its module alone is imported (the others keep their name and help:
    a process of one command does not import every command's dependencies)."""
    parser = _Parser(
        prog="mosafs",
        description="mosafs: a distributed file system for checkpoint data.",
        epilog="Run 'mosafs COMMAND --help' for the options and examples of a command.",
    )
    parser.add_argument("--version", action="version", version=f"mosafs {__version__}")
    parser.add_argument("--config", metavar="FILE",
                        help="TOML configuration of the daemons, and the [admin] section of the "
                             "admin commands (default $MOSAFS_CONFIG; "
                             "docs/operations.md)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    COMMAND_PARSERS.clear()
    for name, (module_name, help_text, examples) in COMMANDS.items():
        p = _subparser(sub, name, help_text, examples)
        if only is None or name == only:
            COMMAND_PARSERS[name] = p
            _add_command(p, name, module_name)
    return parser


def _add_command(p: argparse.ArgumentParser, name: str, module_name: str) -> None:
    """Command NAME's options and actions on its parser P, from its module."""
    module = importlib.import_module(module_name)
    add = _function(module, "add", name) or getattr(module, "add_arguments", None)
    if add is not None:
        add(p)  # a daemon's own options (benefactor); the actions follow
    if name in GROUPS:
        _add_group(p, name, optional=add is not None)
    if add is not None:
        p.set_defaults(run=_function(module, "run", name) or module.run)


def _command_word(argv: list[str], path: str | None = None) -> tuple[str | None, str | None]:
    """(the command ARGV names: the first word that is not an option or --config's value,
    None if none; the --config file it names, else PATH)."""
    words = iter(argv)
    for word in words:
        if word == "--config":
            path = next(words, None)
        elif word.startswith("--config="):
            path = word.split("=", 1)[1]
        elif not word.startswith("-"):
            return word, path
    return None, path


def _configure(command: str | None, path: str | None) -> None:
    """Defaults of COMMAND from the config file PATH and the environment (mosafs.config):
    before parsing, so that flags still win."""
    from mosafs import config

    if command in COMMAND_PARSERS:
        config.apply(COMMAND_PARSERS[command], command, Path(path) if path else None)


# The exit status of a command whose reader went away (`mosafs versions F | head`): that
# of a program killed by SIGPIPE (128 + 13), as `seq` or `cat` would end in the same pipe.
# Not 0: the output was cut short, which `set -o pipefail` then sees as for any program.
EXIT_BROKEN_PIPE = 128 + 13


def main(argv: list[str] | None = None) -> None:
    try:
        try:
            _main(argv)
        finally:
            sys.stdout.flush()  # a closed pipe raises here, inside the try, not at exit
    except BrokenPipeError:
        # No message, no traceback: the reader stopped reading on purpose. What is left
        # to flush goes to /dev/null, so that Python's own flush at exit fails no more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(EXIT_BROKEN_PIPE)


def _main(argv: list[str] | None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    command, config_path = _command_word(argv, os.environ.get("MOSAFS_CONFIG"))
    # A known command: its module alone (help and errors of the others are not asked for).
    parser = build_parser(command if command in COMMANDS else None)
    try:
        _configure(command, config_path)
    except MosafsError as exc:
        print(f"mosafs: {exc.message}", file=sys.stderr)
        sys.exit(exc.exit_code)
    args = parser.parse_args(argv)
    name = " ".join(filter(None, (args.command, getattr(args, "action", None),
                                  getattr(args, "benchmark", None))))
    try:
        code: Any = args.run(args)
    except MosafsError as exc:
        print(f"mosafs {name}: {exc.message}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        raise  # the reader of our output went away: main() ends quietly
    except OSError as exc:  # the local system refused (a full disk, a permission)
        print(f"mosafs {name}: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(int(code or 0))
