"""A manager rebuilt from the benefactors alone (`mosafs manager --recover ADDR,...`,
docs/coordination.md, "Metadata backups"), when every manager and its disk is lost.

1. Every benefactor reachable lists its recovery records (mosafs.benefactor.recovery);
   the newest valid descriptor (mosafs.manager.backups) names the backup file's chunks.
2. Each chunk is read from whichever benefactor holds it, verified against its id (and
   its length), and written in order: the backup's bytes, a compact LMDB copy, become
   DATA_DIR/metadata.lmdb/data.mdb.
3. Reconciliation: every benefactor's inventory against the restored chunk index. Blobs
   the index does not know were stored after the backup (or by writes that never
   committed): they are listed in DATA_DIR/recovery-report.json and in the log, and
   kept, not collected: a file /.mosafs/recovered/after-<backup> references every one of
   them (its bytes are those blobs, in id order), until an operator deletes it.

Versions committed after the backup are not in it: their names are lost, their chunks are
among the blobs kept. Chunks of the backup itself must be stored whole somewhere (a
replicas pool: the default pool's redundancy at backup time).

Domain code: the benefactors are reached through PEERS (mosafs.rpc.peers.BenefactorPeers
or a stand-in), never through grpc here.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3

from mosafs.errors import ConfigError, MosafsError, NotFound, Unavailable
from mosafs.manager.backups import RECOVERED_FOLDER, SYSTEM_FOLDER, Descriptor, decode
from mosafs.manager.metadata import ROOT_INODE
from mosafs.procutil import fsync_dir, write_json_atomic

log = logging.getLogger("mosafs.manager")

REPORT_FILE = "recovery-report.json"
FETCH_TIMEOUT_S = 120.0


@dataclass
class Report:
    backup: str
    seq: int
    epoch: int
    backup_bytes: int
    benefactors: dict[str, str] = field(default_factory=dict)  # address -> id
    unreachable: list[str] = field(default_factory=list)
    after_backup: list[dict[str, Any]] = field(default_factory=list)  # blobs not indexed
    kept_in: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"backup": self.backup, "seq": self.seq, "epoch": self.epoch,
                "backup_bytes": self.backup_bytes, "benefactors": self.benefactors,
                "unreachable": self.unreachable, "after_backup": self.after_backup,
                "after_backup_bytes": sum(b["size"] for b in self.after_backup),
                "kept_in": self.kept_in}


def recover(data_dir: Path, addresses: Sequence[str], peers: Any, *,
            map_size: int) -> Report:
    """Rebuild DATA_DIR's metadata from the benefactors at ADDRESSES (module docstring)."""
    from mosafs.manager.metadata import MetadataStore

    lmdb_dir = data_dir / "metadata.lmdb"
    if (lmdb_dir / "data.mdb").exists():
        raise ConfigError(f"{data_dir} holds metadata already: --recover rebuilds a manager "
                          f"into a data directory without any")
    descriptor, reachable, unreachable = _newest(addresses, peers)
    log.info("recovering from metadata backup %s (log entry %d, %d bytes in %d chunks)",
             descriptor.name, descriptor.seq, descriptor.size, len(descriptor.chunks))
    _fetch(descriptor, reachable, peers, lmdb_dir)
    report = Report(descriptor.name, descriptor.seq, descriptor.epoch, descriptor.size,
                    unreachable=unreachable)
    with MetadataStore(lmdb_dir, map_size=map_size) as store:
        _reconcile(store, reachable, peers, report)
    write_json_atomic(data_dir / REPORT_FILE, report.as_dict())
    return report


def _newest(addresses: Sequence[str], peers: Any) -> tuple[Descriptor, list[str], list[str]]:
    """The newest valid descriptor any benefactor keeps; the reachable and unreachable
    addresses."""
    found: dict[str, bytes] = {}
    reachable, unreachable = [], []
    for address in addresses:
        try:
            records = peers.recovery_records(address)
        except MosafsError as exc:
            log.warning("benefactor %s: no recovery records read: %s", address, exc.message)
            unreachable.append(address)
            continue
        reachable.append(address)
        for name, data in records:
            found.setdefault(name, data)
    if not reachable:
        raise Unavailable("no benefactor could be reached: nothing to recover from")
    for name in sorted(found, reverse=True):
        try:
            return decode(found[name]), reachable, unreachable
        except MosafsError as exc:
            log.warning("recovery record %s skipped: %s", name, exc.message)
    raise NotFound(f"no metadata backup is recorded on the benefactors reached "
                   f"({', '.join(reachable)}): take them with `mosafs backup`")


