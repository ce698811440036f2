"""What every administrative command shares: finding the manager (DESIGN §9), resolving a
PATH inside a mount, calling the manager, printing a report (`--json` or for people) and
progress bars.

Every admin RPC goes through `ask`/`ask_stream`: the one place where the channel to the
manager is opened, with the credentials `identity` finds (docs/operations.md): --tls-dir
(certificate `admin`, else `client`, or --tls-name), else $MOSAFS_TLS_DIR, else the mount's
(`user.mosafs.tls` of the PATH, or of the current directory), else the `cluster.json` of
`mosafs up`; plaintext only with --insecure (or $MOSAFS_INSECURE).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mosafs.errors import ConfigError, MosafsError, NotFound

XATTR_MANAGER = "user.mosafs.manager"
XATTR_TLS = "user.mosafs.tls"
VERSIONS = ".versions"
MANAGER_ENV = "MOSAFS_MANAGER"


def add_manager_arguments(parser: argparse.ArgumentParser, *, json_flag: bool = True) -> None:
    parser.add_argument("--manager", metavar="HOST:PORT",
                        help=f"the manager (default: ${MANAGER_ENV}, else the mount of the "
                             f"PATH given, else the cluster.json of `mosafs up`)")
    parser.add_argument("--data-dir", metavar="DIR",
                        help="data directory of a `mosafs up` cluster whose cluster.json names "
                             "the manager (default: the one `mosafs up` of this user that is "
                             "running, else the per-user data directory)")
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
    from mosafs.procutil import add_tls_arguments

    add_tls_arguments(parser, default_name="admin, else client",
                      found=", else the mount's, else cluster.json's")


@dataclass(frozen=True)
class Manager:
    """Where the manager is, and the identity to reach it with (None: plaintext)."""

    address: str
    identity: Any = None


@dataclass(frozen=True)
class MountPath:
    """A path inside a mounted mosafs: the manager to ask and the inode it names."""

    path: str
    manager: Manager
    inode: int
    is_dir: bool


def resolve(path: str, args: argparse.Namespace) -> MountPath:
    """PATH as the manager knows it. A path outside every mosafs mount, or inside a
    `.versions` view, is a ConfigError; a missing one NotFound."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise NotFound(f"{path}: no such file or directory") from None
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    try:
        mount_manager = os.getxattr(path, XATTR_MANAGER).decode()
    except OSError:
        raise ConfigError(f"{path} is not inside a mosafs mount") from None
    if VERSIONS in Path(os.path.abspath(path)).parts:
        raise ConfigError(f"{path} is inside a {VERSIONS} view: name the file itself "
                          f"(its versions are listed by `mosafs versions`)")
    address = args.manager or os.environ.get(MANAGER_ENV) or mount_manager
    manager = Manager(address, identity(args, _mount_tls(path)))
    return MountPath(path, manager, st.st_ino, os.path.isdir(path))


def _mount_tls(path: str) -> str:
    try:
        return os.getxattr(path, XATTR_TLS).decode()
    except OSError:
        return ""  # a plaintext mount (or not one at all)


def find_manager(args: argparse.Namespace, path: str | None = None) -> Manager:
    """--manager, $MOSAFS_MANAGER, the mount of PATH, else the cluster.json of `mosafs up`
    (--data-dir; without it, the mount the current directory is in, else the one `mosafs
    up` of this user that is running, else the per-user data directory), else a clear
    error. (Each flag may also come from the [admin] section of `mosafs --config`.)"""
    if path:
        return resolve(path, args).manager
    explicit = args.manager or os.environ.get(MANAGER_ENV)
    # With the manager given, cluster.json is only asked for its TLS directory: several
    # clusters running is then no reason to stop.
    address, tls_dir = _cluster(args, strict=not explicit)
    if not (explicit or address):
        raise ConfigError("no manager found: no mount here, no running `mosafs up` and no "
                          "readable cluster.json; pass --manager HOST:PORT, a PATH inside a "
                          "mount, or --data-dir")
    return Manager(explicit or address, identity(args, tls_dir))


def _cluster(args: argparse.Namespace, *, strict: bool) -> tuple[str, str]:
    """(manager address, TLS directory) of the mount the current directory is in, else of
    the cluster.json of `mosafs up` (--data-dir, else the one running `up`, else the
    per-user data directory); "" for what is not found. STRICT: several running `up`s are
    a ConfigError that lists them."""
    if not getattr(args, "data_dir", None):
        try:
            return os.getxattr(".", XATTR_MANAGER).decode(), _mount_tls(".")
        except OSError:
            pass  # not inside a mount
    from mosafs.up import default_data_dir

    cluster = Path(args.data_dir) if getattr(args, "data_dir", None) else \
        _running_cluster(strict) or default_data_dir()
    try:
        info = json.loads((cluster / "cluster.json").read_text())
        # Several managers (`up --managers N`): every address, the active one followed.
        managers = info.get("managers") or [info["manager"]]
        return ",".join(map(str, managers)), str((info.get("tls") or {}).get("dir") or "")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "", ""


