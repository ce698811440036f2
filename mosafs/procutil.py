"""Conventions every mosafs daemon follows: logging format, the ready file, stopping on signals.

The ready file: once a daemon serves, it writes a JSON object (at least "address" and "pid")
to the path given with --ready-file, atomically (temp file + rename). `mosafs up` and the
tests start daemons on port 0 and learn the real address from it.
"""

from __future__ import annotations

import fcntl
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


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr, force=True)
    # grpc and numba are chatty at INFO; their warnings still show.
    for name in ("numba", "grpc"):
        logging.getLogger(name).setLevel(logging.WARNING)


def write_json_atomic(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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


_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}


def split_address(text: str, what: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT (IPv6 hosts in brackets); ConfigError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{what} must be HOST:PORT, got {text!r}")
    return host, int(port)


def advertised_address(listen_host: str, port: int, advertise: str | None = None) -> str:
    if advertise:
        return advertise
    # A wildcard address is not something a peer can dial: offer the host name instead.
    host = socket.gethostname() if listen_host in _WILDCARD_HOSTS else listen_host
    return f"{host}:{port}"


def listen(add_servicer: Callable[[Any], None], address: str) -> tuple[Any, int]:
    """Start a gRPC server on ADDRESS; a busy or foreign address is a ConfigError."""
    from mosafs.rpc.channels import server

    try:
        return server(add_servicer, address)
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
