"""A standby manager's database (docs/standby.md): it takes a snapshot of the active
manager's database when it cannot go on from where it stands, then applies the active
manager's log entries in order, each batch in one durable transaction.

A snapshot arrives in parts into DATA_DIR/metadata.incoming/data.mdb; once whole it is
synced and takes the place of DATA_DIR/metadata.lmdb by two renames (the old copy goes to
metadata.replaced and is deleted), so that a standby killed at any moment restarts with
either its old database or the whole new one, never a part.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from mosafs._proto import replication_pb2
from mosafs.errors import InvalidArgument
from mosafs.manager.metadata import MetadataStore
from mosafs.procutil import fsync_dir

log = logging.getLogger("mosafs.manager.standby")

STORE = "metadata.lmdb"
INCOMING = "metadata.incoming"
REPLACED = "metadata.replaced"


class Standby:
    """The database of a standby in DATA_DIR (opened at once; close() it)."""

    def __init__(self, data_dir: Path, *, map_size: int) -> None:
        self._dir = data_dir
        self._map_size = map_size
        self._finish_swap()
        self.store = MetadataStore(data_dir / STORE, map_size=map_size)
        self._incoming: int | None = None  # the open snapshot file
        self._received = 0

    def close(self) -> None:
        self._drop_incoming()
        self.store.close()

    def position(self) -> tuple[int, int]:
        """(seq, epoch) of the last log entry applied; (0, 0): none (a snapshot first)."""
        return self.store.log_position()

    def apply(self, entries: Sequence[replication_pb2.LogEntry]) -> int:
        """Apply ENTRIES durably; the seq reached."""
        return self.store.apply_log(entries)[0]

    def snapshot_part(self, part: replication_pb2.SnapshotPart) -> int | None:
        """Take one part of a snapshot; once the last is in, install it and return the seq
        it holds (None before). InvalidArgument for a part out of order."""
        if part.offset == 0:
            self._drop_incoming()
            folder = self._dir / INCOMING
            folder.mkdir(exist_ok=True)
            self._incoming = os.open(folder / "data.mdb",
                                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            self._received = 0
        if self._incoming is None or part.offset != self._received:
            raise InvalidArgument(f"snapshot part at byte {part.offset}, expected "
                                  f"{self._received}")
        os.write(self._incoming, part.data)
        self._received += len(part.data)
        if not part.done:
            return None
        if self._received != part.total_bytes:
            raise InvalidArgument(f"snapshot of {part.total_bytes} bytes ended after "
                                  f"{self._received}")
        os.fsync(self._incoming)
        os.close(self._incoming)
        self._incoming = None
        self._install()
        seq, epoch = self.position()
        if (seq, epoch) != (part.seq, part.epoch):
            raise InvalidArgument(f"snapshot said entry {part.seq} of epoch {part.epoch}, "
                                  f"holds {seq} of epoch {epoch}")
        log.info("snapshot installed: %d bytes, at log entry %d (epoch %d)", self._received,
                 seq, epoch)
        return seq

    def _install(self) -> None:
        """The received snapshot becomes the database (two renames; see the module)."""
        self.store.close()
        live, replaced = self._dir / STORE, self._dir / REPLACED
        shutil.rmtree(replaced, ignore_errors=True)
        os.rename(live, replaced)
        os.rename(self._dir / INCOMING, live)
        fsync_dir(self._dir)
        shutil.rmtree(replaced)
        self.store = MetadataStore(live, map_size=self._map_size)

    def _finish_swap(self) -> None:
        """After a kill between the two renames: the whole snapshot is in INCOMING only if
        the live copy was already moved away; else the snapshot was partial."""
        live, incoming = self._dir / STORE, self._dir / INCOMING
        if not live.exists() and (self._dir / REPLACED).exists() and incoming.exists():
            os.rename(incoming, live)
            fsync_dir(self._dir)
        shutil.rmtree(incoming, ignore_errors=True)
        shutil.rmtree(self._dir / REPLACED, ignore_errors=True)

    def _drop_incoming(self) -> None:
        if self._incoming is not None:
            os.close(self._incoming)
            self._incoming = None
        shutil.rmtree(self._dir / INCOMING, ignore_errors=True)
