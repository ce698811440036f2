"""Metadata backups kept in the cluster itself (docs/coordination.md, "Metadata backups").

`mosafs backup` asks the active manager for a consistent snapshot of its store
(`snapshot`: an LMDB copy as one read transaction sees it, pages kept in place), writes it as a new
version of the ordinary file /.mosafs/backups/metadata.lmdb (chunked, deduplicated against
the previous backup, stored with the pool's redundancy), then asks the manager to
`record` that version: the manager sends a descriptor of it, a recovery record, to every
live benefactor. A manager rebuilt from the benefactors alone (`mosafs manager --recover`,
mosafs.manager.recovery) reads the newest descriptor, fetches the chunks it names and
verifies each against its id.

Which backup is the newest is decided by when its snapshot was taken, never by when it
was recorded: two `mosafs backup` runs may overlap (one with --every, one by hand) and the
one that snapshots first may record last, and a clock may step back. So each snapshot
raises a counter kept in the store's meta sub-database (`backup_counter`, a logged write:
standbys and every copy carry it) just before the copy, under a lock, so the copy holds
it and counters follow the order of the copies; a recovered store goes on from the
counter of the backup it came from. The counter, the log position and the manager's
clock at the snapshot go into the descriptor and its name, which sort the same way: a
benefactor that keeps the newest 8 names keeps the newest 8 snapshots, and recovery
orders the descriptors it decodes by `Descriptor.order` (their content, not the file
names it found them under).

Descriptor format (JSON, UTF-8), version 2:

    {"v": 2, "name": "metadata-n<counter, 12 digits>-<taken ms, 13>-<seq, 12>",
     "counter": int,                                  # the snapshot's backup counter
     "created_ms": int, "seq": int, "epoch": int,   # when it was taken, its log position
     "inode": int, "version": int, "size": int,       # the file version holding it
     "chunks": [["<64 hex id>", length], ...]}        # its block-map, in order

Version 1 (before the counter; still read, ordered before every version 2 one): no
"counter", name "metadata-<created ms, 13 digits>-<seq, 12 digits>", created_ms the time
of the record. Names of version 2 ("metadata-n...") sort after every version 1 name.

Domain code: no grpc.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mosafs.errors import InvalidArgument, MosafsError, Unavailable
from mosafs.manager.metadata.schema import _U64

log = logging.getLogger("mosafs.manager")

PART_BYTES = 1 << 20
SYSTEM_FOLDER = ".mosafs"
BACKUP_FOLDER = "backups"
BACKUP_FILE = "metadata.lmdb"
RECOVERED_FOLDER = "recovered"
RECORD_PREFIX = "metadata-"
COUNTER_KEY = b"backup_counter"  # in the meta sub-database: the last snapshot's counter


@dataclass(frozen=True)
class Descriptor:
    name: str
    created_ms: int  # version 2: when the snapshot was taken; 1: when it was recorded
    seq: int
    epoch: int
    inode: int
    version: int
    size: int
    chunks: list[tuple[bytes, int]]
    counter: int = 0  # the store's backup counter the snapshot holds; 0: version 1

    def encode(self) -> bytes:
        body: dict[str, Any] = {"v": 2 if self.counter else 1, "name": self.name}
        if self.counter:
            body["counter"] = self.counter
        body.update({"created_ms": self.created_ms, "seq": self.seq, "epoch": self.epoch,
                     "inode": self.inode, "version": self.version, "size": self.size,
                     "chunks": [[cid.hex(), n] for cid, n in self.chunks]})
        return json.dumps(body, separators=(",", ":")).encode()

    @property
    def order(self) -> tuple[int, int, int, int, str]:
        """Sorts descriptors oldest first by when their snapshots were taken: the counter
        (in the order of the copies, whatever the clock did), then the log position, then
        the time (all a version 1 descriptor has)."""
        return (self.counter, self.seq, self.epoch, self.created_ms, self.name)


def record_name(created_ms: int, seq: int, counter: int = 0) -> str:
    """A record's name; names sort as `Descriptor.order` does (the newest last), so a
    benefactor that keeps the newest names keeps the newest snapshots. COUNTER 0: a
    version 1 name."""
    if counter:
        return f"{RECORD_PREFIX}n{counter:012d}-{created_ms:013d}-{seq:012d}"
    return f"{RECORD_PREFIX}{created_ms:013d}-{seq:012d}"


def decode(data: bytes) -> Descriptor:
    """A descriptor from its bytes; InvalidArgument naming what is wrong."""
    try:
        body = json.loads(data)
        if body.get("v") not in (1, 2):
            raise ValueError(f"unknown version {body.get('v')!r}")
        counter = int(body["counter"]) if body["v"] == 2 else 0
        chunks = [(bytes.fromhex(h), int(n)) for h, n in body["chunks"]]
        out = Descriptor(str(body["name"]), int(body["created_ms"]), int(body["seq"]),
                         int(body["epoch"]), int(body["inode"]), int(body["version"]),
                         int(body["size"]), chunks, counter)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidArgument(f"not a metadata backup descriptor: {exc}") from None
    if any(len(cid) != 32 or n <= 0 for cid, n in chunks) or \
            sum(n for _, n in chunks) != out.size or not out.name.startswith(RECORD_PREFIX):
        raise InvalidArgument(f"metadata backup descriptor {out.name!r} is inconsistent")
    # A version 2 name is made from its fields: one that is not would be kept or dropped
    # by the benefactors in another order than recovery reads them in.
    if body["v"] == 2 and (counter <= 0 or out.name != record_name(out.created_ms, out.seq,
                                                                   counter)):
        raise InvalidArgument(f"metadata backup descriptor {out.name!r} does not match its "
                              f"counter and time")
    return out


@dataclass(frozen=True)
class Part:
    """One piece of a snapshot (SnapshotMetadata): every piece says the whole's size, log
    position, counter and time."""
    data: bytes
    total: int
    seq: int
    epoch: int
    counter: int
    taken_ms: int


class Backups:
    """The active manager's side: snapshots, and the records of written backups. LIVE:
    the addresses of the live benefactors; PUT(address, name, data) stores a record
    there (raises MosafsError)."""

    def __init__(self, store: Any, live: Callable[[], list[str]],
                 put: Callable[[str, str, bytes], None], spool: Path,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._live = live
        self._put = put
        self._spool = spool
        self._clock = clock
        # Held from raising the counter to the end of the copy: counters follow the order
        # of the copies (module docstring).
        self._snapping = threading.Lock()

    def snapshot(self) -> Iterator[Part]:
        """The parts of one consistent snapshot, in order."""
        self._spool.mkdir(parents=True, exist_ok=True)
        path = self._spool / f"backup-{os.getpid()}-{threading.get_ident()}.mdb"
        try:
            with self._snapping:
                counter = self._raise_counter()
                taken_ms = int(self._clock() * 1000)
                # Not compacted: unchanged pages stay where they were, so a backup shares
                # most of its chunks with the one before (a compact copy renumbers pages).
                seq, epoch = self._store.snapshot_to(path, compact=False)
            total = path.stat().st_size
            with path.open("rb") as f:
                while data := f.read(PART_BYTES):
                    yield Part(data, total, seq, epoch, counter, taken_ms)
        finally:
            path.unlink(missing_ok=True)

    def _raise_counter(self) -> int:
        """The store's backup counter, raised by one in a (logged) write of its own."""
        with self._store.transaction(write=True) as tx:
            counter = backup_counter(tx) + 1
            tx.txn.put(COUNTER_KEY, _U64.pack(counter), db=tx.db.meta)
        return counter

    def record(self, inode: int, version: int, seq: int, epoch: int, *, counter: int = 0,
               taken_ms: int = 0) -> tuple[str, int]:
        """Send the descriptor of backup file version (INODE, VERSION), which holds the
        snapshot at log position (SEQ, EPOCH) with backup COUNTER taken at TAKEN_MS (as
        `snapshot` said), to every live benefactor; (its name, how many took it).
        Unavailable where none did; InvalidArgument for a counter this store never gave
        (0 included: a record must say which snapshot it is, or recovery could not order
        it)."""
        block_map = self._store.block_map(inode, version)
        if not block_map.chunks:
            raise InvalidArgument(f"inode {inode} version {version} holds no backup: empty")
        with self._store.transaction() as tx:
            highest = backup_counter(tx)
        if not 0 < counter <= highest or not taken_ms:
            raise InvalidArgument(f"backup counter {counter} (taken at {taken_ms} ms) is "
                                  f"no snapshot of this store (its counter is {highest}): "
                                  f"record what SnapshotMetadata answered")
        created_ms = taken_ms
        name = record_name(created_ms, seq, counter)
        data = Descriptor(name, created_ms, seq, epoch, inode,
                          int(block_map.version), int(block_map.size),
                          [(bytes(c.id), int(c.length)) for c in block_map.chunks],
                          counter).encode()
        stored, failed = 0, []
        for address in self._live():
            try:
                self._put(address, name, data)
                stored += 1
            except MosafsError as exc:
                failed.append(f"{address}: {exc.message}")
        if failed:
            log.warning("metadata backup %s: record not kept by %s", name, "; ".join(failed))
        if not stored:
            raise Unavailable(f"no live benefactor kept the record of backup {name}")
        log.info("metadata backup %s (log entry %d, %d bytes) recorded on %d benefactor(s)",
                 name, seq, block_map.size, stored)
        return name, stored


def backup_counter(tx: Any) -> int:
    """The backup counter a store's transaction TX sees (0: no snapshot taken yet)."""
    raw = tx.txn.get(COUNTER_KEY, db=tx.db.meta)
    return int(_U64.unpack(raw)[0]) if raw else 0
