"""`mosafs bench durability`: how fast redundancy follows a close, and a failure.

Two measurements on `mosafs up` clusters (3 benefactors, R=2, loopback, mutual TLS):

* **close to fully redundant** (an optimistic pool: close returns after one copy): FILES
  files of FILE_MIB each are written one after another; for each, the time from close()
  returning to the manager reporting its newest version fully redundant (GetVersionStats,
  polled every POLL_S by a thread of this process while the writes go on). p50, p90, p99
  and the maximum.
* **failure** (the default, pessimistic pool): KILL_MIB of files written, then one
  benefactor SIGKILLed; the detection time (kill until `status` reports it dead: the
  benefactor lease), and the re-replication that follows: bytes copied (the manager's
  replicated-bytes counter), from detection until nothing is under-replicated, in MB/s.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mosafs.bench.procs import BenchError, UpCluster

MiB = 1 << 20
POLL_S = 0.01
TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Options:
    files: int = 100
    file_mib: int = 4
    kill_mib: int = 512
    keep: Path | None = None


def run_benchmark(options: Options) -> dict[str, Any]:
    with _workdir(options.keep) as work:
        return {
            "close_to_redundant": _close_to_redundant(work / "optimistic", options),
            "failure": _failure(work / "failure", options),
            "machine": {"cpus": os.cpu_count()},
        }


@contextmanager
def _workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="mosafs-bench-") as tmp:
        yield Path(tmp)


@contextmanager
def _cluster(work: Path, *up_args: str) -> Iterator[UpCluster]:
    cluster = UpCluster(work, ["--log-level", "WARNING", *up_args])
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


class _Manager:
    """GetVersionStats and GetClusterStatus over the cluster's admin certificate."""

    def __init__(self, cluster: UpCluster) -> None:
        from mosafs import certs
        from mosafs._proto import manager_pb2_grpc
        from mosafs.rpc import security
        from mosafs.rpc.channels import channel

        security.configure(certs.load(cluster.data_dir / "tls", "admin"))
        self._channel = channel(cluster.manager)
        self._stub = manager_pb2_grpc.ManagerStub(self._channel)

    def redundant(self, inode: int) -> bool:
        from mosafs._proto import manager_pb2 as mpb

        stats = self._stub.GetVersionStats(mpb.GetVersionStatsRequest(inode=inode), timeout=10)
        return bool(stats.fully_redundant)

    def status(self) -> Any:
        from mosafs._proto import manager_pb2 as mpb

        return self._stub.GetClusterStatus(mpb.ClusterStatusRequest(), timeout=10)

    def close(self) -> None:
        self._channel.close()


def _payload(seed: int, size: int) -> bytes:
    import blake3

    return blake3.blake3(f"durability {seed}".encode()).digest(length=size)


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        for off in range(0, len(data), MiB):
            f.write(data[off:off + MiB])


def _close_to_redundant(work: Path, options: Options) -> dict[str, Any]:
    with _cluster(work, "--write-semantics", "optimistic") as cluster:
        manager = _Manager(cluster)
        try:
            times = _watch_writes(cluster, manager, options)
        finally:
            manager.close()
    times.sort()

    def pct(p: float) -> float:
        return round(times[min(len(times) - 1, int(p * len(times)))], 3)

    return {"files": options.files, "file_mib": options.file_mib, "semantics": "optimistic",
            "p50_s": pct(0.50), "p90_s": pct(0.90), "p99_s": pct(0.99),
            "max_s": round(times[-1], 3), "poll_s": POLL_S}


