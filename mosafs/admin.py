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
from collections.abc import Callable
from pathlib import Path
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


def emit(report: dict[str, Any], as_json: bool,
         show: Callable[[dict[str, Any]], None]) -> int:
    """Print REPORT as one JSON object (--json) or for people; the exit code 0."""
    if as_json:
        json.dump(report, sys.stdout)
        print()
    else:
        show(report)
    return 0


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?",
                        help="a path inside a mounted mosafs (finds its manager)")
    parser.add_argument("--manager", help="HOST:PORT of the manager")
    parser.add_argument("--data-dir",
                        help="data directory of a `mosafs up` cluster (its cluster.json names "
                             "the manager; default: the per-user data directory)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def manager_for_status(args: argparse.Namespace) -> str:
    """--manager, $MOSAFS_MANAGER, the mount of PATH, else the cluster.json of `mosafs up`."""
    if args.manager or os.environ.get("MOSAFS_MANAGER") or args.path:
        return find_manager(args.path or ".", args.manager)
    from mosafs.up import default_data_dir

    cluster = Path(args.data_dir) if args.data_dir else default_data_dir()
    try:
        return str(json.loads((cluster / "cluster.json").read_text())["manager"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"no manager found: no readable {cluster / 'cluster.json'}; pass "
                          f"--manager HOST:PORT, a PATH inside a mount, or --data-dir") from None


def _ask_manager(args: argparse.Namespace, method: str, request: Any, timeout: float) -> Any:
    """One unary call to the manager found by manager_for_status."""
    from mosafs._proto import manager_pb2_grpc as mgrpc
    from mosafs.rpc.channels import channel
    from mosafs.rpc.errors import call

    with channel(manager_for_status(args)) as ch:
        return call(getattr(mgrpc.ManagerStub(ch), method), request, timeout=timeout)


def run_status(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb

    status = _ask_manager(args, "GetClusterStatus", mpb.ClusterStatusRequest(), 30)
    return emit(status_report(status), args.json, _print_status)


def status_report(status: Any) -> dict[str, Any]:
    """The `mosafs status --json` object (DESIGN §9)."""
    return {
        "benefactors": [{
            "id": b.info.id, "address": b.info.address, "pool": b.info.pool,
            "alive": b.alive, "capacity_bytes": b.info.capacity_bytes,
            "free_bytes": b.info.free_bytes, "chunks": b.info.chunks,
            "stored_bytes": b.info.stored_bytes,
            "last_heartbeat_age_ms": b.last_heartbeat_age_ms,
        } for b in status.benefactors],
        "chunks": status.chunks,
        "under_replicated_chunks": status.under_replicated_chunks,
        "replication_backlog_bytes": status.replication_backlog_bytes,
        "lost_chunks": status.lost_chunks,
        "replication_rate_bytes_s": round(status.replication_rate_bytes_s, 1),
        "time_to_full_redundancy_s": round(status.time_to_full_redundancy_s, 1),
        "figures_age_ms": status.scanned_age_ms,
    }


def _print_status(report: dict[str, Any]) -> None:
    for b in report["benefactors"]:
        state = "alive" if b["alive"] else "DEAD"
        print(f"{b['id']}  {b['address']:<22} {state:<5}  {b['chunks']:>9} chunks  "
              f"{b['free_bytes'] / 2**30:8.1f} of {b['capacity_bytes'] / 2**30:.1f} GiB free")
    eta = report["time_to_full_redundancy_s"]
    print(f"chunks: {report['chunks']}, under-replicated: {report['under_replicated_chunks']} "
          f"({report['replication_backlog_bytes']} bytes to copy), "
          f"lost for now: {report['lost_chunks']}")
    if report["under_replicated_chunks"]:
        print("full redundancy in: " + (f"~{eta:.0f}s" if eta >= 0 else "unknown"))


def add_gc_arguments(parser: argparse.ArgumentParser) -> None:
    add_status_arguments(parser)


def run_gc(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb

    report = _ask_manager(args, "CollectGarbage", mpb.CollectGarbageRequest(), 600)
    emit({"benefactors": report.benefactors, "deleted_chunks": report.deleted_chunks,
          "freed_bytes": report.freed_bytes, "waiting_chunks": report.waiting_chunks,
          "failures": list(report.failures)}, args.json, _print_gc)
    return 1 if report.failures else 0


def _print_gc(report: dict[str, Any]) -> None:
    print(f"{report['benefactors']} benefactors: deleted {report['deleted_chunks']} chunks "
          f"({report['freed_bytes']} bytes); {report['waiting_chunks']} unreferenced chunks "
          f"wait for the grace period or a write in flight")
    for failure in report["failures"]:
        print(f"failed: {failure}")


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
    return emit(_stats_report(args.path, stats), args.json, _print_stats)


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


def add_scrub_arguments(parser: argparse.ArgumentParser) -> None:
    add_status_arguments(parser)


def run_scrub(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb
    from mosafs._proto import manager_pb2_grpc as mgrpc
    from mosafs.rpc.channels import channel
    from mosafs.rpc.errors import stream

    bar = _Progress() if sys.stderr.isatty() else None
    final = None
    with channel(manager_for_status(args)) as ch:
        for event in stream(mgrpc.ManagerStub(ch).Scrub, mpb.ClusterScrubRequest(),
                            timeout=7 * 24 * 3600):
            if event.done:
                final = event
            elif bar is not None:
                bar.show(event)
    if bar is not None:
        bar.clear()
    if final is None:
        raise ConfigError("the manager ended the scrub without a report")
    report = scrub_report(final)
    emit(report, args.json, _print_scrub)
    return 1 if report["unrepaired_chunks"] or report["failures"] else 0


def scrub_report(event: Any) -> dict[str, Any]:
    """The `mosafs scrub --json` object."""
    fields = ("checked_chunks", "checked_bytes", "corrupt_chunks", "missing_chunks",
              "repaired_chunks", "unrepaired_chunks")
    benefactors = [{"id": r.id, "address": r.address, **{f: getattr(r, f) for f in fields},
                    "error": r.error} for r in event.results]
    return {
        "benefactors": benefactors,
        **{f: sum(b[f] for b in benefactors) for f in fields},
        "unrepaired_ids": [bytes(cid).hex() for cid in event.unrepaired_ids],
        "failures": [f"{b['id']} ({b['address']}): {b['error']}"
                     for b in benefactors if b["error"]],
    }


class _Progress:
    """One line on stderr, redrawn in place (only on a terminal)."""

    WIDTH = 30

    def show(self, event: Any) -> None:
        if event.repairing:
            line = "scrub: every benefactor checked; repairing from good replicas..."
        else:
            p = event.progress
            total = max(p.total_chunks, p.checked_chunks, 1)
            filled = int(self.WIDTH * p.checked_chunks / total)
            line = (f"scrub: benefactor {event.benefactor_index + 1}/{event.benefactors} "
                    f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] "
                    f"{p.checked_chunks}/{p.total_chunks} chunks, "
                    f"{p.checked_bytes / 2**20:.0f} MiB, {p.corrupt_chunks} corrupt")
        sys.stderr.write("\r\033[K" + line)
        sys.stderr.flush()

    def clear(self) -> None:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def _print_scrub(report: dict[str, Any]) -> None:
    for b in report["benefactors"]:
        state = f"FAILED: {b['error']}" if b["error"] else (
            f"{b['checked_chunks']} chunks ({b['checked_bytes']} bytes) checked, "
            f"{b['corrupt_chunks']} corrupt, {b['missing_chunks']} missing, "
            f"{b['repaired_chunks']} repaired, {b['unrepaired_chunks']} not repaired")
        print(f"{b['id']}  {b['address']:<22} {state}")
    print(f"checked {report['checked_chunks']} chunks: {report['corrupt_chunks']} corrupt, "
          f"{report['missing_chunks']} missing, {report['repaired_chunks']} repaired, "
          f"{report['unrepaired_chunks']} could not be repaired")
    for cid in report["unrepaired_ids"]:
        print(f"not repaired (no sound copy reachable): {cid}")


def add_fsck_arguments(parser: argparse.ArgumentParser) -> None:
    add_status_arguments(parser)
    parser.add_argument("--repair", action="store_true",
                        help="fix what can be fixed (one write transaction); without it, "
                             "fsck only checks")


def run_fsck(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb

    reply = _ask_manager(args, "Fsck", mpb.FsckRequest(repair=args.repair), 3600)
    report = {
        "repaired": reply.repaired,
        "findings": [{"kind": f.kind, "detail": f.detail, "repairable": f.repairable}
                     for f in reply.findings],
        "inodes": reply.inodes, "versions": reply.versions, "chunks": reply.chunks,
        "dirents": reply.dirents,
    }
    emit(report, args.json, _print_fsck)
    unfixed = [f for f in reply.findings if not (reply.repaired and f.repairable)]
    return 1 if unfixed else 0


def _print_fsck(report: dict[str, Any]) -> None:
    for f in report["findings"]:
        fate = ("repaired" if report["repaired"] else "repairable") if f["repairable"] \
            else "NOT repairable"
        print(f"{f['kind']}: {f['detail']} ({fate})")
    print(f"{report['inodes']} inodes, {report['dirents']} entries, {report['versions']} "
          f"versions, {report['chunks']} chunk records: {len(report['findings'])} findings"
          + ("" if report["repaired"] or not report["findings"] else
             "; run again with --repair to fix the repairable ones"))
