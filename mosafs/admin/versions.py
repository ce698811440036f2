"""`mosafs versions PATH` and `mosafs restore PATH --version N (--to DEST | --in-place)`.

Restoring to DEST copies the version's bytes out of the mount's read-only view
(`DIR/.versions/NAME/N`), so any destination works (another mount, a local disk) and the
bytes are verified chunk by chunk on the way, like every read. Restoring in place makes the
old version the newest again on the manager (one transaction, no data moves).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mosafs.admin.cluster import base_report, base_words, sources_report
from mosafs.admin.common import (
    VERSIONS,
    MountPath,
    add_manager_arguments,
    ask,
    emit,
    progress,
    resolve,
    size,
    when,
)
from mosafs.argtypes import bounded_int
from mosafs.errors import AlreadyExists, ConfigError, NotFound

COPY_BLOCK = 4 << 20


def add_versions_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="a file inside a mounted mosafs")
    add_manager_arguments(parser)


def _file(args: argparse.Namespace) -> MountPath:
    target = resolve(args.path, args)
    if target.is_dir:
        raise ConfigError(f"{args.path} is a directory: versions belong to files")
    return target


def _versions(target: MountPath) -> list[Any]:
    from mosafs._proto import manager_pb2 as mpb

    reply = ask(target.manager, "ListVersions", mpb.ListVersionsRequest(inode=target.inode))
    return list(reply.versions)


def run_versions(args: argparse.Namespace) -> int:
    target = _file(args)
    versions = _versions(target)
    report = {"path": args.path, "inode": target.inode, "versions": [{
        "version": v.version, "commit_time_ns": v.commit_time_ns,
        "commit_time": when(v.commit_time_ns), "mtime_ns": v.mtime_ns, "size": v.size,
        "chunks": v.chunks, "new_bytes": v.new_bytes, "shared_bytes": v.shared_bytes,
        "shared_chunks": v.shared_chunks,
        "deduped_against": ({"inode": v.base_inode, "version": v.base_version}
                            if v.base_version else None),
        "base": base_report(args.path, v),
        "sources": sources_report(v),
        "committed_by": "fsync" if v.provisional else "close",
        "replaced_versions": v.replaced_versions,
    } for v in versions]}
    return emit(report, args.json, _print_versions)


def _print_versions(report: dict[str, Any]) -> None:
    if not report["versions"]:
        print(f"{report['path']}: no committed version")
        return
    print(f"{'version':>7}  {'committed':<19}  {'by':<5}  {'size':>10}  {'new':>10}  "
          f"{'shared':>10}  {'found':>10}  base")
    for v in report["versions"]:
        found = size(v["sources"]["cluster"]["bytes"]) if v["sources"] else "?"
        replaced = f" (replaced {v['replaced_versions']})" if v["replaced_versions"] else ""
        print(f"{v['version']:>7}  {v['commit_time']:<19}  {v['committed_by']:<5}  "
              f"{size(v['size']):>10}  {size(v['new_bytes']):>10}  "
              f"{size(v['shared_bytes']):>10}  {found:>10}  {base_words(v['base'])}{replaced}")


def add_restore_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="a file inside a mounted mosafs")
    parser.add_argument("--version", type=bounded_int(1), required=True, metavar="N",
                        help="the version to restore (`mosafs versions PATH` lists them)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", metavar="DEST",
                       help="write the version's bytes to DEST (a file, or a directory to put "
                            "it in under the file's name)")
    where.add_argument("--in-place", action="store_true",
                       help="make the version the newest of PATH again (a new version; "
                            "nothing is copied, the versions in between stay)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing DEST")
    add_manager_arguments(parser)


def run_restore(args: argparse.Namespace) -> int:
    target = _file(args)
    known = {v.version: v for v in _versions(target)}
    chosen = known.get(args.version)
    if chosen is None:
        listed = ", ".join(map(str, sorted(known))) or "none"
        raise NotFound(f"{args.path} has no version {args.version} (versions: {listed})")
    if args.in_place:
        return _restore_in_place(args, target)
    dest = _destination(Path(args.to), Path(args.path).name, force=args.force)
    source = Path(args.path).parent / VERSIONS / Path(args.path).name / str(args.version)
    copied = _copy(source, dest, chosen.size, mode_of=Path(args.path))
    report = {"path": args.path, "version": args.version, "to": str(dest), "bytes": copied}
    return emit(report, args.json, lambda r: print(
        f"restored version {r['version']} of {r['path']} to {r['to']} ({size(r['bytes'])})"))


def _restore_in_place(args: argparse.Namespace, target: MountPath) -> int:
    from mosafs._proto import manager_pb2 as mpb

    reply = ask(target.manager, "RestoreVersion",
                mpb.RestoreVersionRequest(inode=target.inode, version=args.version))
    report = {"path": args.path, "version": args.version, "new_version": reply.version,
              "size": reply.attr.size}
    return emit(report, args.json, lambda r: print(
        f"{r['path']}: version {r['version']} is the newest again, as version "
        f"{r['new_version']}"))


def _destination(dest: Path, name: str, *, force: bool) -> Path:
    if dest.is_dir():
        dest = dest / name
    if dest.exists() and not force:
        raise AlreadyExists(f"{dest} exists: pass --force to overwrite it")
    if not dest.parent.is_dir():
        raise NotFound(f"{dest.parent}: no such directory")
    return dest


def _copy(source: Path, dest: Path, total: int, *, mode_of: Path) -> int:
    """SOURCE to DEST through a temporary file beside it, renamed into place at the end: a
    failed restore leaves DEST as it was. DEST gets the permissions of MODE_OF."""
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".restore", dir=dest.parent)
    copied = 0
    try:
        with open(source, "rb") as src, os.fdopen(fd, "wb") as out, \
                progress(total, "B", f"restore {dest.name}") as bar:
            while block := src.read(COPY_BLOCK):
                out.write(block)
                copied += len(block)
                bar.update(len(block))
            out.flush()
            os.fsync(out.fileno())
        shutil.copymode(mode_of, tmp)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return copied