def _watch_writes(cluster: UpCluster, manager: _Manager, options: Options) -> list[float]:
    """Write the files; a thread polls each closed one until it is fully redundant."""
    closed: list[tuple[int, float]] = []
    results: list[float] = []
    done = threading.Event()
    failure: list[BaseException] = []

    def watch() -> None:
        try:
            while not (done.is_set() and len(results) == len(closed)):
                if len(results) == len(closed):
                    time.sleep(POLL_S)
                    continue
                inode, at = closed[len(results)]
                while not manager.redundant(inode):
                    if time.monotonic() - at > TIMEOUT_S:
                        raise BenchError(f"inode {inode} not redundant after {TIMEOUT_S}s")
                    time.sleep(POLL_S)
                results.append(time.monotonic() - at)
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    for i in range(options.files):
        path = cluster.mountpoint / f"ckpt.{i}"
        _write(path, _payload(i, options.file_mib * MiB))
        closed.append((os.stat(path).st_ino, time.monotonic()))
        if failure:
            break
    done.set()
    watcher.join(TIMEOUT_S)
    if failure:
        raise BenchError(f"watching redundancy failed: {failure[0]}")
    return results


def _failure(work: Path, options: Options) -> dict[str, Any]:
    with _cluster(work) as cluster:
        manager = _Manager(cluster)
        try:
            return _kill_and_watch(cluster, manager, options)
        finally:
            manager.close()


def _kill_and_watch(cluster: UpCluster, manager: _Manager, options: Options) -> dict[str, Any]:
    files = max(1, options.kill_mib // 64)
    for i in range(files):
        _write(cluster.mountpoint / f"big.{i}", _payload(1000 + i, 64 * MiB))
    victim = cluster.ready["benefactors"][1]
    metrics_url = cluster.ready["metrics"]["manager"]
    copied_before = _replicated(metrics_url)
    os.kill(int(victim["pid"]), signal.SIGKILL)
    killed = time.monotonic()
    detected = backlog = None
    while True:
        status = manager.status()
        now = time.monotonic()
        dead = not next(b.alive for b in status.benefactors if b.info.id == victim["id"])
        if dead and detected is None:
            detected = now
        if dead and backlog is None and status.scanned_age_ms >= 0 \
                and status.under_replicated_chunks:
            backlog = status.replication_backlog_bytes
        if dead and status.under_replicated_chunks == 0 and status.scanned_age_ms < 500 \
                and now - detected > 0.5:  # type: ignore[operator]
            break
        if now - killed > TIMEOUT_S:
            raise BenchError(f"not redundant {TIMEOUT_S}s after the kill: {status}")
        time.sleep(0.05)
    assert detected is not None
    copied = _replicated(metrics_url) - copied_before
    repair_s = now - detected
    return {"written_mib": files * 64, "lease_s": 5.0,
            "detection_s": round(detected - killed, 2),
            "backlog_bytes_at_detection": backlog or 0,
            "copied_bytes": int(copied), "repair_s": round(repair_s, 2),
            "kill_to_redundant_s": round(now - killed, 2),
            "rereplication_mb_s": round(copied / repair_s / 1e6, 1) if repair_s > 0 else None,
            "lost_chunks": status.lost_chunks}


def _replicated(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("mosafs_manager_replicated_bytes_total "):
                return float(line.split()[1])
    return 0.0


def format_table(result: dict[str, Any]) -> str:
    c, f = result["close_to_redundant"], result["failure"]
    return "\n".join([
        f"close to fully redundant ({c['files']} files of {c['file_mib']} MiB, "
        f"{c['semantics']}): p50 {c['p50_s']} s, p90 {c['p90_s']} s, p99 {c['p99_s']} s, "
        f"max {c['max_s']} s",
        f"failure after {f['written_mib']} MiB: detected in {f['detection_s']} s "
        f"(lease {f['lease_s']} s); {f['copied_bytes'] / MiB:.0f} MiB copied in "
        f"{f['repair_s']} s ({f['rereplication_mb_s']} MB/s); fully redundant "
        f"{f['kill_to_redundant_s']} s after the kill; lost chunks: {f['lost_chunks']}",
    ])


def to_json(result: dict[str, Any]) -> str:
    return json.dumps(result, indent=2)
