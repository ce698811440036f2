"""`mosafs backup`: a consistent snapshot of the manager's metadata, kept in the cluster
itself as a new version of /.mosafs/backups/metadata.lmdb, and its record on every
benefactor (docs/coordination.md, "Metadata backups"; mosafs.manager.backups).

The snapshot streams from the active manager into a temporary file here, then goes
through the same write session a write through a mount opens (chunked, deduplicated
against the previous backup, stored with the pool's redundancy, one commit); only then
does the manager send the record that names that version to the benefactors. `--every
DURATION` goes on taking one each DURATION until stopped (SIGINT/SIGTERM).
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from mosafs.admin.common import Manager, ask, ask_stream, emit, find_manager
from mosafs.errors import InvalidArgument, MosafsError, NotFound

log = logging.getLogger("mosafs.backup")

MiB = 1 << 20
WRITE_PIECE = 8 * MiB
SNAPSHOT_TIMEOUT_S = 3600.0


def add_backup_arguments(parser: argparse.ArgumentParser) -> None:
    from mosafs.admin.common import add_manager_arguments

    add_manager_arguments(parser)
    parser.add_argument("--every", type=_duration, metavar="DURATION",
                        help="take one now and then one every DURATION (e.g. 30m, 6h; at "
                             "least 1m) until stopped; each is reported on its own line")


def _duration(text: str) -> float:
    from mosafs.admin.policy import duration_ms

    seconds = duration_ms(text) / 1000
    if seconds < 60:
        raise argparse.ArgumentTypeError(f"at least a minute between backups, got {text!r}")
    return seconds


def run_backup(args: argparse.Namespace) -> int:
    from mosafs.procutil import stop_event

    manager = find_manager(args)
    if args.every is None:
        return emit(take(manager), args.json, _show)
    stop = stop_event()
    while True:
        emit(take(manager), args.json, _show)
        if stop.wait(args.every):
            return 0


def _show(report: dict[str, Any]) -> None:
    print(f"backup {report['name']}: {report['path']} version {report['version']}, "
          f"{report['size']} bytes (log entry {report['seq']}), {report['new_bytes']} bytes "
          f"new, recorded on {report['benefactors']} benefactor(s)")


def take(manager: Manager) -> dict[str, Any]:
    """One backup; its report."""
    from mosafs._proto import manager_pb2 as mpb

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mosafs-backup-") as tmp:
        path = Path(tmp) / "metadata.mdb"
        seq, epoch, size, counter, taken_ms = _fetch(manager, path)
        inode, version, new_bytes = _write(manager, path)
    # The snapshot's counter and time go back to the manager: they, not the time of this
    # call, order the backups (mosafs.manager.backups).
    reply = ask(manager, "RecordBackup", mpb.RecordBackupRequest(
        inode=inode, version=version, seq=seq, epoch=epoch, counter=counter,
        taken_ms=taken_ms), 120)
    from mosafs.manager.backups import BACKUP_FILE, BACKUP_FOLDER, SYSTEM_FOLDER

    return {"name": reply.name, "path": f"/{SYSTEM_FOLDER}/{BACKUP_FOLDER}/{BACKUP_FILE}",
            "inode": inode, "version": version, "size": size, "seq": seq, "epoch": epoch,
            "new_bytes": new_bytes, "benefactors": reply.benefactors,
            "seconds": round(time.monotonic() - started, 3)}


def _fetch(manager: Manager, path: Path) -> tuple[int, int, int, int, int]:
    """The manager's snapshot into PATH; (seq, epoch, bytes, counter, taken ms)."""
    from mosafs._proto import manager_pb2 as mpb

    seq = epoch = total = got = counter = taken_ms = 0
    with open(path, "wb") as f:
        for part in ask_stream(manager, "SnapshotMetadata", mpb.SnapshotMetadataRequest(),
                               SNAPSHOT_TIMEOUT_S):
            seq, epoch, total = int(part.seq), int(part.epoch), int(part.total_bytes)
            counter, taken_ms = int(part.counter), int(part.taken_ms)
            f.write(part.data)
            got += len(part.data)
    if not total or got != total:
        raise InvalidArgument(f"the manager's snapshot ended after {got} of {total} bytes")
    return seq, epoch, got, counter, taken_ms


def _write(manager: Manager, path: Path) -> tuple[int, int, int]:
    """PATH as a new version of the backup file; (inode, version, bytes sent new)."""
    from mosafs.checkpoint.cluster import Client

    client = Client(manager.address, manager.identity)
    try:
        return client.submit(_write_version, path).result()
    finally:
        client.close()


async def _write_version(ctx: Any, path: Path) -> tuple[int, int, int]:
    from mosafs.client.files.writer import WriteSession
    from mosafs.manager.backups import BACKUP_FILE, BACKUP_FOLDER, SYSTEM_FOLDER
    from mosafs.manager.metadata.schema import ROOT_INODE

    folder = await _folder(ctx, ROOT_INODE, SYSTEM_FOLDER)
    folder = await _folder(ctx, folder, BACKUP_FOLDER)
    try:
        attr = await ctx.manager.lookup(folder, BACKUP_FILE)
    except NotFound:
        attr = await ctx.manager.create(folder, BACKUP_FILE, 0o600, os.geteuid(),
                                        os.getegid(), exclusive=False)
    inode = int(attr.inode)
    session = await WriteSession.create(ctx, inode)
    try:
        await session.truncate(0)
        offset = 0
        with open(path, "rb") as f:
            while piece := f.read(WRITE_PIECE):
                offset += await session.write(offset, piece)
        reply = await session.commit()
    finally:
        await session.close()
    if reply is None:
        raise MosafsError("the backup's commit made no version")
    stats = await ctx.manager.version_stats(inode, reply.version)
    return inode, int(reply.version), int(stats.new_bytes)


async def _folder(ctx: Any, parent: int, name: str) -> int:
    try:
        return int((await ctx.manager.lookup(parent, name)).inode)
    except NotFound:
        pass
    try:
        return int((await ctx.manager.mkdir(parent, name, 0o700, os.geteuid(),
                                            os.getegid())).inode)
    except MosafsError:  # made meanwhile by another backup
        return int((await ctx.manager.lookup(parent, name)).inode)

