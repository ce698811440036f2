"""Processes the write benchmark starts, and what it reads about them from /proc.

Every process is started in its own session (a Ctrl-C at the terminal reaches the
benchmark alone, which then stops them in order) and stopped by its pid: SIGTERM, a wait,
SIGKILL for one that ignores it, then a lazy unmount of a mount left behind. Nothing here
touches a process the benchmark did not start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mosafs.errors import MosafsError
from mosafs.procutil import python_command

log = logging.getLogger("mosafs.bench")

START_TIMEOUT = 180.0
STOP_TIMEOUT = 90.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# Every process the benchmark started or learned of, as (role, pid): checked at the end.
STARTED: list[tuple[str, int]] = []


def _record(name: str, pid: int) -> None:
    if (name, pid) not in STARTED:
        STARTED.append((name, pid))


class BenchError(MosafsError):
    """A benchmark step could not run (a process did not start, a file read back wrong).
    Local to the command line: never sent over RPC, so not in mosafs.errors.ALL_ERRORS."""

    kind = "bench"


# -- /proc ------------------------------------------------------------------------------------

# A process's /proc files vanish when it is reaped: opening one then fails with ENOENT,
# and reading one that was opened just before fails with ESRCH. Either means "gone"; the
# second is the rarer race, hit on a busy machine by a scan of every process.
GONE = (FileNotFoundError, ProcessLookupError)


def stat_fields(path: str | Path) -> list[str] | None:
    """The fields of a /proc stat file after the command name (state, ppid, ...): a
    process's (/proc/PID/stat) or a thread's (/proc/PID/task/TID/stat); None once it is
    gone."""
    try:
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()
    except GONE:
        return None


def alive(pid: int) -> bool:
    """Whether PID runs (a zombie does not count)."""
    fields = stat_fields(f"/proc/{pid}/stat")
    return fields is not None and fields[:1] != ["Z"]


def cpu_times(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of PID so far, all its threads (None once it is gone)."""
    fields = stat_fields(f"/proc/{pid}/stat")
    if fields is None:
        return None
    return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK  # utime, stime


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of PID so far (None once it is gone)."""
    times = cpu_times(pid)
    return None if times is None else times[0] + times[1]


def memory_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (peak RSS) and the like of PID, in bytes."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Vm"):
                    name, value = line.split(":", 1)
                    parts = value.split()
                    if len(parts) == 2 and parts[1] == "kB":
                        out[name] = int(parts[0]) * 1024
    except GONE:
        pass
    return out


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM of PID to its current RSS (`echo 5 > /proc/PID/clear_refs`)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except GONE:
        return []


def children(pid: int) -> list[int]:
    """Direct children of PID."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()
            and (stat_fields(f"/proc/{entry}/stat") or [])[1:2] == [str(pid)]]


def unmount(mountpoint: Path) -> None:
    """Lazily detach a FUSE mount whose server is gone (no-op when nothing is mounted)."""
    if not os.path.ismount(mountpoint):
        return
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmd = [tool, "-u", "-z", str(mountpoint)] if tool else ["umount", "-l", str(mountpoint)]
    subprocess.run(cmd, check=False, capture_output=True)


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    return left


def kill_pids(pids: list[int], timeout: float = 10.0) -> None:
    """SIGTERM the pids still running (ours, by id), then SIGKILL those that stay."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        pids = _wait_gone(pids, timeout)
        if not pids:
            return
    log.error("processes %s did not exit", pids)


# -- daemons ----------------------------------------------------------------------------------

@dataclass
class Daemon:
    """A process started with --ready-file, in its own session, logging to a file."""

    name: str
    cmd: list[str]
    ready_file: Path
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    ready: dict[str, Any] = field(default_factory=dict)

    def start(self, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        self.ready_file.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "ab") as log_file:
            self.popen = subprocess.Popen(self.cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env,
                                          start_new_session=True)
        _record(self.name, self.popen.pid)
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            if self.popen.poll() is not None:
                raise BenchError(f"{self.name} exited with status {self.popen.returncode}; "
                                 f"log {self.log_path}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name} not ready after {timeout:.0f}s; "
                                 f"log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.05)
        self.ready = dict(json.loads(self.ready_file.read_text()))
        return self.ready

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM, wait, SIGKILL if needed; the exit status (None if never started)."""
        if self.popen is None:
            return None
        return terminate(self.popen, self.name, timeout)


