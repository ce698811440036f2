"""Administrative commands that talk to the manager about paths inside a mount.

The manager is found from --manager, else $MOSAFS_MANAGER, else the mount itself (the
client answers the `user.mosafs.manager` attribute with the address it uses), else a clear
error (DESIGN §9).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from mosafs.errors import ConfigError, NotFound

XATTR_MANAGER = "user.mosafs.manager"


def add_stats_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="a file inside a mounted mosafs")
    parser.add_argument("--manager", help="HOST:PORT of the manager")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def find_manager(path: str, explicit: str | None) -> str:
    if explicit:
        return explicit
    if os.environ.get("MOSAFS_MANAGER"):
        return os.environ["MOSAFS_MANAGER"]
    try:
        return os.getxattr(path, XATTR_MANAGER).decode()
    except FileNotFoundError:
        raise NotFound(f"{path}: no such file or directory") from None
    except OSError:
        raise ConfigError(
            f"{path} is not inside a mosafs mount; pass --manager HOST:PORT") from None


def run_stats(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb
    from mosafs._proto import manager_pb2_grpc as mgrpc
    from mosafs.rpc.channels import channel
    from mosafs.rpc.errors import call

    address = find_manager(args.path, args.manager)
    try:
        inode = os.stat(args.path).st_ino
    except FileNotFoundError:
        raise NotFound(f"{args.path}: no such file or directory") from None
    with channel(address) as ch:
        stats = call(mgrpc.ManagerStub(ch).GetVersionStats,
                     mpb.GetVersionStatsRequest(inode=inode), timeout=30)
    report = _stats_report(args.path, stats)
    if args.json:
        json.dump(report, sys.stdout)
        print()
    else:
        _print_stats(report)
    return 0


def _stats_report(path: str, stats: Any) -> dict[str, Any]:
    return {
        "path": path,
        "inode": stats.inode,
        "version": stats.version,
        "size": stats.size,
        "chunks": stats.chunks,
        "shared_chunks": stats.shared_chunks,
        "deduped_against": ({"inode": stats.base_inode, "version": stats.base_version}
                            if stats.base_version else None),
        "new_bytes": stats.new_bytes,
    }


def _print_stats(report: dict[str, Any]) -> None:
    base = report["deduped_against"]
    against = f"version {base['version']} of inode {base['inode']}" if base else "nothing"
    print(f"{report['path']}: version {report['version']}, {report['size']} bytes in "
          f"{report['chunks']} chunks")
    print(f"  shared chunks: {report['shared_chunks']} (deduped against {against})")
    print(f"  new bytes sent: {report['new_bytes']}")
