"""The timing harness: plain os.open/os.write/os.readv loops with fixed buffers, timed with
time.perf_counter, plus the samplers that watch other processes while they run.

Nothing is pinned, nothing is tuned: this is what an application doing plain file I/O sees.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mosafs.bench.procs import cpu_times, memory_status

_CLK_TCK = os.sysconf("SC_CLK_TCK")

MiB = 1 << 20
MB = 1e6  # throughput figures are in MB/s = 10^6 bytes per second


def make_data(seed: bytes, size: int) -> bytes:
    """SIZE incompressible, deterministic bytes: the BLAKE3 XOF of SEED."""
    import blake3

    return blake3.blake3(seed).digest(length=size)


def digest(data: bytes | memoryview) -> str:
    import blake3

    return blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest()


@dataclass
class WriteTiming:
    """Seconds from just before open() to: open returned, last write returned, close
    returned; `start` is the perf_counter value just before open()."""

    size: int
    block: int
    start: float
    opened: float
    written: float
    closed: float

    def mb_s(self, seconds: float) -> float:
        return self.size / seconds / MB if seconds > 0 else float("inf")


def write_file(path: str | os.PathLike[str], data: bytes, block: int, *,
               fsync: bool = False) -> WriteTiming:
    """Write DATA to PATH (created or truncated) with BLOCK-byte os.write calls. With
    FSYNC, os.fsync before the close, timed as part of it (a local disk's close is not
    durable without it; `closed` then includes the fsync)."""
    view = memoryview(data)
    size = len(data)
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    opened = time.perf_counter()
    try:
        offset = 0
        while offset < size:
            n = os.write(fd, view[offset:offset + block])
            if n <= 0:
                raise OSError(f"write to {path} returned {n} at offset {offset}")
            offset += n
        written = time.perf_counter()
    except BaseException:
        os.close(fd)
        raise
    try:
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)  # on mosafs: flush -> commit, after every upload finished
    closed = time.perf_counter()
    return WriteTiming(size, block, start, opened - start, written - start, closed - start)


@dataclass
class ReadTiming:
    size: int
    block: int
    seconds: float
    blake3: str | None = None

    @property
    def mb_s(self) -> float:
        return self.size / self.seconds / MB if self.seconds > 0 else float("inf")


def read_file(path: str | os.PathLike[str], block: int, *, hash_it: bool = False) -> ReadTiming:
    """Read PATH sequentially to its end with BLOCK-byte os.readv calls into one buffer.

    With HASH_IT the BLAKE3 of the content is computed on the way (costs time: use it on
    untimed passes)."""
    hasher: Any = None
    if hash_it:
        import blake3

        hasher = blake3.blake3()
    buf = bytearray(block)
    view = memoryview(buf)
    total = 0
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            n = os.readv(fd, [buf])
            if n == 0:
                break
            total += n
            if hasher is not None:
                hasher.update(view[:n])
    finally:
        os.close(fd)
    seconds = time.perf_counter() - start
    return ReadTiming(total, block, seconds, hasher.hexdigest() if hasher is not None else None)


def drop_caches(*, pages: bool = True) -> bool:
    """sync, then drop the page cache, dentries and inodes (root only); False if refused.
    PAGES False: the dentries and inodes only, without the sync (dirty pages are not what
    that drops)."""
    if pages:
        os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3" if pages else "2")
        return True
    except OSError:
        return False


def quiet_disks(*, idle_s: float = 0.5, limit_s: float = 30.0, poll_s: float = 0.1) -> float:
    """Wait until the machine's block devices have done no I/O for IDLE_S (nothing in
    flight, no write, discard or flush completed: /proc/diskstats), at most LIMIT_S; the
    seconds waited. A timed step then does not pay for what the disk still does for the
    step or the run before it (a deleted work directory's discards, a sync's tail)."""
    start = last_change = time.monotonic()
    before = _disk_activity()
    while (now := time.monotonic()) - start < limit_s:
        current = _disk_activity()
        if not current:  # /proc/diskstats unreadable: nothing to wait for
            break
        if current != before or current[0]:
            before, last_change = current, now
        elif now - last_change >= idle_s:
            break
        time.sleep(poll_s)
    return round(time.monotonic() - start, 3)


def _disk_activity() -> tuple[int, ...]:
    """(I/Os in flight, writes, discards and flushes completed) summed over the block
    devices (not loop, ram or zram devices); () where /proc/diskstats cannot be read."""
    in_flight = done = 0
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 14 or fields[2].startswith(("loop", "ram", "zram")):
                    continue
                in_flight += int(fields[11])
                done += int(fields[7]) + sum(int(x) for x in fields[14:15] + fields[18:19])
    except OSError:
        return ()
    return in_flight, done


class RssSampler:
    """Samples VmRSS of one process every INTERVAL seconds in a thread; keeps the maximum.

    A cross-check of VmHWM (which the kernel keeps exactly, but only since the last reset)."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.pid = pid
        self.interval = interval
        self.max_rss = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = memory_status(self.pid).get("VmRSS", 0)
            self.max_rss = max(self.max_rss, rss)
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class CpuMeter:
    """CPU seconds of named processes (and of this one, "bench") over an interval, with the
    wall time: total, and the part spent in the kernel (system time)."""

    def __init__(self, pids: Callable[[], dict[str, int]]) -> None:
        self._pids = pids

    def _times(self) -> dict[str, tuple[float, float] | None]:
        times = {name: cpu_times(pid) for name, pid in self.names.items()}
        own = os.times()
        times["bench"] = (own.user, own.system)
        return times

    def __enter__(self) -> CpuMeter:
        self.names = self._pids()
        self._before = self._times()
        self._busy = _machine_busy_seconds()
        self._wall = time.perf_counter()
        self.result: dict[str, Any] = {}
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._wall
        busy = _machine_busy_seconds() - self._busy
        after = self._times()
        total: dict[str, float] = {}
        system: dict[str, float] = {}
        for name, b in self._before.items():
            a = after.get(name)
            if a is not None and b is not None:
                total[name] = round(a[0] + a[1] - b[0] - b[1], 2)
                system[name] = round(a[1] - b[1], 2)
        self.result = {
            "wall_s": round(wall, 3),
            "cpu_s": total,
            "sys_s": system,
            "cpu_percent": {k: round(100 * v / wall, 1) if wall > 0 else 0.0
                            for k, v in total.items()},
            "cpu_s_all": round(sum(total.values()), 2),
            # Busy CPUs of the whole machine on average, and the part not ours: other work
            # on the machine while this ran (a shared machine makes figures noisy).
            "machine_busy_cpus": round(busy / wall, 2) if wall > 0 else 0.0,
            "other_busy_cpus": round(max(0.0, busy - sum(total.values())) / wall, 2)
            if wall > 0 else 0.0,
        }


def _machine_busy_seconds() -> float:
    """CPU seconds all CPUs spent not idle since boot (/proc/stat), all CPUs summed."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    # user nice system idle iowait irq softirq steal guest guest_nice
    busy = sum(fields[:8]) - fields[3] - fields[4]
    return busy / _CLK_TCK
