"""The write benchmark's pieces that need no mount: the timing harness, /proc readers, the
null file system's handlers, targets and the table."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from mosafs.bench import procs, timing
from mosafs.bench.write import targets
from mosafs.bench.write_run import format_table

MiB = 1 << 20


def test_write_and_read_file_time_every_step(tmp_path: Path) -> None:
    data = timing.make_data(b"seed", 3 * MiB + 5)
    assert data == timing.make_data(b"seed", 3 * MiB + 5) != timing.make_data(b"other", 3 * MiB)
    path = tmp_path / "f"
    t = timing.write_file(path, data, MiB)
    assert path.read_bytes() == data
    assert 0 <= t.opened <= t.written <= t.closed
    assert t.mb_s(t.closed) > 0
    r = timing.read_file(path, 4096, hash_it=True)
    assert r.size == len(data)
    assert r.blake3 == timing.digest(data)
    assert timing.read_file(path, MiB).blake3 is None


@pytest.mark.parametrize("reader", ["alive", "cpu_seconds", "memory_status", "cmdline",
                                    "children"])
def test_proc_readers_take_a_process_reaped_mid_read_as_gone(
        reader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process reaped between the open of its /proc file and the read fails the read
    with ESRCH (a CI run's `mosafs bench checkpoint` died of it, scanning /proc for the
    cluster's processes while other tests' processes ended): every reader takes it as
    gone. The race is made here by reaping the process right after the real open."""
    child = subprocess.Popen(["sleep", "60"])
    real_open = open

    def open_then_reap(path: str, *args: Any, **kwargs: Any) -> Any:
        handle = real_open(path, *args, **kwargs)
        if str(path).startswith(f"/proc/{child.pid}/") and child.poll() is None:
            child.kill()
            child.wait()
        return handle

    monkeypatch.setattr(procs, "open", open_then_reap, raising=False)
    try:
        got = (procs.children(os.getpid()) if reader == "children"
               else getattr(procs, reader)(child.pid))
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -9  # reaped by the hook (or after the reader, at worst)
    assert got == {"alive": False, "cpu_seconds": None, "memory_status": {},
                   "cmdline": [], "children": []}[reader]


def test_proc_readers_on_this_process() -> None:
    pid = os.getpid()
    assert procs.alive(pid)
    mem = procs.memory_status(pid)
    assert mem["VmHWM"] >= mem["VmRSS"] > 0
    assert (procs.cpu_seconds(pid) or 0) > 0
    assert procs.memory_status(2**22 + 12345) == {}
    assert procs.cpu_seconds(2**22 + 12345) is None
    assert not procs.alive(2**22 + 12345)
    with timing.RssSampler(pid, interval=0.001) as sampler, \
            timing.CpuMeter(lambda: {"me": pid}) as cpu:
        sum(range(200_000))
    assert sampler.max_rss > 0
    assert set(cpu.result["cpu_s"]) == {"me", "bench"}


def test_null_operations_discard_writes_and_read_zeros() -> None:
    from mosafs.bench.nullfs import FILE_INODE, STATS_XATTR, NullOperations

    ops = NullOperations()

    async def scenario() -> dict[str, Any]:
        fi = await ops.open(FILE_INODE, os.O_WRONLY | os.O_TRUNC, None)
        assert await ops.write(fi.fh, 0, b"x" * 5000) == 5000
        assert await ops.write(fi.fh, 5000, b"y" * 100) == 100
        assert (await ops.getattr(FILE_INODE)).st_size == 5100
        assert bytes(await ops.read(fi.fh, 4096, 4096)) == bytes(1004)
        assert bytes(await ops.read(fi.fh, 6000, 10)) == b""
        fields = SimpleNamespace(update_size=True)
        attr = await ops.setattr(FILE_INODE, SimpleNamespace(st_size=7), fields, None, None)
        assert attr.st_size == 7
        return dict(json.loads(await ops.getxattr(FILE_INODE, STATS_XATTR, None)))

    stats = trio.run(scenario)
    assert stats["requests"]["write"] == 2
    assert (stats["write_bytes"], stats["write_min"], stats["write_max"]) == (5100, 100, 5000)
    assert stats["read_bytes"] == 1004


def _result(**over: Any) -> dict[str, Any]:
    def write(oab: float, asb: float, peak: int, size: int = 1024 * MiB) -> dict[str, Any]:
        return {"oab_mb_s": oab, "asb_mb_s": asb, "peak_rss_bytes": peak, "bytes": size}

    result: dict[str, Any] = {
        "params": {"size_bytes": 1024 * MiB},
        "nullfs": {"write_1m": {"mb_s": 1000.0}, "write_4k": {"mb_s": 50.0},
                   "read_1m": {"mb_s": 1500.0}},
        "mosafs": {"write_1m": write(800.0, 350.0, 300 * MiB),
                   "write_4k": write(300.0, 280.0, 310 * MiB),
                   "read_cold": {"mb_s": 600.0}, "read_warm": {"mb_s": 900.0},
                   "window_bytes": 64 * MiB},
    }
    result["mosafs"].update(over)
    return result


def test_targets_ratios_and_pass_flags() -> None:
    t = targets(_result())
    assert t["oab_1m_vs_null_write_1m"]["value"] == pytest.approx(0.8)
    assert t["oab_1m_vs_null_write_1m"]["pass"] is True
    assert t["asb_1m_mb_s"]["pass"] is True
    assert t["oab_4k_vs_oab_1m"]["value"] == pytest.approx(0.375)
    assert t["oab_4k_vs_oab_1m"]["pass"] is False
    assert t["cold_read_vs_null_read"]["value"] == pytest.approx(0.4)
    assert t["cold_read_vs_null_read"]["pass"] is False
    rss = t["peak_rss_while_writing"]
    assert (rss["measured_on"], rss["limit_bytes"], rss["pass"]) == (
        "write_1m", 320 * MiB, True)


def test_targets_use_the_memory_run_when_there_is_one() -> None:
    memory = {"oab_mb_s": 1.0, "asb_mb_s": 1.0, "peak_rss_bytes": 400 * MiB,
              "bytes": 4096 * MiB}
    t = targets(_result(write_memory=memory))
    rss = t["peak_rss_while_writing"]
    assert (rss["measured_on"], rss["file_bytes"], rss["pass"]) == (
        "write_memory", 4096 * MiB, False)
    table = format_table({**_result(write_memory=memory), "targets": t})
    assert "peak_rss_while_writing" in table and "FAIL" in table and "PASS" in table


def test_quiet_disks_waits_while_a_disk_writes_and_gives_up_at_its_limit(
        tmp_path: Path) -> None:
    path = tmp_path / "busy"
    before = timing._disk_activity()
    with open(path, "wb") as f:
        f.write(os.urandom(4096))
        f.flush()
        os.fsync(f.fileno())
    if timing._disk_activity() == before:
        pytest.skip(f"{tmp_path} is on no block device that /proc/diskstats counts")
    stop = threading.Event()

    def keep_writing() -> None:  # a write and a flush every 50 ms
        with open(path, "r+b") as f:
            while not stop.wait(0.05):
                f.write(os.urandom(4096))
                f.flush()
                os.fsync(f.fileno())

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        started = time.monotonic()
        waited = timing.quiet_disks(idle_s=0.3, limit_s=1.0)
        assert 1.0 <= waited < 2.0  # the limit: never quiet
        assert time.monotonic() - started < 2.0
    finally:
        stop.set()
        writer.join()
    assert timing.quiet_disks(limit_s=0) == 0.0
