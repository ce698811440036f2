"""The per-user list of running clusters: every `mosafs up` records its data directory
there while it runs, so that admin commands find a cluster started with --data-dir
without being told (mosafs.admin.common)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("mosafs.up")  # said by `mosafs up`, as its own lines are


def running_dir() -> Path:
    """Where every running `mosafs up` of this user leaves a record of its data directory
    (PID.json: {"data_dir", "pid"}), so that admin commands find a cluster started with
    --data-dir without being told (mosafs.admin.common)."""
    import platformdirs

    return Path(platformdirs.user_state_dir("mosafs")) / "running"


def record_running(data_dir: Path) -> None:
    """Record this `up` as running on DATA_DIR (after cluster.json is written, which the
    record's readers check it against). One that cannot be written costs only the look-up:
    admin commands then need --data-dir."""
    from mosafs.procutil import write_json_atomic

    path = running_dir() / f"{os.getpid()}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"data_dir": str(data_dir.absolute()), "pid": os.getpid()})
    except OSError as exc:
        log.info("cannot record the cluster in %s (%s): admin commands need --data-dir %s",
                 path.parent, exc.strerror, data_dir)


def forget_running() -> None:
    import contextlib

    # A record left behind is recognised as stale by its readers (its pid is gone).
    with contextlib.suppress(OSError):
        (running_dir() / f"{os.getpid()}.json").unlink(missing_ok=True)
