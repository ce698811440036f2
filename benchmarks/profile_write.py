"""Where the CPU goes while writing (and cold-reading) through a mosafs mount, per process.

    .venv/bin/python benchmarks/profile_write.py [--size-mib 1024] [--block 1M|4K]
        [--py-spy DIR] [--up-arg=--write-semantics=optimistic ...] [--read] [--writers N]

Starts `mosafs up` (manager, 3 benefactors, mount; R=2 pessimistic unless --up-arg says
otherwise) in a fresh directory, writes SIZE of incompressible bytes with `os.write`
calls of BLOCK (generated before timing, `conv=fsync` like dd: fsync then close), and
prints, per process (and per thread of the mount and of one benefactor), CPU-seconds per
GiB written, user and kernel, from /proc. With --py-spy DIR, py-spy (`--native`, raw
format: flame-graph input, one file per process) samples the mount and one benefactor
during the write; the CPU figures of such a run include py-spy's own slowdown, so take
the CPU table from a run without it. Run as root (drop_caches before --read).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mosafs.argtypes import byte_size
from mosafs.bench.procs import UpCluster, memory_status, reset_peak_rss
from mosafs.bench.timing import drop_caches, make_data

GiB = 1 << 30
TICK = os.sysconf("SC_CLK_TCK")


def _times(path: str) -> tuple[float, float]:
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def snapshot(pids: dict[str, int]) -> dict[str, tuple[float, float]]:
    """(user, system) seconds of each process and of each thread of the named ones."""
    out: dict[str, tuple[float, float]] = {}
    for name, pid in pids.items():
        try:
            out[name] = _times(f"/proc/{pid}/stat")
        except OSError:
            continue
        if name not in ("mount", "benefactor-0"):
            continue
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
                u, s = _times(f"/proc/{pid}/task/{tid}/stat")
            except OSError:
                continue
            key = f"{name}/{comm}"
            pu, ps = out.get(key, (0.0, 0.0))
            out[key] = (pu + u, ps + s)
    return out


def warm_up(mnt: Path) -> None:
    """A few small files first, so that every data-path worker has compiled its kernels
    and opened its connections before the timed write (one-time costs, not per GiB)."""
    for i in range(8):
        _write(mnt / f"warmup{i}", make_data(f"warm-{i}".encode(), 8 << 20), 1 << 20)


def _write(path: Path, data: bytes, block: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        for off in range(0, len(data), block):
            os.write(fd, view[off:off + block])
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: Path) -> int:
    total = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
    finally:
        os.close(fd)
    return total


def _py_spy(out: Path, pids: dict[str, int], seconds: int) -> list[subprocess.Popen[bytes]]:
    spies = []
    for name in ("mount", "benefactor-0", "mount-worker-0"):
        if name not in pids:
            continue
        spies.append(subprocess.Popen(
            [shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")),
             "record", "--native", "--threads",
             "--format", "raw", "-r", "100", "-d", str(seconds),
             "-o", str(out / f"{name}.txt"), "--pid", str(pids[name])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1.0)  # py-spy attaches before the write starts
    return spies


def table(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]],
          gib: float) -> dict[str, dict[str, float]]:
    rows = {}
    for key, (u1, s1) in after.items():
        u0, s0 = before.get(key, (0.0, 0.0))
        user, system = (u1 - u0) / gib, (s1 - s0) / gib
        if user + system >= 0.01:
            rows[key] = {"user": round(user, 2), "sys": round(system, 2),
                         "total": round(user + system, 2)}
    return rows


def put_figures(data_dir: Path) -> dict[str, float]:
    """The benefactors' put figures from their /metrics: blobs stored, calls that carried
    them (PutChunk, and PutChunks: grouped puts), blobs per call."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    info = json.loads((data_dir / "cluster.json").read_text())
    totals = {"blobs": 0.0, "PutChunk": 0.0, "PutChunks": 0.0}
    for url in info["metrics"]["benefactors"].values():
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "mosafs_benefactor_put_chunks_total":
                    totals["blobs"] += sample.value
                elif sample.name == "mosafs_benefactor_put_calls_total":
                    totals[sample.labels["method"]] += sample.value
    calls = totals["PutChunk"] + totals["PutChunks"]
    totals["blobs_per_call"] = round(totals["blobs"] / calls, 2) if calls else 0.0
    return totals


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--block", type=byte_size(1), default=1 << 20)
    p.add_argument("--writers", type=int, default=1)
    p.add_argument("--py-spy", type=Path)
    p.add_argument("--perf", type=Path, help="perf record -a (cpu-clock) into this file "
                   "during the write")
    p.add_argument("--read", action="store_true")
    p.add_argument("--up-arg", action="append", default=[])
    p.add_argument("--keep", type=Path)
    a = p.parse_args()
    size = a.size_mib << 20
    datas = [make_data(f"profile-{i}".encode(), size // a.writers) for i in range(a.writers)]
    workdir = a.keep or Path(tempfile.mkdtemp(prefix="mosafs-profile-"))
    cluster = UpCluster(workdir, a.up_arg)
    result: dict[str, object] = {"size_mib": a.size_mib, "block": a.block,
                                 "writers": a.writers, "up_args": a.up_arg}
    try:
        cluster.start()
        warm_up(cluster.mountpoint)  # UpCluster.start waited for the workers to compile
        pids = cluster.pids()
        result["pids"] = {**pids, "bench": os.getpid()}
        spies = _py_spy(a.py_spy, pids, 60) if a.py_spy else []
        if a.perf:
            spies.append(subprocess.Popen(
                ["perf", "record", "-a", "-g", "-e", "cpu-clock", "-F", "499", "-o",
                 str(a.perf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(1.0)
        for pid in pids.values():
            reset_peak_rss(pid)
        before, t0 = snapshot(pids), time.perf_counter()
        threads = [threading.Thread(target=_write, args=(cluster.mountpoint / f"f{i}", d,
                                                          a.block)) for i, d in enumerate(datas)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        after = snapshot(pids)
        time.sleep(1.0)  # the writer's own CPU is counted as `bench`
        result["write_mb_s"] = round(size / elapsed / 1e6, 1)
        result["benefactor_puts"] = put_figures(cluster.data_dir)
        result["write_cpu_s_per_gib"] = table(before, after, size / GiB)
        result["write_peak_rss_mib"] = {
            name: round(memory_status(pid).get("VmHWM", 0) / (1 << 20), 1)
            for name, pid in pids.items() if name.startswith(("mount", "worker"))}
        for spy in spies:
            spy.send_signal(2)  # SIGINT: py-spy writes its file and exits
            spy.wait()
        if a.read:
            cluster.stop()
            drop_caches()
            cluster.start()
            pids = cluster.pids()
            spies = []
            if a.perf:
                spies.append(subprocess.Popen(
                    ["perf", "record", "-a", "-g", "-e", "cpu-clock", "-F", "499", "-o",
                     f"{a.perf}.read"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                time.sleep(1.0)
            result["read_pids"] = pids
            before, t0 = snapshot(pids), time.perf_counter()
            got = sum(_read(cluster.mountpoint / f"f{i}") for i in range(a.writers))
            elapsed = time.perf_counter() - t0
            assert got == size, got
            result["read_mb_s"] = round(size / elapsed / 1e6, 1)
            result["read_cpu_s_per_gib"] = table(before, snapshot(pids), size / GiB)
            for spy in spies:
                spy.send_signal(2)
                spy.wait()
    finally:
        cluster.stop()
        if a.keep is None:  # the cluster's data: the whole written size, twice over
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
