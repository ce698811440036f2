"""Conventions every mosafs daemon follows: logging (text or JSON lines, with levels), its
identity for mutual TLS, a metrics endpoint, the ready file, stopping on signals.

The ready file: once a daemon serves, it writes a JSON object (at least "address" and "pid")
to the path given with --ready-file, atomically (temp file + rename). `mosafs up` and the
tests start daemons on port 0 and learn the real address from it.

The heap: once set up, a daemon settles its heap (the cyclic garbage collector's settings,
below) as it writes its ready file: both are `serving()`.
"""

from __future__ import annotations

import fcntl
import gc
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mosafs.errors import ConfigError

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# JSON lines: one object per record, {"time", "level", "logger", "pid", "message", ...}.
_JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s"
_JSON_RENAMES = {"asctime": "time", "levelname": "level", "name": "logger", "process": "pid"}


def python_command(module: str = "mosafs", *args: str) -> list[str]:
    """`python -P -m MODULE ARGS` with this interpreter: how every mosafs process starts
    another one (`mosafs up`'s children, the benchmarks' processes).

    -P (Python 3.11): the child's current directory is not put first on sys.path. Without
    it a folder named `mosafs` there (the directory a user cloned into, say) would be
    imported instead of the installed package. The package must be importable without the
    current directory: installed (scripts/setup.sh), or on PYTHONPATH."""
    return [sys.executable, "-P", "-m", module, *args]


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Log records at LEVEL and above to stderr, as text lines or JSON lines (FMT)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(JsonFormatter(_JSON_FIELDS, rename_fields=_JSON_RENAMES))
    else:
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # grpc and numba are chatty at INFO; their warnings still show.
    for name in ("numba", "grpc"):
        logging.getLogger(name).setLevel(logging.WARNING)


def add_daemon_arguments(parser: Any, role: str, *, metrics: bool = True) -> None:
    """--log-level, --log-format, --metrics-listen and the TLS flags of a daemon."""
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS, type=str.upper,
                        help="log level (default INFO)")
    parser.add_argument("--log-format", default="text", choices=["text", "json"],
                        help="text lines, or JSON lines with level, logger, pid, message "
                             "(default text)")
    if metrics:
        parser.add_argument("--metrics-listen", default="127.0.0.1:0", metavar="HOST:PORT",
                            help="serve Prometheus metrics on HOST:PORT/metrics (port 0: a "
                                 "free port, in the ready file; 'off': none; default "
                                 "127.0.0.1:0)")
    add_tls_arguments(parser.add_argument_group("security (docs/operations.md)"),
                      default_name=repr(role))


def add_tls_arguments(parser: Any, *, default_name: str, found: str = "") -> None:
    """--tls-dir, --tls-name and --insecure, as `tls_identity` reads them (--insecure
    defaults to None: not given, so $MOSAFS_INSECURE decides). FOUND names where the
    command looks when neither the flag nor $MOSAFS_TLS_DIR says."""
    parser.add_argument("--tls-dir", metavar="DIR",
                        help="directory of the cluster's ca.crt and NAME.crt/NAME.key "
                             f"(`mosafs certs`); default $MOSAFS_TLS_DIR{found}")
    parser.add_argument("--tls-name", metavar="NAME",
                        help=f"which certificate of the TLS directory (default {default_name})")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="plaintext gRPC without certificates (default $MOSAFS_INSECURE); "
                             "only on a network nobody else can reach")


def start_daemon(args: Any, role: str) -> str | None:
    """Logging, the TLS identity (mosafs.rpc.security) and the metrics endpoint of a
    daemon; the metrics URL (None: off). Also tunes malloc for large buffers
    (mosafs.memtune)."""
    setup_logging(args.log_level, args.log_format)
    from mosafs.memtune import tune_malloc

    tune_malloc(arena_max=2 if role == "client" else 4)  # the mount's memory is bounded
    from mosafs.rpc import security

    security.configure(tls_identity(args, role))
    listen_at = getattr(args, "metrics_listen", "off")
    if listen_at == "off":
        return None
    from mosafs import metrics

    return metrics.serve(listen_at)


