"""`mosafs bench write`: write and read bandwidth through a FUSE mount, against the ceiling
of a null pyfuse3 file system, in one run. docs/benchmarks.md ("Write and read through the
mount") describes every figure; in short:

1. the null file system (mosafs/bench/nullfs.py, its own process, the client's mount
   options): write SIZE with 1 MiB and with 4 KiB os.write calls, read it back with 1 MiB
   reads; best of --repeat runs each.
2. mosafs through `mosafs up` (manager, 3 benefactors, mount; fresh data directory):
   - write SIZE of BLAKE3-XOF bytes (generated before timing) with 1 MiB writes.
     OAB = SIZE / (open -> close returned). ASB = SIZE / (open -> the manager's version
     stats, the `mosafs stats` RPC, show the new version with SIZE bytes). close() commits
     only once every upload finished, so the two differ by the stats call.
   - the same with 4 KiB writes and another seed (nothing dedupes);
   - with --memory: a larger file (4 GiB) with 1 MiB writes on a freshly started cluster,
     for the mount's peak RSS since it started (the memory target's figure);
   - cold read of the 1 MiB-write file: the whole cluster is stopped, the page cache
     dropped, the cluster started again on the same data directory (so the client's LRU
     chunk cache is empty), the cache dropped again, one sequential pass of 1 MiB reads;
     then a warm read (same mount, again), then an untimed pass that checks the content.
   Peak RSS of the mount: VmHWM of the `mosafs mount` process, reset before the 1 MiB and
   4 KiB writes (`echo 5 > /proc/PID/clear_refs`), since mount start for --memory, with a
   sampled VmRSS maximum as a cross-check. CPU seconds (and the kernel's part) of every
   process over each phase come from /proc/PID/stat.
3. ratios against the targets, each with "pass".
4. issue 17 (mosafs/bench/phases.py says how each is measured): concurrent writers (1 and
   --writers N, a file each) on the null file system, mosafs and MooseFS; a checkpoint
   series on mosafs against the local disk; the same writes and reads on a private
   MooseFS cluster (mosafs/bench/moosefs.py; --peer); their ratios with the issue's
   targets in "comparisons" ("targets" keeps the four original ones and the RSS limit).

Every process started is stopped, and every mount detached, on success, error or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mosafs.bench import procs
from mosafs.bench.procs import BenchError, NullFs, UpCluster, memory_status, reset_peak_rss
from mosafs.bench.timing import (
    CpuMeter,
    RssSampler,
    digest,
    drop_caches,
    make_data,
    read_file,
    write_file,
)

log = logging.getLogger("mosafs.bench")

MiB = 1 << 20
GiB = 1 << 30
LARGE_WRITE = 1 * MiB
SMALL_WRITE = 4096
READ_BLOCK = 1 * MiB
RSS_HEADROOM = 256 * MiB          # the memory target: peak RSS < window + 256 MiB
DEFAULT_CACHE = 256 * MiB         # `mosafs mount --cache-mib` default
STATS_TIMEOUT = 600.0

TARGETS = {
    "oab_1m_vs_null_write_1m": 0.70,
    "asb_1m_mb_s": 300.0,
    "oab_4k_vs_oab_1m": 0.5,
    "cold_read_vs_null_read": 0.5,
}


@dataclass
class Options:
    size: int = GiB
    memory_size: int | None = None   # --memory: also write this many bytes for peak RSS
    repeat: int = 3                  # null file system runs per figure (best is reported)
    keep: Path | None = None         # keep the work directory (data, logs, result.json)
    quick: bool = False
    seed: str = "mosafs-bench-write"
    tls: bool = True                 # mutual TLS between the cluster's processes
    chunk_tokens: bool = True        # benefactors check chunk access tokens (with TLS)
    peer: str = "auto"               # auto | moosefs | none: the MooseFS peer
    peer_fsync: bool = False         # MooseFS chunkservers fsync each chunk before close
    writers: int = 4                 # concurrent writers (and always 1)
    series_size: int = GiB           # bytes of each checkpoint series step
    series_steps: int = 4


# Signals that stopped the run, as long as _signals_interrupt is active. Python raises a
# signal's KeyboardInterrupt wherever the main thread is, and inside a callback that
# swallows exceptions (an import's module-lock callback, a __del__) it is printed
# ("Exception ignored in ...") and lost: the run went on to its end. progress(), called
# between the run's steps, raises it again, except while processes are being stopped
# (_uninterrupted, which holds signals off itself).
_INTERRUPTED: list[int] = []
_HOLDING = [0]  # depth of _uninterrupted blocks


def progress(message: str) -> None:
    if _INTERRUPTED and not _HOLDING[0]:
        raise KeyboardInterrupt(f"signal {_INTERRUPTED[0]} (raised again: it was lost)")
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# -- the run ----------------------------------------------------------------------------------

@contextlib.contextmanager
def _work_dir(keep: Path | None, prefix: str = "mosafs-bench-") -> Iterator[Path]:
    if keep is not None:
        keep = keep.absolute()
        if keep.exists() and any(keep.iterdir()):
            raise BenchError(f"--keep {keep}: the directory must be empty or absent")
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield workdir
    finally:
        mounted = [p for pattern in ("*mnt", "*/*mnt") for p in workdir.glob(pattern)
                   if os.path.ismount(p)]
        if mounted:  # never rmtree into a mount
            log.error("still mounted, %s kept: %s", workdir, mounted)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _interrupt(signum: int, frame: object) -> None:
    _INTERRUPTED.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP stop the run, so every clean-up path runs; one whose
    KeyboardInterrupt was lost is raised again at the next progress() (_INTERRUPTED)."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, _interrupt) for s in signals}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        _INTERRUPTED.clear()


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """Hold off SIGINT/SIGTERM while stopping processes: a second Ctrl-C must not leave a
    half-stopped cluster behind. A signal that arrives meanwhile is not lost: it stops the
    run (KeyboardInterrupt) once the block is done."""
    arrived: list[int] = []

    def later(signum: int, frame: object) -> None:
        arrived.append(signum)

    old = {s: signal.signal(s, later) for s in (signal.SIGINT, signal.SIGTERM)}
    _HOLDING[0] += 1
    try:
        yield
    finally:
        _HOLDING[0] -= 1
        for s, handler in old.items():
            signal.signal(s, handler)
    if arrived:
        raise KeyboardInterrupt(f"signal {arrived[0]} (held off while stopping processes)")


def _check_all_stopped() -> dict[str, Any]:
    """Every process this run started, and whether any outlived its phase (then stopped)."""
    left = [pid for _, pid in procs.STARTED if procs.alive(pid)]
    if left:
        log.error("processes %s outlived their phase; stopping them", left)
        procs.kill_pids(left)
    return {"started": [{"name": n, "pid": p} for n, p in procs.STARTED],
            "left_running": left}


# -- the null file system -----------------------------------------------------------------------

def _null_phase(workdir: Path, data: bytes, options: Options) -> dict[str, Any]:
    from mosafs.bench.nullfs import read_stats

    workdir.mkdir(parents=True, exist_ok=True)
    fs = NullFs(workdir)
    progress("null file system: starting")
    try:
        fs.start()
        out: dict[str, Any] = {"pid": fs.pid}
        for name, block in (("write_1m", LARGE_WRITE), ("write_4k", SMALL_WRITE)):
            runs = []
            before = read_stats(fs.path)
            write_file(fs.path, data, block)  # warm-up
            with CpuMeter(lambda: {"nullfs": fs.pid}) as cpu:
                for _ in range(options.repeat):
                    t = write_file(fs.path, data, block)
                    runs.append(t.mb_s(t.closed))
            after = read_stats(fs.path)
            out[name] = {
                "write_bytes": block,
                "mb_s": round(max(runs), 1),
                "runs_mb_s": [round(r, 1) for r in runs],
                "fuse_requests_per_run": _request_delta(before, after, options.repeat),
                "cpu": cpu.result,
            }
            progress(f"null {name}: {max(runs):.0f} MB/s")
        runs = []
        read_file(fs.path, READ_BLOCK)  # warm-up
        before = read_stats(fs.path)
        with CpuMeter(lambda: {"nullfs": fs.pid}) as cpu:
            for _ in range(options.repeat):
                r = read_file(fs.path, READ_BLOCK)
                if r.size != options.size:
                    raise BenchError(f"null read gave {r.size} bytes, not {options.size}")
                runs.append(r.mb_s)
        after = read_stats(fs.path)
        out["read_1m"] = {
            "read_bytes": READ_BLOCK,
            "mb_s": round(max(runs), 1),
            "runs_mb_s": [round(r, 1) for r in runs],
            "fuse_requests_per_run": _request_delta(before, after, options.repeat),
            "cpu": cpu.result,
        }
        out["largest_fuse_write_bytes"] = after["write_max"]
        out["largest_fuse_read_bytes"] = after["read_max"]
        progress(f"null read_1m: {max(runs):.0f} MB/s")
        return out
    finally:
        with _uninterrupted():
            fs.stop()


def _request_delta(before: dict[str, Any], after: dict[str, Any], runs: int) -> dict[str, float]:
    names = set(before["requests"]) | set(after["requests"])
    delta = {n: (after["requests"].get(n, 0) - before["requests"].get(n, 0)) / runs
             for n in sorted(names)}
    return {n: round(v, 1) for n, v in delta.items() if v}


# -- mosafs ---------------------------------------------------------------------------------

class _Stats:
    """GetVersionStats (what `mosafs stats PATH --json` prints) over one channel."""

    def __init__(self, manager: str, tls_dir: Path | None) -> None:
        import grpc

        from mosafs import certs
        from mosafs._proto import manager_pb2 as mpb
        from mosafs._proto import manager_pb2_grpc as mgrpc
        from mosafs.rpc.channels import channel

        self._mpb = mpb
        # `mosafs up` made the cluster's certificates: this process is its administrator.
        self._channel = channel(manager, certs.load(tls_dir, "admin") if tls_dir else None)
        grpc.channel_ready_future(self._channel).result(timeout=30)
        self._stub = mgrpc.ManagerStub(self._channel)

    def get(self, inode: int) -> dict[str, Any]:
        from mosafs.rpc.errors import call

        s = call(self._stub.GetVersionStats,
                 self._mpb.GetVersionStatsRequest(inode=inode), timeout=30)
        return {"version": s.version, "size": s.size, "chunks": s.chunks,
                "shared_chunks": s.shared_chunks, "new_bytes": s.new_bytes}

    def close(self) -> None:
        self._channel.close()


class _Mosafs:
    """A running `mosafs up` cluster, restartable on the same data directory."""

    def __init__(self, workdir: Path, up_args: list[str] | None = None, *,
                 tls: bool = True) -> None:
        self.tls = tls
        self.cluster = UpCluster(workdir, [*(up_args or []), *([] if tls else ["--insecure"])])
        self.stats: _Stats | None = None

    def start(self) -> None:
        t = time.perf_counter()
        self.cluster.start()
        self.stats = _Stats(self.cluster.manager,
                            self.cluster.data_dir / "tls" if self.tls else None)
        progress(f"mosafs up: ready in {time.perf_counter() - t:.1f}s "
                 f"(mount pid {self.cluster.mount_pid})")

    def stop(self) -> None:
        with _uninterrupted():
            if self.stats is not None:
                self.stats.close()
                self.stats = None
            self.cluster.stop()

    @property
    def mnt(self) -> Path:
        return self.cluster.mountpoint

    def pids(self) -> dict[str, int]:
        return self.cluster.pids()


def _committed(m: _Mosafs, path: Path, size: int) -> dict[str, Any]:
    assert m.stats is not None
    return _wait_committed(m.stats, os.stat(path).st_ino, size)


def _mosafs_phase(workdir: Path, options: Options, notes: list[str],
                  after: Callable[[_Mosafs], None] | None = None) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    m = _Mosafs(workdir, [] if options.chunk_tokens else ["--chunk-tokens", "off"],
                tls=options.tls)
    out: dict[str, Any] = {}
    try:
        m.start()
        window = m.cluster.mount_window_bytes()
        cache = _mount_cache_bytes(m)
        out["window_bytes"] = window
        out["client_cache_bytes"] = cache
        out["startup"] = {"pids": m.pids()}

        expected: dict[str, str] = {}
        for name, block, seed, size in _writes(options):
            data = make_data(f"{options.seed}/{seed}".encode(), size)
            expected[name] = digest(data)
            fresh = name == "write_memory"
            if fresh:  # a new mount: its peak RSS since start is the figure, no history
                m.stop()
                m.start()
            out[name] = _timed_write(m, m.mnt / f"{name}.bin", data, block,
                                     reset_peak=not fresh)
            del data
            gc.collect()
            w = out[name]
            progress(f"mosafs {name}: OAB {w['oab_mb_s']:.0f} MB/s, ASB {w['asb_mb_s']:.0f} "
                     f"MB/s, peak RSS {w['peak_rss_bytes'] / MiB:.0f} MiB")

        # Cold read: a new cluster on the same data directory (the mount's LRU chunk cache
        # starts empty) and no page cache anywhere (benefactors' chunk files included).
        path = m.mnt / "write_1m.bin"
        m.stop()
        dropped = drop_caches()
        m.start()
        dropped = drop_caches() and dropped
        if not dropped:
            notes.append("page caches could not be dropped (not root): the cold read is "
                         "only cold for the client's chunk cache")
        out["read_cold"] = _timed_read(m, path, options.size, "cold")
        out["read_cold"]["page_cache_dropped"] = dropped
        out["read_warm"] = _timed_read(m, path, options.size, "warm")
        check = read_file(path, READ_BLOCK, hash_it=True)
        out["read_verified"] = check.blake3 == expected["write_1m"]
        if not out["read_verified"]:
            raise BenchError(f"{path} read back wrong content")
        notes.append(
            "cold read: the cluster is stopped, the page cache dropped, the cluster started "
            "again on the same data directory (empty client chunk cache), the cache dropped "
            "again; warm read: a second pass on the same mount. The client's LRU chunk cache "
            f"holds {cache // MiB} MiB"
            + (": smaller than the file, so a sequential re-read finds nothing in it (only "
               "the benefactors' page cache is warm)" if cache < options.size else ""))
        if after is not None:
            after(m)
    finally:
        m.stop()
    return out


def _writes(options: Options) -> list[tuple[str, int, str, int]]:
    writes = [("write_1m", LARGE_WRITE, "1m", options.size),
              ("write_4k", SMALL_WRITE, "4k", options.size)]
    if options.memory_size:
        writes.append(("write_memory", LARGE_WRITE, "memory", options.memory_size))
    return writes


def _mount_cache_bytes(m: _Mosafs) -> int:
    from mosafs.bench.procs import cmdline

    args = cmdline(m.cluster.mount_pid)
    for i, arg in enumerate(args[:-1]):
        if arg == "--cache-mib":
            return int(args[i + 1]) << 20
    return DEFAULT_CACHE


def _timed_write(m: _Mosafs, path: Path, data: bytes, block: int, *,
                 reset_peak: bool = True) -> dict[str, Any]:
    assert m.stats is not None
    pid = m.cluster.mount_pid
    hwm_reset = reset_peak and reset_peak_rss(pid)
    rss_before = memory_status(pid).get("VmRSS", 0)
    with CpuMeter(m.pids) as cpu, RssSampler(pid) as sampler:
        t = write_file(path, data, block)
        inode = os.stat(path).st_ino
        stats = _wait_committed(m.stats, inode, len(data))
        stored = time.perf_counter() - t.start
    mem = memory_status(pid)
    return {
        "bytes": len(data),
        "write_bytes": block,
        "oab_mb_s": round(t.mb_s(t.closed), 1),
        "asb_mb_s": round(t.mb_s(stored), 1),
        "open_s": round(t.opened, 4),
        "last_write_returned_s": round(t.written, 3),
        "close_returned_s": round(t.closed, 3),
        "stats_confirmed_s": round(stored, 3),
        "stats": stats,
        "deduped": stats["new_bytes"] != len(data),
        "peak_rss_bytes": mem.get("VmHWM", 0),
        "peak_rss_since": "reset before open" if hwm_reset else "mount start",
        "sampled_max_rss_bytes": sampler.max_rss,
        "rss_before_bytes": rss_before,
        "rss_after_bytes": mem.get("VmRSS", 0),
        "cpu": cpu.result,
    }


def _wait_committed(stats: _Stats, inode: int, size: int) -> dict[str, Any]:
    deadline = time.monotonic() + STATS_TIMEOUT
    while True:
        s = stats.get(inode)
        if s["version"] >= 1 and s["size"] == size:
            return s
        if time.monotonic() > deadline:
            raise BenchError(f"inode {inode}: no committed version of {size} bytes after "
                             f"{STATS_TIMEOUT:.0f}s (stats: {s})")
        time.sleep(0.01)


def _timed_read(m: _Mosafs, path: Path, size: int, label: str) -> dict[str, Any]:
    return timed_read(m.pids, path, size, f"mosafs read {label}")


def timed_read(pids: Callable[[], dict[str, int]], path: Path, size: int,
               what: str) -> dict[str, Any]:
    """One sequential pass of 1 MiB reads of PATH (SIZE bytes), with the CPU of PIDS."""
    with CpuMeter(pids) as cpu:
        r = read_file(path, READ_BLOCK)
    if r.size != size:
        raise BenchError(f"{what}: {path} gave {r.size} bytes, not {size}")
    progress(f"{what}: {r.mb_s:.0f} MB/s")
    return {"read_bytes": READ_BLOCK, "mb_s": round(r.mb_s, 1), "seconds": round(r.seconds, 3),
            "cpu": cpu.result}


# -- targets --------------------------------------------------------------------------------

def targets(result: dict[str, Any]) -> dict[str, Any]:
    null, mosafs = result["nullfs"], result["mosafs"]
    w1, w4 = mosafs["write_1m"], mosafs["write_4k"]

    def ratio(a: float, b: float) -> float:
        return round(a / b, 3) if b else 0.0

    def at_least(value: float, target: float, **extra: Any) -> dict[str, Any]:
        return {"value": value, "target": f">= {target}", "pass": value >= target, **extra}

    memory = mosafs.get("write_memory") or w1
    limit = mosafs["window_bytes"] + RSS_HEADROOM
    peak = memory["peak_rss_bytes"]
    return {
        "oab_1m_vs_null_write_1m": at_least(
            ratio(w1["oab_mb_s"], null["write_1m"]["mb_s"]), TARGETS["oab_1m_vs_null_write_1m"],
            oab_mb_s=w1["oab_mb_s"], null_mb_s=null["write_1m"]["mb_s"]),
        "asb_1m_mb_s": at_least(w1["asb_mb_s"], TARGETS["asb_1m_mb_s"]),
        "oab_4k_vs_oab_1m": at_least(
            ratio(w4["oab_mb_s"], w1["oab_mb_s"]), TARGETS["oab_4k_vs_oab_1m"],
            oab_4k_mb_s=w4["oab_mb_s"]),
        "cold_read_vs_null_read": at_least(
            ratio(mosafs["read_cold"]["mb_s"], null["read_1m"]["mb_s"]),
            TARGETS["cold_read_vs_null_read"],
            cold_mb_s=mosafs["read_cold"]["mb_s"], null_mb_s=null["read_1m"]["mb_s"]),
        "peak_rss_while_writing": {
            "value": peak, "target": f"< {limit} (window + {RSS_HEADROOM // MiB} MiB)",
            "limit_bytes": limit,
            "pass": peak < limit, "file_bytes": memory["bytes"],
            "measured_on": "write_memory" if "write_memory" in mosafs else "write_1m",
            "peak_rss_mib": round(peak / MiB, 1), "limit_mib": round(limit / MiB, 1),
            "peak_rss_mib_by_write": {n: round(mosafs[n]["peak_rss_bytes"] / MiB, 1)
                                      for n in ("write_1m", "write_4k", "write_memory")
                                      if n in mosafs}},
    }


# -- context --------------------------------------------------------------------------------

def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    with contextlib.suppress(OSError):
        cpuinfo = Path("/proc/cpuinfo").read_text()
        for line in cpuinfo.splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        info["avx512"] = " avx512f" in cpuinfo
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["mem_bytes"] = int(line.split()[1]) * 1024
    from importlib import metadata

    for dist in ("pyfuse3", "trio", "grpcio", "protobuf", "blake3"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            info[dist] = metadata.version(dist)
    return info


def git_info() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], check=True,
                                capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": head, "changed_files": len(status.splitlines())}
