"""Conventions every mosafs daemon follows: logging format, the ready file, stopping on signals.

The ready file: once a daemon serves, it writes a JSON object (at least "address" and "pid")
to the path given with --ready-file, atomically (temp file + rename). `mosafs up` and the
tests start daemons on port 0 and learn the real address from it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

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
