"""Starting real mosafs processes for tests, and failing on noise in their output.

Every process is started with `python -P -m mosafs ...` (as mosafs starts its own children,
mosafs.procutil.python_command: no folder of the current directory can stand in for the
package), on loopback port 0, with --ready-file; its stderr goes to a log file. `stop()`
sends SIGTERM, waits, and asserts the log holds no traceback and no WARNING/ERROR/CRITICAL
line (nor a gRPC GOAWAY) except those a test declares expected.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mosafs.bench import procs

# Ours (logging's level names), gRPC C-core's own error lines ("E1124 06:03:43.5 ..."), and
# a server hanging up on a client for pinging too often ("too_many_pings": keepalive
# settings that disagree) or any GOAWAY gRPC C-core itself logs, at whatever verbosity. A
# line of ours that quotes an RPC's failure ("GOAWAY received" from a peer stopping, which
# a test may do on purpose) is judged by its level, as any other.
NOISE = re.compile(r"Traceback|\b(WARNING|ERROR|CRITICAL)\b|^[EF]\d{4} \d\d:\d\d:\d\d"
                   r"|too_many_pings|ENHANCE_YOUR_CALM|^[DIWEF]\d{4} \d\d:\d\d:\d\d.*GOAWAY")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    ready: dict[str, Any] = field(default_factory=dict)
    expected_noise: list[str] = field(default_factory=list)
    # Logs of processes this one started (e.g. `mosafs up`'s children), checked on stop().
    extra_logs: Callable[[], list[Path]] = field(default=lambda: [])

    @property
    def address(self) -> str:
        return str(self.ready["address"])

    def log(self) -> str:
        text = self.log_path.read_text(errors="replace")
        for path in self.extra_logs():
            text += f"\n--- {path.name}\n" + path.read_text(errors="replace")
        return text

    def noise(self) -> list[str]:
        allowed = [re.compile(p) for p in self.expected_noise]
        lines = []
        for line in self.log().splitlines():
            if NOISE.search(line) and not any(p.search(line) for p in allowed):
                lines.append(line)
        return lines

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            self.popen.send_signal(sig)
            self.popen.wait(timeout=30)

    def stop(self, *, check: bool = True, timeout: float = 30) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
                raise AssertionError(
                    f"{self.name} did not stop on SIGTERM; log:\n{self.log()}") from None
        if check:
            noise = self.noise()
            assert not noise, f"{self.name} logged noise:\n" + "\n".join(noise) + "\n" + self.log()


def stop_every(procs: Iterable[Proc]) -> None:
    """Stop every process of PROCS, the last started first, even when one fails its stop
    (noise in its log, a hang): none is left running; then raise the first failure."""
    failures: list[AssertionError] = []
    for proc in reversed(list(procs)):
        try:
            proc.stop()
        except AssertionError as exc:
            failures.append(exc)
        finally:
            proc.kill()
    if failures:
        raise failures[0]


def start(name: str, args: Iterable[str], workdir: Path, *, timeout: float = 60,
          env: dict[str, str] | None = None, cwd: Path | None = None) -> Proc:
    """Start `python -P -m mosafs ARGS --ready-file ...` (in CWD, default this process's
    current directory) and wait until it is ready."""
    workdir.mkdir(parents=True, exist_ok=True)
    ready_file = workdir / f"{name}.ready.json"
    ready_file.unlink(missing_ok=True)
    log_path = workdir / f"{name}.log"
    args = list(args)
    if args and args[0] in ("manager", "benefactor", "mount") and "--tls-dir" not in args:
        args.append("--insecure")  # processes started on their own: plaintext unless told
    cmd = [sys.executable, "-P", "-m", "mosafs", *args, "--ready-file", str(ready_file)]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                 start_new_session=True, cwd=cwd)
    proc = Proc(name, popen, log_path)
    deadline = time.monotonic() + timeout
    while not ready_file.exists():
        if popen.poll() is not None:
            raise AssertionError(f"{name} exited with {popen.returncode}:\n{proc.log()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{name} not ready after {timeout}s:\n{proc.log()}")
        time.sleep(0.05)
    proc.ready = json.loads(ready_file.read_text())
    return proc


def cli(*args: str, timeout: float = 120,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -P -m mosafs ARGS` to the end; its output as text."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-P", "-m", "mosafs", *args], capture_output=True,
                          text=True, timeout=timeout, env=full_env)


def cli_json(*args: str, timeout: float = 120) -> Any:
    """`mosafs ARGS --json`, which must succeed and print one JSON value."""
    done = cli(*args, "--json", timeout=timeout)
    assert done.returncode == 0, f"mosafs {' '.join(args)}: {done.stderr}"
    return json.loads(done.stdout)


def wait_redundant(*where: str, timeout: float = 60) -> Any:
    """Until `mosafs status WHERE` reports fresh figures with every referenced chunk at R
    copies (and at least one chunk); that status."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        asked = time.monotonic()
        status = cli_json("status", *where)
        # Figures of a pass that began after this wait did: an earlier one may predate the
        # write the caller just finished.
        fresh = 0 <= status["figures_age_ms"] < 1000 * (asked - started)
        if fresh and status["chunks"] and status["under_replicated_chunks"] == 0:
            return status
        assert time.monotonic() < deadline, f"still under-replicated: {status}"
        time.sleep(0.5)