def tls_identity(args: Any, role: str, *, found: str = "",
                 names: tuple[str, ...] = ()) -> Any:
    """The certificate the flags name (--tls-dir, --tls-name, --insecure; else
    $MOSAFS_TLS_DIR / $MOSAFS_INSECURE; else FOUND, a directory the caller found itself):
    None for plaintext, which must be asked for; a ConfigError when there is neither.

    A daemon (ROLE given) takes the certificate named ROLE and refuses one of another role
    (a mount may use an admin one); an admin command (ROLE "") takes the first of NAMES the
    directory has (else the last, to say it is missing), and the manager decides what that
    certificate may do."""
    from mosafs import certs

    insecure = args.insecure if args.insecure is not None else \
        os.environ.get("MOSAFS_INSECURE", "") not in ("", "0")
    if insecure and args.tls_dir:
        raise ConfigError("--insecure and --tls-dir contradict each other: choose one")
    if insecure:
        return None
    directory = args.tls_dir or os.environ.get("MOSAFS_TLS_DIR") or found
    if not directory:
        raise ConfigError("no TLS certificate: pass --tls-dir DIR (made by `mosafs certs`), "
                          "or --insecure for plaintext")
    name = args.tls_name or next(
        (n for n in names if (Path(directory) / f"{n}.crt").exists()), names[-1] if names else role)
    identity = certs.load(Path(directory), name)
    if role and identity.role != role and not (role == "client" and identity.role == "admin"):
        raise ConfigError(f"{Path(directory) / name}.crt is a {identity.role} certificate; "
                          f"this process needs a {role} one")
    return identity


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on HOST now (another process may take it before we bind it: callers
    retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries of directory PATH (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# The cyclic collector's thresholds in a daemon that serves (gen0, gen1, gen2). Python's
# (700, 10, 10) ran a collection every few creates in the mount and the manager, and a
# full one, over every module, descriptor and cache entry, every 70,000 allocations:
# 5 % of the mount's GIL time went to gc_collect_main (py-spy --native --gil, 8 processes
# creating files). Short-lived objects die by reference counting before any collection;
# what the collector is for, reference cycles (exceptions with their frames, trio's
# tasks), waits for 50,000 allocations at most in the youngest generation.
# docs/benchmarks.md, "The cyclic garbage collector".
GC_THRESHOLDS = (50_000, 20, 10)


def settle_heap() -> None:
    """Call once the daemon is set up, before it serves: everything allocated so far
    (modules, protobuf descriptors, gRPC, configuration) lives as long as the process, so
    it is moved out of the collector's reach (gc.freeze: no full collection walks it
    again, and forked children do not copy its pages on a collection), and the collector
    runs at GC_THRESHOLDS from now on."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def serving(ready_file: str | None, **payload: Any) -> None:
    """The daemon is set up and serves from now on: settle its heap, then write its ready
    file (READY_FILE, if given) with PAYLOAD."""
    settle_heap()
    write_ready_file(ready_file, **payload)


def write_ready_file(path: str | None, **payload: Any) -> None:
    if path:
        write_json_atomic(path, {"pid": os.getpid(), **payload})


def stop_event() -> threading.Event:
    """An event set by the first SIGINT or SIGTERM (call from the main thread)."""
    event = threading.Event()

    def handler(signum: int, frame: object) -> None:
        event.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return event


def wait_for_stop(event: threading.Event) -> None:
    """Block the main thread until EVENT (from stop_event) is set. Waits in short slices:
    the kernel may deliver SIGTERM to any thread (gRPC's, when the main thread already
    has a signal pending), and then only the main thread's next bytecode runs Python's
    handler; one untimed wait would sleep through it."""
    while not event.wait(0.5):
        pass


def listen(add_servicer: Callable[[Any], None], address: str, **options: Any) -> tuple[Any, int]:
    """Start a gRPC server on ADDRESS (OPTIONS: mosafs.rpc.channels.server's); a busy or
    foreign address is a ConfigError."""
    from mosafs.rpc.channels import server

    try:
        return server(add_servicer, address, **options)
    except (OSError, RuntimeError) as exc:
        raise ConfigError(f"cannot listen on {address} (in use, or not an address of this "
                          f"host): {exc}") from None


@contextmanager
def exclusive(lock_path: Path, busy_message: str) -> Iterator[None]:
    """Hold an flock on LOCK_PATH for the block. The kernel drops it when the process dies,
    so a daemon killed with SIGKILL restarts without clean-up."""
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(busy_message) from None
        yield
