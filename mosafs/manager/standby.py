"""A standby manager's database (docs/standby.md): it takes a snapshot of the active
manager's database when it cannot go on from where it stands, then takes the active
manager's log entries in order: each batch is appended to the journal and synced (then
it may be confirmed), and applied to LMDB later, many batches per transaction
(`settle`), so that confirming an entry costs one small append and one flush.

A snapshot arrives in parts into DATA_DIR/metadata.incoming/data.mdb; once whole it is
synced and takes the place of DATA_DIR/metadata.lmdb by two renames (the old copy goes to
metadata.replaced and is deleted), so that a standby killed at any moment restarts with
either its old database or the whole new one, never a part. A snapshot that cannot be
written or installed (a full or failing disk) is dropped with NoSpace or Unavailable, as
a journal append that fails is: the feed starts again, and a later snapshot is tried.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import lmdb
from google.protobuf.message import DecodeError

from mosafs._proto import replication_pb2
from mosafs.errors import InvalidArgument, NoSpace, Unavailable
from mosafs.manager.metadata import MetadataStore
from mosafs.manager.metadata import journal as journal_file
from mosafs.manager.metadata.journal import JOURNAL
from mosafs.manager.metadata.replica import check_follows, copy_position
from mosafs.procutil import fsync_dir

log = logging.getLogger("mosafs.manager.standby")

STORE = "metadata.lmdb"
INCOMING = "metadata.incoming"
REPLACED = "metadata.replaced"
SETTLE_ENTRIES = 64        # entries taken are applied to LMDB once this many wait,
SETTLE_BYTES = 4 << 20     # or this many bytes of them


class Standby:
    """The database of a standby in DATA_DIR (opened at once; close() it)."""

    def __init__(self, data_dir: Path, *, map_size: int) -> None:
        self._dir = data_dir
        self._map_size = map_size
        self._closed = False
        self._journal: journal_file.Writer | None = None
        self._finish_swap()
        self._open()
        self._incoming: int | None = None  # the open snapshot file
        self._received = 0

    def _open(self) -> None:
        """Open the database (which applies a journal left by an earlier run) and start
        an empty journal beside it."""
        self.store = MetadataStore(self._dir / STORE, map_size=self._map_size)
        self._at = self.store.log_position()
        self._pending: list[replication_pb2.LogEntry] = []  # taken, not applied yet
        self._pending_bytes = 0
        try:
            self._journal = journal_file.Writer(self._dir / STORE / JOURNAL)
        except OSError as exc:
            self.store.close()
            raise _journal_error(self._dir, exc) from None

    def ready(self) -> None:
        """Open the database again where installing a snapshot failed after it was closed
        (`_install`); NoSpace or Unavailable while it still cannot be. The follower calls
        this before each connection, so that such a failure is retried, not final."""
        if self._journal is None and not self._closed:
            self._finish_swap()
            self._open()

    def close(self) -> None:
        self._closed = True
        self._drop_incoming()
        try:
            if self._journal is not None:
                self.settle()
        finally:
            self._close_journal()
            self.store.close()

    def _close_journal(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def position(self) -> tuple[int, int]:
        """(seq, epoch) of the last log entry taken; (0, 0): none (a snapshot first)."""
        return self._at

    def take(self, raw: Sequence[bytes]) -> int:
        """Take the serialized log entries RAW, the next ones of the log in order, durably
        (appended to the journal and synced); the seq reached. InvalidArgument, and
        nothing taken, for one that is malformed or does not follow."""
        seq, epoch = self._at
        entries = []
        for data in raw:
            try:
                entry = replication_pb2.LogEntry.FromString(data)
            except DecodeError as exc:
                raise InvalidArgument(f"a malformed log entry after entry {seq}: "
                                      f"{exc}") from None
            check_follows(entry, seq, epoch, self.store.sub_databases,
                          self.store.max_key_size)
            entries.append(entry)
            seq, epoch = entry.seq, entry.epoch
        size = sum(len(data) for data in raw)
        journal = self._journal
        assert journal is not None, "a closed standby takes nothing"
        if not journal.fits(raw):
            self.settle()  # the journal starts over, rather than grow
        try:
            journal.append(raw)
        except OSError as exc:
            raise _journal_error(self._dir, exc) from None
        self._pending += entries
        self._pending_bytes += size
        self._at = (seq, epoch)
        return seq

    @property
    def due(self) -> bool:
        """Whether enough entries wait to be applied that settle() should run now."""
        return len(self._pending) >= SETTLE_ENTRIES or self._pending_bytes >= SETTLE_BYTES

    @property
    def unsettled(self) -> bool:
        """Whether entries were taken and not applied yet."""
        return bool(self._pending)

    def settle(self) -> None:
        """Apply the entries taken to LMDB in one durable transaction; the journal then
        starts over (its old records follow nothing: the next open skips them)."""
        if not self._pending:
            return
        self.store.apply_log(self._pending)
        self._pending, self._pending_bytes = [], 0
        if self._journal is not None:
            self._journal.restart()

    def snapshot_part(self, part: replication_pb2.SnapshotPart) -> int | None:
        """Take one part of a snapshot; once the last is in, install it and return the seq
        it holds (None before). InvalidArgument for a part out of order or a snapshot of
        the wrong size, NoSpace or Unavailable where the disk refuses it: either way the
        snapshot received so far is dropped (the next one starts from its first part)."""
        try:
            return self._snapshot_part(part)
        except OSError as exc:
            # A full or failing disk: an error the follower reports and retries, not one
            # that ends its thread; the partial file goes, and with it the space it took.
            self._drop_incoming()
            raise _disk_error(f"the snapshot for {self._dir}", exc) from None
        except InvalidArgument:
            self._drop_incoming()
            raise

    def _snapshot_part(self, part: replication_pb2.SnapshotPart) -> int | None:
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
        view = memoryview(part.data)
        while view:  # os.write may write less than asked
            view = view[os.write(self._incoming, view):]
        self._received += len(part.data)
        if not part.done:
            return None
        if self._received != part.total_bytes:
            raise InvalidArgument(f"snapshot of {part.total_bytes} bytes ended after "
                                  f"{self._received}")
        os.fsync(self._incoming)
        fd, self._incoming = self._incoming, None
        os.close(fd)
        # Read before it takes the database's place: a snapshot that is no LMDB copy, or
        # not at the position it was announced at, would leave a data directory that
        # does not open, or a standby that is not where it says.
        try:
            held = copy_position(self._dir / INCOMING / "data.mdb")
        except lmdb.Error as exc:
            raise InvalidArgument(f"the snapshot received is no metadata database: "
                                  f"{exc}") from None
        if held != (part.seq, part.epoch):
            raise InvalidArgument(f"snapshot said entry {part.seq} of epoch {part.epoch}, "
                                  f"holds {held[0]} of epoch {held[1]}")
        self._install()
        seq, epoch = self.position()
        log.info("snapshot installed: %d bytes, at log entry %d (epoch %d)", self._received,
                 seq, epoch)
        return seq

    def _install(self) -> None:
        """The received snapshot becomes the database (two renames; see the module). The
        journal goes with the old database: the snapshot holds every entry taken. Where
        a step fails (OSError), what is on disk is made whole as at a restart
        (`_finish_swap`: the snapshot if it was already in place of the old database,
        else the old one) and the database stays closed until `ready()` opens it."""
        self._close_journal()
        self.store.close()
        live, replaced = self._dir / STORE, self._dir / REPLACED
        try:
            shutil.rmtree(replaced, ignore_errors=True)
            os.rename(live, replaced)
            os.rename(self._dir / INCOMING, live)
            fsync_dir(self._dir)
        finally:
            self._finish_swap()  # the replaced copy goes too
        self._open()

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


def _journal_error(data_dir: Path, exc: OSError) -> NoSpace | Unavailable:
    return _disk_error(f"the standby journal in {data_dir}", exc)


def _disk_error(what: str, exc: OSError) -> NoSpace | Unavailable:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return NoSpace(f"{what}: {exc.strerror}")
    return Unavailable(f"{what} cannot be written: {exc.strerror}")