def chunk_files(store: Path) -> list[Path]:
    """The chunk files of the benefactor store STORE (its chunks/ab/cd/<id>), sorted.
    os.walk, not Path.glob: the benefactor removes fan-out directories that its deletes
    leave empty, and glob fails on a directory that went between listing and reading it
    (a CI run saw that while gc ran); os.walk leaves such a directory out."""
    found = []
    for dirpath, _dirs, files in os.walk(store / "chunks"):
        found.extend(Path(dirpath, name) for name in files if len(name) == 64)
    return sorted(found)


def sizes(paths: Iterable[Path]) -> int:
    """The bytes of the files PATHS, leaving out those that went meanwhile (the manager
    deletes garbage in the background, between a listing and a stat)."""
    total = 0
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def scrape(url: str) -> dict[str, float]:
    """Every sample of a Prometheus /metrics page by `name{label=value,...}`, parsed by
    prometheus_client (a page that does not parse fails the test)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    assert any(name.startswith("mosafs_") for name in samples), url
    return samples


def _state(stat_path: str | Path) -> str | None:
    """The state letter of a process or thread (/proc/.../stat), None when it is gone."""
    return (procs.stat_fields(stat_path) or [None])[0]


pid_alive = procs.alive  # whether process PID exists and is no zombie


def pause(pid: int, timeout: float = 10) -> None:
    """SIGSTOP process PID and return once every thread of it has stopped: kill() only
    queues the signal, and under load the process's other threads may still answer a
    request for some milliseconds (a lookup sent right after kill() was answered)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        # A thread that ended meanwhile has no state (None).
        states = [_state(task / "stat") for task in Path(f"/proc/{pid}/task").iterdir()]
        if all(state in ("T", "t", None) for state in states):
            return
        assert time.monotonic() < deadline, f"process {pid} did not stop: {states}"
        time.sleep(0.005)


def mounts_under(path: Path) -> list[str]:
    """The mount points at or below PATH."""
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(str(path))]


@contextlib.contextmanager
def started_bench(*args: str) -> Iterator[subprocess.Popen[str]]:
    """`mosafs bench ARGS` in a process of its own, SIGINT delivered as a terminal delivers
    it: a shell starts background jobs with SIGINT ignored, and Python then never turns it
    into KeyboardInterrupt. Whatever the test does, no bench outlives it: one still running
    is interrupted (it stops what it started) and killed after 120 s."""
    bench = subprocess.Popen(
        [sys.executable, "-P", "-m", "mosafs", "bench", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        yield bench
    finally:
        if bench.poll() is None:
            bench.send_signal(signal.SIGINT)
            try:
                bench.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                bench.kill()
                bench.communicate()
        for pipe in (bench.stdout, bench.stderr):
            if pipe is not None:
                pipe.close()


def up_pids(ready: Path) -> list[int]:
    """The processes of the `mosafs up` whose ready file is READY: itself, its mount and
    its benefactors."""
    info = json.loads(ready.read_text())
    return [info["pid"], info["client"]["pid"], *(b["pid"] for b in info["benefactors"])]


def interrupt_bench(bench: subprocess.Popen[str], pids: list[int], run_dir: Path,
                    mounts_below: Path) -> tuple[str, str]:
    """Ctrl-C BENCH: it exits with 130, without a traceback, leaving none of PIDS running,
    no mount below MOUNTS_BELOW and no result in RUN_DIR; its stdout and stderr."""
    bench.send_signal(signal.SIGINT)
    out, err = bench.communicate(timeout=120)
    assert bench.returncode == 130, err
    assert "Traceback" not in err, err
    assert not [pid for pid in pids if pid_alive(pid)]
    assert mounts_under(mounts_below) == []
    assert not (run_dir / "result.json").exists()
    return out, err


def wait_for(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Until CONDITION() holds; an AssertionError naming WHAT after TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.1)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A file system of SIZE (mount's size=, e.g. "200M") of its own at PATH (made), for
    disks that fill up; unmounted after. Needs root."""
    path.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
