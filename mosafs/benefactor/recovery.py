"""Recovery records (docs/coordination.md, "Metadata backups"): small named records the
manager keeps on every benefactor, each naming one metadata backup (its block-map), so
that a manager rebuilt from the benefactors alone can find the newest backup.

Format on disk: DATA_DIR/recovery/NAME, the record's bytes, written through a temporary
file, fsynced and renamed (a record is there whole or not at all). The newest KEEP
records by name are kept (names sort by when the snapshot was taken, its counter first:
the manager names them so, mosafs.manager.backups); older ones are
deleted as new ones arrive. Domain code: no grpc.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

from mosafs.errors import InvalidArgument
from mosafs.procutil import fsync_dir

DIR_NAME = "recovery"
KEEP = 8
MAX_BYTES = 8 << 20
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,95}")


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidArgument(f"a recovery record's name is 1-96 characters of a-z, 0-9, "
                              f"'.', '_' and '-', starting with a letter or digit: {name!r}")
    return name


class RecoveryRecords:
    """The records under DATA_DIR/recovery/ (thread-safe)."""

    def __init__(self, data_dir: Path, keep: int = KEEP) -> None:
        self._dir = Path(data_dir) / DIR_NAME
        self._keep = keep
        self._lock = threading.Lock()

    def put(self, name: str, data: bytes) -> int:
        """Store DATA as NAME (replacing a record of that name); how many are kept now."""
        check_name(name)
        if len(data) > MAX_BYTES:
            raise InvalidArgument(f"a recovery record holds at most {MAX_BYTES} bytes, got "
                                  f"{len(data)}")
        with self._lock:
            self._dir.mkdir(parents=True, exist_ok=True)
            tmp = self._dir / f".{name}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._dir / name)
            names = self._names()
            for old in names[:-self._keep]:
                (self._dir / old).unlink(missing_ok=True)
            fsync_dir(self._dir)
            return min(len(names), self._keep)

    def records(self) -> list[tuple[str, bytes]]:
        """(name, bytes) of every record, oldest first."""
        with self._lock:
            out = []
            for name in self._names():
                try:
                    out.append((name, (self._dir / name).read_bytes()))
                except FileNotFoundError:
                    continue
            return out

    def _names(self) -> list[str]:
        try:
            return sorted(p.name for p in self._dir.iterdir()
                          if p.is_file() and _NAME.fullmatch(p.name))
        except FileNotFoundError:
            return []