def _running_cluster(strict: bool) -> Path | None:
    """The data directory of the one `mosafs up` of this user that is running (its record
    in the per-user state directory, mosafs.running.record_running); None for none."""
    running = running_clusters()
    if len(running) <= 1 or not strict:
        return running[0] if len(running) == 1 else None
    raise ConfigError(f"{len(running)} mosafs clusters are running (data directories "
                      f"{', '.join(map(str, running))}): pass --data-dir DIR to pick one")


def running_clusters() -> list[Path]:
    """The data directories of this user's running `mosafs up`s, sorted. A record whose
    `up` is gone (killed before it could remove it) is dropped, and removed."""
    from mosafs.running import running_dir

    found = []
    for record in sorted(running_dir().glob("*.json")):
        data_dir = _live_record(record)
        if data_dir is None:
            record.unlink(missing_ok=True)
        else:
            found.append(data_dir)
    return sorted(set(found))


def _live_record(record: Path) -> Path | None:
    """The data directory RECORD names if its `up` still runs: the pid is alive and is the
    one in the cluster.json of that directory (a pid used again by another process is not
    the `up`, and cluster.json is removed when `up` stops)."""
    try:
        info = json.loads(record.read_text())
        data_dir, pid = Path(info["data_dir"]), int(info["pid"])
        cluster = json.loads((data_dir / "cluster.json").read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if cluster.get("pid") != pid or not _alive(pid):
        return None
    return data_dir


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


def warn(args: argparse.Namespace, text: str) -> None:
    """One line on stderr, `mosafs COMMAND ACTION: warning: TEXT`: the command did what it
    was asked (exit code 0), but what it set up will not work as one would expect."""
    name = " ".join(filter(None, (getattr(args, "command", None),
                                  getattr(args, "action", None))))
    print(f"mosafs {name}: warning: {text}", file=sys.stderr)


def identity(args: argparse.Namespace, found_tls: str) -> Any:
    """The certificate to reach the manager with: --tls-dir, $MOSAFS_TLS_DIR, else FOUND_TLS
    (the mount's or cluster.json's), its `admin` certificate if it has one, else `client`;
    None for plaintext, which must be asked for."""
    from mosafs.procutil import tls_identity

    return tls_identity(args, "", found=found_tls, names=("admin", "client"))


@contextmanager
def _stub(address: str, identity: Any) -> Iterator[Any]:
    from mosafs._proto import manager_pb2_grpc as mgrpc
    from mosafs.rpc.channels import channel

    with channel(address, identity) as ch:
        yield mgrpc.ManagerStub(ch)


def ask(manager: Manager, method: str, request: Any, timeout: float = 60) -> Any:
    """One unary call to MANAGER (the active one of several: each address in turn, where
    mosafs.rpc.managers says the call may go on); a failure raises its MosafsError."""
    from mosafs.rpc.channels import MANAGER_IDEMPOTENT
    from mosafs.rpc.errors import call
    from mosafs.rpc.managers import may_go_elsewhere, parse_managers

    addresses = parse_managers(manager.address)
    for n, address in enumerate(addresses, 1):
        with _stub(address, manager.identity) as stub:
            try:
                return call(getattr(stub, method), request, timeout=timeout)
            except MosafsError as exc:
                if n == len(addresses) or \
                        not may_go_elsewhere(exc, method in MANAGER_IDEMPOTENT):
                    raise
    raise AssertionError("unreachable")  # parse_managers gives at least one


def ask_stream(manager: Manager, method: str, request: Any, timeout: float) -> Iterator[Any]:
    """A server-streaming call to the active one of MANAGER's addresses (the streams
    are reads: any may be asked; one that refuses before its first answer is left)."""
    from mosafs.rpc.errors import stream
    from mosafs.rpc.managers import may_go_elsewhere, parse_managers

    addresses = parse_managers(manager.address)
    for n, address in enumerate(addresses, 1):
        with _stub(address, manager.identity) as stub:
            answers = stream(getattr(stub, method), request, timeout=timeout)
            try:
                first = next(answers)
            except StopIteration:
                return
            except MosafsError as exc:
                if n == len(addresses) or not may_go_elsewhere(exc, True):
                    raise
                continue
            yield first
            yield from answers
            return


def emit(report: dict[str, Any] | list[Any], as_json: bool,
         show: Callable[[Any], None]) -> int:
    """Print REPORT as one JSON value (--json) or for people; the exit code 0."""
    if as_json:
        json.dump(report, sys.stdout)
        print()
    else:
        show(report)
    return 0


def progress(total: int, unit: str, desc: str) -> Any:
    """A progress bar on stderr, drawn only when stderr is a terminal (tqdm)."""
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, unit_scale=unit == "B", unit_divisor=1024,
                desc=desc, file=sys.stderr, disable=not sys.stderr.isatty(), leave=False)


def size(n: int) -> str:
    """Bytes for people: 1.5 GiB."""
    import humanfriendly

    return str(humanfriendly.format_size(n, binary=True))


def when(ns: int) -> str:
    """A wall-clock time in ns as local ISO 8601 to the second."""
    import datetime

    return datetime.datetime.fromtimestamp(ns / 1e9).isoformat(sep=" ", timespec="seconds")