def terminate(popen: subprocess.Popen[bytes], name: str,
              timeout: float = STOP_TIMEOUT) -> int:
    """SIGTERM POPEN unless it has exited, wait up to TIMEOUT, SIGKILL if needed; its
    exit status."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.error("%s ignored SIGTERM for %.0fs; killing it", name, timeout)
            popen.kill()
            popen.wait()
    return popen.returncode


class NullFs:
    """`python -m mosafs.bench.NAME MOUNTPOINT [ARGS]`: a null pyfuse3 file system (NAME
    nullfs, nullfiles or nullns), mounted at WORKDIR/null-mnt."""

    def __init__(self, workdir: Path, name: str = "nullfs", *args: str) -> None:
        self.mountpoint = workdir / "null-mnt"
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.path = self.mountpoint / "data"
        ready = workdir / f"{name}.ready.json"
        self.daemon = Daemon(
            name, python_command(f"mosafs.bench.{name}", str(self.mountpoint), *args,
                                 "--ready-file", str(ready)),
            ready, workdir / f"{name}.log")

    def start(self) -> None:
        self.daemon.start(timeout=60)

    @property
    def pid(self) -> int:
        return self.daemon.pid

    def stop(self) -> None:
        try:
            self.daemon.stop(timeout=30)
        finally:
            unmount(self.mountpoint)


class UpCluster:
    """`mosafs up MOUNTPOINT --data-dir DIR --ready-file F` and the processes it runs."""

    def __init__(self, workdir: Path, up_args: list[str] | None = None) -> None:
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.mountpoint = workdir / "mnt"
        self.up_args = list(up_args or [])
        self.starts = 0
        self.daemon: Daemon | None = None
        self._pids: dict[str, int] = {}

    def start(self) -> dict[str, Any]:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self.daemon = Daemon(
            "up",
            python_command("mosafs", "up", str(self.mountpoint),
                           "--data-dir", str(self.data_dir), "--ready-file",
                           str(self.workdir / "up.ready.json"), *self.up_args),
            self.workdir / "up.ready.json", self.workdir / "up.log")
        try:
            ready = self.daemon.start()
        finally:
            self._learn_pids()  # even a failed start leaves children to stop
        self._settle_workers()
        return ready

    def _settle_workers(self, timeout: float = 60.0) -> None:
        """Until the mount's data-path workers are idle: they compile their kernels at
        start (seconds of CPU), which belongs to no figure a benchmark takes."""
        workers = [p for name, p in self._pids.items() if name.startswith("mount-worker-")]
        deadline = time.monotonic() + timeout
        last = sum(cpu_seconds(p) or 0.0 for p in workers)
        while workers and time.monotonic() < deadline:
            time.sleep(0.5)
            now = sum(cpu_seconds(p) or 0.0 for p in workers)
            if now - last < 0.05:
                return
            last = now

    @property
    def ready(self) -> dict[str, Any]:
        assert self.daemon is not None
        return self.daemon.ready

    @property
    def manager(self) -> str:
        return str(self.ready["manager"])

    def _learn_pids(self) -> None:
        """mount, manager, benefactor-N -> pid: from the ready file, else from /proc."""
        assert self.daemon is not None and self.daemon.popen is not None
        pids: dict[str, int] = {}
        ready = self.daemon.ready
        if ready:
            pids["mount"] = int(ready["client"]["pid"])
            # Its data-path workers (mosafs.client.worker) do part of the mount's work.
            workers = [c for c in children(pids["mount"])
                       if "mosafs.client.worker" in cmdline(c)]
            pids.update({f"mount-worker-{i}": pid for i, pid in enumerate(workers)})
            for i, b in enumerate(ready.get("benefactors", [])):
                pids[f"benefactor-{i}"] = int(b["pid"])
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
            manager_ready = json.loads(
                (self.data_dir / "run" / "manager.ready.json").read_text())
            pids["manager"] = int(manager_ready["pid"])
        known = set(pids.values())
        for child in children(self.daemon.popen.pid):  # anything `up` started that we missed
            if child not in known:
                args = cmdline(child)
                role = next((a for a in args if a in ("manager", "benefactor", "mount")),
                            "child")
                pids[f"{role}-pid{child}"] = child
        self._pids = pids
        for name, pid in pids.items():
            _record(name, pid)

    def pids(self) -> dict[str, int]:
        """Every process of the cluster by role (`up` itself included)."""
        assert self.daemon is not None
        return {"up": self.daemon.pid, **self._pids}

    @property
    def mount_pid(self) -> int:
        return self._pids["mount"]

    def stop(self) -> None:
        """SIGTERM to `up` (it stops its children, mount first); then make sure."""
        if self.daemon is None:
            return
        try:
            self._learn_pids()
        except Exception:  # best effort: the pids known so far still get stopped
            log.exception("cannot list the cluster's processes")
        try:
            status = self.daemon.stop()
            if status not in (0, None):
                log.warning("mosafs up exited with status %s; log %s", status,
                            self.daemon.log_path)
        finally:
            left = [p for p in self._pids.values() if alive(p)]
            if left:
                log.error("mosafs up left processes %s running; stopping them", left)
                kill_pids(left)
            unmount(self.mountpoint)
            self.daemon = None
            self._pids = {}

    def mount_window_bytes(self) -> int:
        """The mount's sliding write window (--window-mib on its command line, else 64)."""
        from mosafs.argtypes import byte_size

        args = cmdline(self.mount_pid)
        in_mib = byte_size(1 << 20, unit=1 << 20)  # the mount's own parser: "64", "1G"
        mib = 64
        for i, arg in enumerate(args):
            if arg == "--window-mib" and i + 1 < len(args):
                mib = in_mib(args[i + 1])
            elif arg.startswith("--window-mib="):
                mib = in_mib(arg.split("=", 1)[1])
        return mib << 20