def _fetch(descriptor: Descriptor, addresses: list[str], peers: Any, lmdb_dir: Path) -> None:
    """The backup's chunks, verified, into LMDB_DIR/data.mdb (written whole, then
    renamed into place)."""
    lmdb_dir.mkdir(parents=True, exist_ok=True)
    tmp = lmdb_dir / ".data.mdb.recovering"
    with open(tmp, "wb") as out:
        for i, (cid, length) in enumerate(descriptor.chunks):
            out.write(_chunk(cid, length, addresses, peers, i, len(descriptor.chunks)))
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, lmdb_dir / "data.mdb")
    fsync_dir(lmdb_dir)


def _chunk(cid: bytes, length: int, addresses: list[str], peers: Any, i: int,
           count: int) -> bytes:
    tried = []
    for address in addresses:
        try:
            data = bytes(peers.get(address, cid, b"", FETCH_TIMEOUT_S))
        except MosafsError as exc:
            tried.append(f"{address}: {exc.message}")
            continue
        if len(data) == length and blake3.blake3(data).digest() == cid:
            return data
        tried.append(f"{address}: a copy that does not verify")
    raise Unavailable(f"chunk {i + 1} of {count} of the backup ({cid.hex()}) is stored whole "
                      f"on no benefactor reached ({'; '.join(tried)}); an erasure-coded "
                      f"pool's backup cannot be read back without its manager")


def _reconcile(store: Any, addresses: list[str], peers: Any, report: Report) -> None:
    """Blobs on the benefactors that the restored index does not know: reported, and kept
    by a file that references them (module docstring)."""
    holders: dict[bytes, list[str]] = {}
    sizes: dict[bytes, int] = {}
    for address in addresses:
        bid = peers.benefactor_id(address)
        report.benefactors[address] = bid
        for blob, size in peers.inventory(address):
            holders.setdefault(blob, []).append(bid)
            sizes[blob] = size
    ids = sorted(holders)
    unknown = [blob for blob, (own, owners) in zip(ids, _references(store, ids), strict=True)
               if own is None and not owners]
    report.after_backup = [{"id": blob.hex(), "size": sizes[blob], "holders": holders[blob]}
                           for blob in unknown]
    if not unknown:
        log.info("reconciled: every blob on the benefactors is known to the backup")
        return
    name = f"after-{report.backup}"
    inode = _file(store, name)
    store.commit_version(inode, [(blob, sizes[blob]) for blob in unknown],
                         [(blob, holders[blob]) for blob in unknown],
                         mtime_ns=time.time_ns())
    report.kept_in = f"/{SYSTEM_FOLDER}/{RECOVERED_FOLDER}/{name}"
    log.warning("%d blobs (%d bytes) on the benefactors are newer than backup %s or of "
                "writes that never committed: kept in %s and listed in %s", len(unknown),
                sum(sizes[b] for b in unknown), report.backup, report.kept_in, REPORT_FILE)


def _references(store: Any, ids: list[bytes]) -> list[Any]:
    out: list[Any] = []
    for at in range(0, len(ids), 4096):
        out += store.blob_references(ids[at:at + 4096])
    return out


def _file(store: Any, name: str) -> int:
    """The inode of /.mosafs/recovered/NAME, made (root-owned, 0600) with its folders."""
    parent = ROOT_INODE
    for folder in (SYSTEM_FOLDER, RECOVERED_FOLDER):
        try:
            parent = int(store.lookup(parent, folder).inode)
        except NotFound:
            parent = int(store.mkdir(parent, folder, 0o700).inode)
    return int(store.create(parent, name, 0o600).inode)
