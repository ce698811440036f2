"""A standby's journal of log entries (docs/standby.md, "The standby's journal"): the
entries a standby confirmed before it applied them to its LMDB.

The file is DATA_DIR/metadata.lmdb/standby.journal, beside data.mdb, so that installing
a snapshot (which swaps the whole directory) discards it with the database it extended.
It is made whole at once (JOURNAL_BYTES of zeros, synced), so that appending to it later
changes no file-system metadata: an append is one write and one data flush (with
O_DIRECT where the file system allows it, which skips the page cache's copy). Each append
(a batch of entries) starts at a BLOCK boundary and is a sequence of records, then zeros
up to the next boundary:

  u32be length of the entry | u32be CRC-32 of the entry | the entry (a serialized
  LogEntry, the bytes the active manager sent)

A header of zeros (length 0 and CRC 0: the zeros after a batch) sends the reader to
the next boundary. So that the reader always finds such a header where a batch's records
end, the zeros after a batch are either none (its records end on a boundary) or at least
a header's 8 bytes: a batch whose records would end 1-7 bytes short of a boundary takes
one more block (`_span`). Once the entries are applied to LMDB the journal starts again
from offset 0, over the old records: reading stops at the first record that is cut short
or fails its CRC (a write a crash interrupted, never confirmed), and the reader of the
entries stops at the first whose seq does not follow the one before it (a record of an
earlier round).

Journals written before that rule (a standby upgraded after a SIGKILL finds one) may
have 1-7 zeros after a batch, which the reader then takes together with the next
batch's first bytes as a header that is not all zeros. So where a record does not read
whole, and everything from it to the next boundary is zeros, the reader goes on at that
boundary rather than stopping there. That can also read on past a record a crash cut
short, where the rest of its block is zeros: what the reader finds after it is then a
later part of the same torn write or an earlier round's record, and the first entry it
yields does not follow the one before it (it skips the torn one at least), which ends
the entries all the same.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from mosafs.procutil import fsync_dir

JOURNAL = "standby.journal"
JOURNAL_BYTES = 8 << 20    # the file's size when made (a round of 64 small batches takes
                           # 256 KiB, SETTLE_BYTES of entries 4 MiB); a larger batch grows it
BLOCK = 4096               # appends start at multiples of this (O_DIRECT's alignment)
_HEADER = struct.Struct(">II")


def records(entries: Iterable[bytes]) -> bytes:
    """ENTRIES (serialized LogEntry messages) as journal records, ready for one write."""
    out = bytearray()
    for entry in entries:
        out += _HEADER.pack(len(entry), zlib.crc32(entry))
        out += entry
    return bytes(out)


def read(path: Path) -> list[bytes]:
    """The entries recorded in the journal at PATH, in file order, up to its first torn
    or damaged record (old rounds' records included: see the module). No file: none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    entries: list[bytes] = []
    at = 0
    while at + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, at)
        boundary = (at // BLOCK + 1) * BLOCK
        if length == 0 and crc == 0:  # the zeros after a batch
            at = boundary
            continue
        start, end = at + _HEADER.size, at + _HEADER.size + length
        if end <= len(data) and zlib.crc32(data[start:end]) == crc:
            entries.append(data[start:end])
            at = end
            continue
        # Not a whole record. Only zeros up to the boundary: the 1-7 zeros an older
        # writer left after a batch, read with the next batch's first bytes (see the
        # module). Tried only after the record failed: a record starting a few bytes
        # before a boundary may begin with zeros too (a small length's high bytes).
        if at % BLOCK and not any(data[at:boundary]):
            at = boundary
            continue
        break
    return entries


class Writer:
    """A new, empty journal at PATH, made whole and durable at once (OSError if it
    cannot be: a full disk)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        size = JOURNAL_BYTES
        self._buffer = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _zeros(self._fd, 0, size)
            fsync_dir(path.parent)  # its name is durable before anything in it counts
            self._fd = _direct(path, self._fd)
        except BaseException:
            self.close()
            raise
        self._size = size
        self._end = 0  # where the next append goes

    def append(self, entries: Sequence[bytes]) -> None:
        """ENTRIES' records after the last append, durably; the journal grows first if
        they do not fit (OSError, and nothing recorded, if it cannot)."""
        data = records(entries)
        span = _span(len(data))
        if self._end + span > self._size:
            self._grow(self._end + span)
        if span > len(self._buffer):
            self._buffer.close()
            self._buffer = mmap.mmap(-1, span)
        self._buffer[:len(data)] = data
        self._buffer[len(data):span] = bytes(span - len(data))
        view = memoryview(self._buffer)[:span]
        try:
            written = 0
            while written < span:
                written += os.pwrite(self._fd, view[written:], self._end + written)
        finally:
            view.release()
        os.fdatasync(self._fd)
        self._end += span

    def fits(self, entries: Sequence[bytes]) -> bool:
        """Whether appending ENTRIES would leave the file's size as it is."""
        size = sum(_HEADER.size + len(entry) for entry in entries)
        return self._end + _span(size) <= self._size

    def restart(self) -> None:
        """Append from the start again (the entries before are applied to LMDB)."""
        self._end = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._buffer.close()

    def _grow(self, size: int) -> None:
        """Zeros up to SIZE, synced; on failure the file is cut back to its size."""
        try:
            plain = os.open(self._path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                _zeros(plain, self._size, size)
            finally:
                os.close(plain)
        except OSError:
            with contextlib.suppress(OSError):
                os.truncate(self._path, self._size)
            raise
        self._size = size


def _span(size: int) -> int:
    """The bytes an append of SIZE bytes of records takes: whole blocks, with either no
    zeros after the records or at least a header's worth. Fewer (1-7) would be read
    together with the next batch's first bytes as a header that is not all zeros, which
    ends the journal there and drops every later batch of the round (see the module)."""
    span = -(-size // BLOCK) * BLOCK
    if 0 < span - size < _HEADER.size:
        span += BLOCK
    return span


def _zeros(fd: int, start: int, end: int) -> None:
    """Write zeros to FD from START to END and sync them (fallocate would leave unwritten
    extents, whose first write changes metadata again)."""
    chunk = bytes(1 << 20)
    at = start
    while at < end:
        at += os.pwrite(fd, memoryview(chunk)[:min(len(chunk), end - at)], at)
    os.fsync(fd)


def _direct(path: Path, fd: int) -> int:
    """PATH opened again with O_DIRECT in place of FD where the file system allows it
    (tmpfs does not: FD stays, and appends go through the page cache)."""
    try:
        direct = os.open(path, os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError:
        return fd
    os.close(fd)
    return direct
