"""Metadata backups kept in the cluster itself (docs/coordination.md, "Metadata backups").

`mosafs backup` asks the active manager for a consistent snapshot of its store
(`snapshot`: an LMDB copy as one read transaction sees it, pages kept in place), writes it as a new
version of the ordinary file /.mosafs/backups/metadata.lmdb (chunked, deduplicated against
the previous backup, stored with the pool's redundancy), then asks the manager to
`record` that version: the manager sends a descriptor of it, a recovery record, to every
live benefactor. A manager rebuilt from the benefactors alone (`mosafs manager --recover`,
mosafs.manager.recovery) reads the newest descriptor, fetches the chunks it names and
verifies each against its id.

Descriptor format (JSON, UTF-8), version 1:

    {"v": 1, "name": "metadata-<created ms, 13 digits>-<seq, 12 digits>",
     "created_ms": int, "seq": int, "epoch": int,   # the snapshot's log position
     "inode": int, "version": int, "size": int,       # the file version holding it
     "chunks": [["<64 hex id>", length], ...]}        # its block-map, in order

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

log = logging.getLogger("mosafs.manager")

PART_BYTES = 1 << 20
SYSTEM_FOLDER = ".mosafs"
BACKUP_FOLDER = "backups"
BACKUP_FILE = "metadata.lmdb"
RECOVERED_FOLDER = "recovered"
RECORD_PREFIX = "metadata-"


@dataclass(frozen=True)
class Descriptor:
    name: str
    created_ms: int
    seq: int
    epoch: int
    inode: int
    version: int
    size: int
    chunks: list[tuple[bytes, int]]

    def encode(self) -> bytes:
        return json.dumps({
            "v": 1, "name": self.name, "created_ms": self.created_ms, "seq": self.seq,
            "epoch": self.epoch, "inode": self.inode, "version": self.version,
            "size": self.size, "chunks": [[cid.hex(), n] for cid, n in self.chunks],
        }, separators=(",", ":")).encode()


def record_name(created_ms: int, seq: int) -> str:
    """Names sort by creation time (then log position): the newest sorts last."""
    return f"{RECORD_PREFIX}{created_ms:013d}-{seq:012d}"


def decode(data: bytes) -> Descriptor:
    """A descriptor from its bytes; InvalidArgument naming what is wrong."""
    try:
        body = json.loads(data)
        if body.get("v") != 1:
            raise ValueError(f"unknown version {body.get('v')!r}")
        chunks = [(bytes.fromhex(h), int(n)) for h, n in body["chunks"]]
        out = Descriptor(str(body["name"]), int(body["created_ms"]), int(body["seq"]),
                         int(body["epoch"]), int(body["inode"]), int(body["version"]),
                         int(body["size"]), chunks)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidArgument(f"not a metadata backup descriptor: {exc}") from None
    if any(len(cid) != 32 or n <= 0 for cid, n in chunks) or \
            sum(n for _, n in chunks) != out.size or not out.name.startswith(RECORD_PREFIX):
        raise InvalidArgument(f"metadata backup descriptor {out.name!r} is inconsistent")
    return out


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

    def snapshot(self) -> Iterator[tuple[bytes, int, int, int]]:
        """(part, total bytes, seq, epoch) of one consistent snapshot, in order."""
        self._spool.mkdir(parents=True, exist_ok=True)
        path = self._spool / f"backup-{os.getpid()}-{threading.get_ident()}.mdb"
        try:
            # Not compacted: unchanged pages stay where they were, so a backup shares
            # most of its chunks with the one before (a compact copy renumbers pages).
            seq, epoch = self._store.snapshot_to(path, compact=False)
            total = path.stat().st_size
            with path.open("rb") as f:
                while data := f.read(PART_BYTES):
                    yield data, total, seq, epoch
        finally:
            path.unlink(missing_ok=True)

    def record(self, inode: int, version: int, seq: int, epoch: int) -> tuple[str, int]:
        """Send the descriptor of backup file version (INODE, VERSION) to every live
        benefactor; (its name, how many took it). Unavailable where none did."""
        block_map = self._store.block_map(inode, version)
        if not block_map.chunks:
            raise InvalidArgument(f"inode {inode} version {version} holds no backup: empty")
        created_ms = int(self._clock() * 1000)
        name = record_name(created_ms, seq)
        data = Descriptor(name, created_ms, seq, epoch, inode,
                          int(block_map.version), int(block_map.size),
                          [(bytes(c.id), int(c.length)) for c in block_map.chunks]).encode()
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
