"""A manager rebuilt from the benefactors alone (`mosafs manager --recover ADDR,...`,
docs/coordination.md, "Metadata backups"), when every manager and its disk is lost.

1. Every benefactor reachable lists its recovery records (mosafs.benefactor.recovery);
   the newest valid descriptor (mosafs.manager.backups) names the backup file's chunks.
   Newest by what the descriptors say (`Descriptor.order`: the snapshot's counter, log
   position and time), not by the names they were found under.
2. Each chunk is read from whichever benefactor holds it, verified against its id (and
   its length), and written in order into a work directory,
   DATA_DIR/.metadata.lmdb.recovering/data.mdb.
3. Reconciliation, on that copy: every benefactor's inventory against the restored chunk
   index. Blobs the index does not know were stored after the backup (or by writes that
   never committed): they are listed in DATA_DIR/recovery-report.json and in the log,
   and kept, not collected: a file /.mosafs/recovered/after-<backup> references every
   one of them (its bytes are those blobs, in id order), until an operator deletes it.
   Chunks the backup's versions need that no inventory holds (neither a whole copy nor
   enough fragments: moved, converted or deleted after the backup, or on a benefactor
   not reached) are listed too, with the versions they leave unreadable.
4. Only then, the report written, is the copy moved to DATA_DIR/metadata.lmdb/data.mdb.
   Any failure before leaves the data directory as it was (the work directory is
   removed), so the same command can simply be run again.

Versions committed after the backup are not in it: their names are lost, their chunks are
among the blobs kept. Chunks of the backup itself must be stored whole somewhere (a
replicas pool: the default pool's redundancy at backup time).

Domain code: the benefactors are reached through PEERS (mosafs.rpc.peers.BenefactorPeers
or a stand-in), never through grpc here.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3

from mosafs.errors import ConfigError, MosafsError, NotFound, Unavailable
from mosafs.manager.backups import RECOVERED_FOLDER, SYSTEM_FOLDER, Descriptor, decode
from mosafs.manager.metadata import ROOT_INODE, unpack_blockmap
from mosafs.manager.metadata.schema import _VKEY  # a block-map's key: (inode, version)
from mosafs.procutil import fsync_dir, write_json_atomic

log = logging.getLogger("mosafs.manager")

REPORT_FILE = "recovery-report.json"
WORK_DIR = ".metadata.lmdb.recovering"  # in DATA_DIR: the copy until it is complete
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
    # Chunks of the backup's versions that no inventory holds whole or as enough
    # fragments, and the versions that need one of them (unreadable).
    missing_chunks: list[dict[str, Any]] = field(default_factory=list)
    unreadable_versions: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"backup": self.backup, "seq": self.seq, "epoch": self.epoch,
                "backup_bytes": self.backup_bytes, "benefactors": self.benefactors,
                "unreachable": self.unreachable, "after_backup": self.after_backup,
                "after_backup_bytes": sum(b["size"] for b in self.after_backup),
                "kept_in": self.kept_in, "missing_chunks": self.missing_chunks,
                "unreadable_versions": self.unreadable_versions}


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
    # Everything is done on a copy in a work directory and moved into place last: a
    # failure part way (a benefactor's inventory stream reset) must not leave a
    # data.mdb without the file that keeps the blobs newer than the backup (a manager
    # started on it would collect them, and --recover would refuse to run again).
    work = data_dir / WORK_DIR
    shutil.rmtree(work, ignore_errors=True)  # a run killed part way left it
    made_data_dir = not data_dir.exists()
    reported = False
    try:
        _fetch(descriptor, reachable, peers, work)
        report = Report(descriptor.name, descriptor.seq, descriptor.epoch, descriptor.size,
                        unreachable=unreachable)
        with MetadataStore(work, map_size=map_size) as store:
            _reconcile(store, reachable, peers, report)
        write_json_atomic(data_dir / REPORT_FILE, report.as_dict())
        reported = True
        lmdb_dir.mkdir(parents=True, exist_ok=True)
        os.replace(work / "data.mdb", lmdb_dir / "data.mdb")
        fsync_dir(lmdb_dir)
    except BaseException as exc:
        shutil.rmtree(work, ignore_errors=True)
        if reported:
            (data_dir / REPORT_FILE).unlink(missing_ok=True)
        if made_data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
        if isinstance(exc, MosafsError):
            log.error("recovery from backup %s failed, nothing installed in %s (run it "
                      "again): %s", descriptor.name, data_dir, exc.message)
        raise
    shutil.rmtree(work, ignore_errors=True)
    return report


def _newest(addresses: Sequence[str], peers: Any) -> tuple[Descriptor, list[str], list[str]]:
    """The newest valid descriptor any benefactor keeps (by `Descriptor.order`: when its
    snapshot was taken, not its name); the reachable and unreachable addresses."""
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
    valid: list[Descriptor] = []
    for name, data in found.items():
        try:
            valid.append(decode(data))
        except MosafsError as exc:
            log.warning("recovery record %s skipped: %s", name, exc.message)
    if not valid:
        raise NotFound(f"no metadata backup is recorded on the benefactors reached "
                       f"({', '.join(reachable)}): take them with `mosafs backup`")
    return max(valid, key=lambda d: d.order), reachable, unreachable


def _fetch(descriptor: Descriptor, addresses: list[str], peers: Any, work: Path) -> None:
    """The backup's chunks, verified, into WORK/data.mdb (fsynced)."""
    work.mkdir(parents=True, exist_ok=True)
    with open(work / "data.mdb", "wb") as out:
        for i, (cid, length) in enumerate(descriptor.chunks):
            out.write(_chunk(cid, length, addresses, peers, i, len(descriptor.chunks)))
        out.flush()
        os.fsync(out.fileno())
    fsync_dir(work)


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
    by a file that references them; chunks the restored versions need that no benefactor
    holds: reported (module docstring)."""
    holders: dict[bytes, list[str]] = {}
    sizes: dict[bytes, int] = {}
    for address in addresses:
        bid = peers.benefactor_id(address)
        report.benefactors[address] = bid
        for blob, size in peers.inventory(address):
            holders.setdefault(blob, []).append(bid)
            sizes[blob] = size
    _missing(store, holders, report)  # before the after- file references more chunks
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


def _missing(store: Any, held: dict[bytes, list[str]], report: Report) -> None:
    """Referenced chunks of the restored index that no inventory in HELD holds whole, nor
    as K of its recorded fragments, and the versions needing them, into REPORT and the
    log. Without this a version whose chunks went after the backup (a conversion to
    erasure coding replaced its copies by fragments the backup does not name, and the
    copies were collected) would be restored as if it were readable."""
    missing: dict[bytes, dict[str, Any]] = {}
    after = b""
    while page := store.chunk_page(after):
        after = page[-1][0]
        for cid, rec in page:
            if not rec.refcount or cid in held:
                continue
            fragments = {bytes(f) for f in rec.fragment_ids if bytes(f) in held}
            if rec.ec_k and len(fragments) >= rec.ec_k:
                continue
            missing[cid] = {"id": cid.hex(), "size": int(rec.length),
                            "recorded_on": list(rec.benefactor_ids),
                            "fragments": f"{len(fragments)} of {len(rec.fragment_ids)} "
                                         f"held, {rec.ec_k} needed" if rec.ec_k else ""}
    report.missing_chunks = list(missing.values())
    if not missing:
        return
    report.unreadable_versions = _versions_needing(store, set(missing))
    log.error("%d chunk(s) of backup %s's versions are on no benefactor reached (neither "
              "a whole copy nor enough fragments): %d version(s) cannot be read, listed in "
              "%s: %s", len(missing), report.backup, len(report.unreadable_versions),
              REPORT_FILE, ", ".join(f"{v['path']} version {v['version']}"
                                     for v in report.unreadable_versions[:20]))


def _versions_needing(store: Any, ids: set[bytes]) -> list[dict[str, Any]]:
    """(inode, version, path) of every version whose block-map names one of IDS."""
    out = []
    with store.transaction() as tx:
        for key, raw in tx.txn.cursor(db=tx.db.blockmaps):
            lost = sorted({bytes(cid) for cid, _ in unpack_blockmap(raw)} & ids)
            if not lost:
                continue
            ino, version = _VKEY.unpack(key)
            try:
                path = tx.path_of(int(ino))
            except MosafsError:
                path = "?"
            out.append({"inode": int(ino), "version": int(version), "path": path,
                        "missing": [c.hex() for c in lost]})
    return out


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
