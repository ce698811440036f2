"""Cluster-wide commands: `mosafs status`, `stats`, `gc`, `scrub`, `fsck`."""

from __future__ import annotations

import argparse
import os
from typing import Any

from mosafs.admin.common import (
    add_manager_arguments,
    ask,
    ask_stream,
    emit,
    find_manager,
    progress,
    resolve,
)
from mosafs.errors import ConfigError


def add_stats_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="a file inside a mounted mosafs")
    add_manager_arguments(parser)


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?",
                        help="a path inside a mounted mosafs (finds its manager)")
    add_manager_arguments(parser)


def _ask_manager(args: argparse.Namespace, method: str, request: Any, timeout: float) -> Any:
    return ask(find_manager(args, args.path), method, request, timeout)


def run_status(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb

    manager = find_manager(args, args.path)
    status = ask(manager, "GetClusterStatus", mpb.ClusterStatusRequest(), 30)
    listed = ask(manager, "ListPools", mpb.ListPoolsRequest(), 30)
    return emit(status_report(status, listed.pools), args.json, _print_status)


def status_report(status: Any, pools: Any = ()) -> dict[str, Any]:
    """The `mosafs status --json` object (DESIGN §9), with each pool's redundancy."""
    from mosafs.manager.pools import scheme

    return {
        "pools": [{"name": p.settings.name, "redundancy": str(scheme(p.settings)),
                   "benefactors": len(p.benefactors)} for p in pools],
        "benefactors": [{
            "id": b.info.id, "address": b.info.address, "pool": b.info.pool,
            "alive": b.alive, "capacity_bytes": b.info.capacity_bytes,
            "free_bytes": b.info.free_bytes, "chunks": b.info.chunks,
            "stored_bytes": b.info.stored_bytes,
            "full": b.full,
            "last_heartbeat_age_ms": b.last_heartbeat_age_ms,
        } for b in status.benefactors],
        "chunks": status.chunks,
        "under_replicated_chunks": status.under_replicated_chunks,
        "replication_backlog_bytes": status.replication_backlog_bytes,
        "lost_chunks": status.lost_chunks,
        "replication_rate_bytes_s": round(status.replication_rate_bytes_s, 1),
        "time_to_full_redundancy_s": round(status.time_to_full_redundancy_s, 1),
        "figures_age_ms": status.scanned_age_ms,
        "full_scan_age_ms": status.full_scan_age_ms,
        "redundancy_unreachable": list(status.redundancy_unreachable),
        "metadata_write_transactions": status.metadata_write_transactions,
        "erasure_coding": {
            "short_chunks": status.ec_short_chunks,
            "missing_fragments": status.ec_missing_fragments,
            "lost_chunks": status.ec_lost_chunks,
            "rebuilt_fragments": status.ec_rebuilt_fragments,
            "rebuilt_bytes": status.ec_rebuilt_bytes,
            "rebuild_rate_bytes_s": round(status.ec_rebuild_rate_bytes_s, 1),
        },
        "garbage_collection": {
            "waiting_chunks": status.gc_waiting_chunks,
            "collected_chunks": status.gc_collected_chunks,
            "deleted_blobs": status.gc_deleted_blobs,
            "freed_bytes": status.gc_freed_bytes,
        },
        "managers": [{
            "member": m.member, "address": m.address,
            "role": "active" if m.active else "standby",
            "in_sync": m.in_sync, "lag_entries": m.lag_entries,
            **({"epoch": m.epoch, "log_seq": m.log_seq} if m.active else {}),
        } for m in status.managers],
        "conversions": [{
            "pool": c.pool, "redundancy": c.redundancy, "done_chunks": c.done_chunks,
            "done_bytes": c.done_bytes, "remaining_chunks": c.remaining_chunks,
            "remaining_bytes": c.remaining_bytes, "stuck_chunks": c.stuck_chunks,
            "counted": c.counted, "complete": c.counted and not c.remaining_chunks,
        } for c in status.conversions],
    }


def _print_status(report: dict[str, Any]) -> None:
    for m in report["managers"]:
        state = (f"active, epoch {m['epoch']}, log entry {m['log_seq']}" if m["role"] ==
                 "active" else f"standby, {'in sync' if m['in_sync'] else 'NOT in sync'}, "
                 f"{m['lag_entries']} entries behind")
        print(f"manager {m['member'][:12]}  {m['address'] or '?':<22} {state}")
    for p in report["pools"]:
        print(f"pool {p['name']}: {p['redundancy']}, {p['benefactors']} benefactors")
    for b in report["benefactors"]:
        state = "FULL" if b["alive"] and b["full"] else "alive" if b["alive"] else "DEAD"
        used = 1 - b["free_bytes"] / b["capacity_bytes"] if b["capacity_bytes"] else 0.0
        print(f"{b['id']}  {b['address']:<22} {state:<5}  {b['chunks']:>9} chunks  "
              f"{_size(b['free_bytes'])} free of {_size(b['capacity_bytes'])} "
              f"({used:.0%} used)")
    print(f"chunks: {report['chunks']}, under-replicated: {report['under_replicated_chunks']} "
          f"({_size(report['replication_backlog_bytes'])} to copy), "
          f"lost for now: {report['lost_chunks']}")
    ec = report["erasure_coding"]
    if ec["short_chunks"] or ec["rebuilt_fragments"]:
        print(f"erasure-coded chunks short of fragments: {ec['short_chunks']} "
              f"({ec['missing_fragments']} fragments to rebuild), fewer than K live "
              f"fragments: {ec['lost_chunks']}; rebuilt {ec['rebuilt_fragments']} "
              f"({_size(ec['rebuilt_bytes'])}, {_size(ec['rebuild_rate_bytes_s'])}/s now)")
    for c in report["conversions"]:
        total = c["done_chunks"] + c["remaining_chunks"]
        state = "done" if c["complete"] else \
            f"{c['remaining_chunks']} chunks ({_size(c['remaining_bytes'])}) to go" + (
                "" if c["counted"] else ", still counting") + (
                f", {c['stuck_chunks']} waiting for benefactors" if c["stuck_chunks"] else "")
        print(f"pool {c['pool']} converting to {c['redundancy']}: {c['done_chunks']} of "
              f"{total} chunks ({_size(c['done_bytes'])}) converted, {state}")
    gc = report["garbage_collection"]
    if gc["waiting_chunks"] or gc["collected_chunks"]:
        print(f"garbage: {gc['waiting_chunks']} unreferenced chunks waiting; collected "
              f"{gc['collected_chunks']} ({gc['deleted_blobs']} blobs, "
              f"{_size(gc['freed_bytes'])} freed) since the manager started")
    for line in report["redundancy_unreachable"]:
        print(f"cannot reach redundancy: {line}")
    if report["under_replicated_chunks"] and not report["redundancy_unreachable"]:
        eta, rate = report["time_to_full_redundancy_s"], report["replication_rate_bytes_s"]
        print(f"full redundancy in: ~{eta:.0f}s at {_size(rate)}/s" if eta >= 0 else
              "full redundancy in: unknown (nothing copied lately, or chunks without a live "
              "copy)")
    print(f"figures {_age(report['figures_age_ms'])} old; last full scan "
          f"{_age(report['full_scan_age_ms'])} ago")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _age(ms: int) -> str:
    return "unknown" if ms < 0 else f"{ms / 1000:.1f}s"


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

    target = resolve(args.path, args)
    if target.is_dir:
        raise ConfigError(f"{args.path} is a directory: stats are of a file's newest version")
    stats = ask(target.manager, "GetVersionStats",
                mpb.GetVersionStatsRequest(inode=target.inode), timeout=30)
    return emit(_stats_report(args.path, stats), args.json, _print_stats)


def _stats_report(path: str, stats: Any) -> dict[str, Any]:
    """The `mosafs stats --json` object. `sources` says where each block-map entry came
    from (null for a version committed before mosafs counted that): the base version,
    chunks this write stored, chunks found elsewhere in the cluster's index, and repeats
    of a chunk earlier in the file."""
    return {
        "path": path,
        "inode": stats.inode,
        "version": stats.version,
        "size": stats.size,
        "chunks": stats.chunks,
        "shared_chunks": stats.shared_chunks,
        # Kept as it was for scripts; `base` names the same version by its path.
        "deduped_against": ({"inode": stats.base_inode, "version": stats.base_version}
                            if stats.base_version else None),
        "base": base_report(path, stats),
        "shared_bytes": stats.shared_bytes,
        "sources": sources_report(stats),
        "new_bytes": stats.new_bytes,
        "committed_by": "fsync" if stats.provisional else "close",
        "replaced_versions": stats.replaced_versions,
        "fully_redundant": stats.fully_redundant,
        "short_chunks": stats.short_chunks,
        "lost_chunks": stats.lost_chunks,
        # How its distinct chunks are stored: "ec:4+2" (fragments), "replicas:3" (copies).
        "redundancy": [{"redundancy": r.redundancy, "chunks": r.chunks, "bytes": r.bytes}
                       for r in stats.redundancy],
    }


def sources_report(stats: Any) -> dict[str, Any] | None:
    """Where a version's block-map entries came from (VersionStats); None when it was
    committed before mosafs recorded that."""
    if not stats.sources_known:
        return None
    return {
        "base": {"chunks": stats.shared_chunks, "bytes": stats.shared_bytes},
        "stored": {"chunks": stats.stored_chunks, "bytes": stats.stored_bytes},
        "cluster": {"chunks": stats.indexed_chunks, "bytes": stats.indexed_bytes},
        "repeated": {"chunks": stats.repeated_chunks, "bytes": stats.repeated_bytes},
    }


def base_report(path: str, stats: Any) -> dict[str, Any] | None:
    """The base version named by its path: as mosafs names it (from the root of the file
    system) and on this machine (under the mount PATH is in)."""
    if not stats.base_version:
        return None
    local = None
    if stats.base_path:
        root = _mount_root(path)
        local = os.path.join(root, stats.base_path.lstrip("/")) if root else None
    return {"inode": stats.base_inode, "version": stats.base_version,
            "same_file": stats.base_inode == stats.inode, "path": stats.base_path or None,
            "local_path": local, "removed": stats.base_removed,
            "version_kept": stats.base_version_kept}


def _mount_root(path: str) -> str | None:
    """The mount point above PATH (the mosafs mount it is in), None if none is found."""
    current = os.path.abspath(path)
    while not os.path.ismount(current):
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent
    return current


def _print_stats(report: dict[str, Any]) -> None:
    print(f"{report['path']}: version {report['version']}, {report['size']} bytes in "
          f"{report['chunks']} chunks, committed by {report['committed_by']}"
          + (f" (it replaced {report['replaced_versions']} provisional versions of its "
             f"write session)" if report["replaced_versions"] else ""))
    print(f"  base: {base_words(report['base'])}")
    sources = report["sources"]
    if sources is None:
        print(f"  from the base: {report['shared_chunks']} chunks, "
              f"{_size(report['shared_bytes'])}; the rest is not broken down (committed "
              f"before mosafs recorded where chunks came from)")
    else:
        for key, words in (("base", "found in the base"),
                           ("cluster", "found elsewhere in the cluster"),
                           ("repeated", "repeated within the file"),
                           ("stored", "stored new")):
            part = sources[key]
            print(f"  {words}: {part['chunks']} chunks, {_size(part['bytes'])}")
    print(f"  new bytes sent: {report['new_bytes']} ({_size(report['new_bytes'])})")
    kinds = ", ".join(f"{r['redundancy']} ({r['chunks']} chunks, {_size(r['bytes'])})"
                      for r in report["redundancy"])
    if kinds:
        print(f"  stored as: {kinds}")
    if report["fully_redundant"]:
        print("  redundancy: full (every chunk has its pool's copies or fragments)")
    else:
        lost = f", {report['lost_chunks']} with no live copy" if report["lost_chunks"] else ""
        print(f"  redundancy: NOT full: {report['short_chunks']} chunks short of copies or "
              f"fragments{lost}")


def base_words(base: dict[str, Any] | None) -> str:
    """The base version for people, by its path."""
    if base is None:
        return "none (nothing earlier of this file or its series to dedupe against)"
    pruned = "" if base["version_kept"] else ", pruned since"
    if base["removed"]:
        return f"version {base['version']} of a file removed since (inode {base['inode']})"
    if base["same_file"]:
        return f"version {base['version']} of this file{pruned}"
    if base["path"] is None:
        return (f"version {base['version']} of inode {base['inode']}, which has no path now "
                f"(its name was removed; other hard links remain){pruned}")
    return f"{base['local_path'] or base['path']}, version {base['version']}{pruned}"


def add_scrub_arguments(parser: argparse.ArgumentParser) -> None:
    add_status_arguments(parser)


def run_scrub(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb

    final = None
    with _ScrubProgress() as bar:
        for event in ask_stream(find_manager(args, args.path), "Scrub",
                                mpb.ClusterScrubRequest(), timeout=7 * 24 * 3600):
            if event.done:
                final = event
            else:
                bar.show(event)
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


class _ScrubProgress:
    """One bar per benefactor pass (tqdm, only on a terminal), then the repair phase."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._index = -1

    def __enter__(self) -> _ScrubProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()

    def show(self, event: Any) -> None:
        if event.repairing:
            if self._bar is not None:
                self._bar.set_description("scrub: repairing from good replicas")
                self._bar.refresh()
            return
        p = event.progress
        if event.benefactor_index != self._index or self._bar is None:
            if self._bar is not None:
                self._bar.close()
            self._index = event.benefactor_index
            self._bar = progress(p.total_chunks, "chunk", f"scrub {event.benefactor_index + 1}"
                                 f"/{event.benefactors} {p.id or p.address}")
        self._bar.total = max(p.total_chunks, p.checked_chunks)
        self._bar.n = p.checked_chunks
        self._bar.set_postfix(corrupt=p.corrupt_chunks, refresh=False)
        self._bar.refresh()


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
