"""Stopping `mosafs up` loses nothing that was closed, and a crash leaves nothing behind
that the next `up` trips over (issue 15, point 8).

* Ctrl-C mid-write: the mount waits for the writer to close its file, which is committed
  whole; `up` says what it waits for.
* A second Ctrl-C, or the --stop-timeout: `up` stops at once, and the file keeps its previous
  version (nothing half-committed).
* A mount process killed under `up`: `up` exits and unmounts; a mount point left dead (mount
  and `up` killed together) is unmounted by the next `up`, which says so.

Each writer pauses after its first PAUSE_AT bytes until the test has sent the signal and
seen `up` wait for it: the signal lands mid-write every time, however fast the machine.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from pathlib import Path

import blake3
import pytest

from mosafs.bench import procs
from mosafs.deadmounts import is_dead_mount
from tests.harness import cli_json

MiB = 1 << 20
SIZE = 1024 * MiB  # the 1 GiB; the pause at PAUSE_AT makes the timing certain
PAUSE_AT = 64 * MiB
UP_ARGS = ("--benefactors", "2", "--replication", "1")
WAITING = "waiting for 1 file open for writing to be closed and committed"
DISCARD_NOISE = [
    r"WARNING mosafs\.client\S*: stopping (at a second signal|after the --stop-timeout)",
    r"WARNING mosafs\.client\S*: unmounting with uncommitted changes to inode",
]


def piece(seed: str, index: int) -> bytes:
    return blake3.blake3(f"{seed}:{index}".encode()).digest(length=MiB)


class Writer(threading.Thread):
    """Writes SIZE bytes of SEED to PATH in 1 MiB pieces, as dd would: PAUSE_AT bytes, then
    waits for `go`, then the rest, and closes. An OSError is kept in `error`."""

    def __init__(self, path: Path, seed: str) -> None:
        super().__init__(daemon=True)
        self.path, self.seed = path, seed
        self.paused, self.go = threading.Event(), threading.Event()
        self.error: OSError | None = None
        self.digest = blake3.blake3()

    def run(self) -> None:
        try:
            with open(self.path, "wb") as f:
                for index in range(SIZE // MiB):
                    if index * MiB == PAUSE_AT:
                        self.paused.set()
                        self.go.wait(120)
                    data = piece(self.seed, index)
                    f.write(data)
                    self.digest.update(data)
        except OSError as exc:
            self.error = exc
        finally:
            self.paused.set()


def expected_digest(seed: str) -> bytes:
    digest = blake3.blake3()
    for index in range(SIZE // MiB):
        digest.update(piece(seed, index))
    return digest.digest()


def file_digest(path: Path) -> bytes:
    digest = blake3.blake3()
    with open(path, "rb") as f:
        while data := f.read(4 * MiB):
            digest.update(data)
    return digest.digest()


def wait_for(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout}s"
        time.sleep(0.1)


def up_output(up) -> str:  # type: ignore[no-untyped-def]
    """What `up` wrote on its terminal (stdout and stderr)."""
    return str(up.proc.log_path.read_text(errors="replace"))


def interrupt_mid_write(up, writer: Writer) -> None:  # type: ignore[no-untyped-def]
    """Start WRITER, Ctrl-C `up` once it is mid-write, and wait until `up` says it waits."""
    writer.start()
    assert writer.paused.wait(120) and writer.error is None, writer.error
    up.proc.popen.send_signal(signal.SIGINT)
    wait_for(lambda: WAITING in up_output(up), 30, "up says it waits for the writer")


def test_fuse_ctrl_c_mid_write_waits_for_the_writer_and_commits_the_file_whole(
        start_cluster) -> None:
    up = start_cluster(*UP_ARGS)
    (up.mountpoint / "small").write_bytes(b"read while stopping")
    writer = Writer(up.mountpoint / "ckpt", "whole")
    interrupt_mid_write(up, writer)
    # While stopping: reads go on, and nothing new is opened for writing.
    assert (up.mountpoint / "small").read_bytes() == b"read while stopping"
    with pytest.raises(OSError) as refused:
        (up.mountpoint / "new").write_bytes(b"x")
    assert refused.value.errno == errno.EROFS
    time.sleep(1)
    assert up.proc.alive(), "up stopped before the writer closed its file"
    writer.go.set()
    writer.join(180)
    assert writer.error is None, writer.error
    assert up.proc.popen.wait(60) == 0
    assert "every file open for writing was closed and committed" in up_output(up)
    up.stop()
    again = start_cluster(*UP_ARGS, data_dir=up.data_dir, name="up2")
    path = again.mountpoint / "ckpt"
    assert path.stat().st_size == SIZE
    assert file_digest(path) == writer.digest.digest() == expected_digest("whole")
    assert not (again.mountpoint / "new").exists()


@pytest.mark.parametrize("how", ["second-ctrl-c", "stop-timeout"])
def test_fuse_stop_without_waiting_keeps_the_previous_version(start_cluster, how: str) -> None:
    timeout = ("--stop-timeout", "3") if how == "stop-timeout" else ()
    up = start_cluster(*UP_ARGS, *timeout, expected_noise=DISCARD_NOISE)
    path = up.mountpoint / "ckpt"
    v1 = piece("v1", 0) * 3
    path.write_bytes(v1)
    writer = Writer(path, "v2")  # truncates v1 and writes v2 over it
    interrupt_mid_write(up, writer)
    began = time.monotonic()
    if how == "second-ctrl-c":
        up.proc.popen.send_signal(signal.SIGINT)
    assert up.proc.popen.wait(60) == 0
    assert time.monotonic() - began < 20, "up did not stop at once"
    output = up_output(up)
    assert "1 file not closed in time: its uncommitted writes were discarded" in output
    writer.go.set()
    writer.join(60)
    assert writer.error is not None and writer.error.errno == errno.ENOTCONN, writer.error
    up.stop()
    # (the same log files: the first run's lines are checked again)
    again = start_cluster(*UP_ARGS, data_dir=up.data_dir, name="up2",
                          expected_noise=DISCARD_NOISE)
    path = again.mountpoint / "ckpt"
    assert path.read_bytes() == v1
    assert [v["size"] for v in cli_json("versions", str(path))["versions"]] == [len(v1)]


def test_fuse_up_exits_and_unmounts_when_its_mount_is_killed(start_cluster) -> None:
    up = start_cluster(*UP_ARGS,
                       expected_noise=[r"ERROR mosafs\.up\S*: mount exited with status"])
    os.kill(up.info["client"]["pid"], signal.SIGKILL)
    assert up.proc.popen.wait(60) == 1
    assert not is_dead_mount(up.mountpoint), "up left a dead mount point"
    assert not in_mount_table(up.mountpoint)
    up.stop()


def test_fuse_next_up_unmounts_a_dead_mount_point_and_says_so(start_cluster,
                                                              tmp_path: Path) -> None:
    first = start_cluster(*UP_ARGS, "--log-dir", str(tmp_path / "logs-crashed"))
    (first.mountpoint / "kept").write_bytes(b"committed before the crash")
    up_pid = first.proc.popen.pid
    children = [pid for pid in procs.children(up_pid) if pid != first.info["client"]["pid"]]
    os.kill(up_pid, signal.SIGSTOP)  # `up` must not clean up after its mount: both die
    os.kill(first.info["client"]["pid"], signal.SIGKILL)
    wait_for(lambda: is_dead_mount(first.mountpoint), 30, "a dead mount point")
    first.proc.kill()
    for pid in children:  # the manager and benefactors `up` left running
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: all(gone(pid) for pid in children), 60, "orphans stop")

    again = start_cluster(*UP_ARGS, data_dir=first.data_dir, name="up2",
                          expected_noise=[r"WARNING mosafs\.up\S*: .* is a mosafs mount whose "
                                          r"process is gone"])
    assert "Transport endpoint is not connected): unmounting it" in up_output(again)
    assert (again.mountpoint / "kept").read_bytes() == b"committed before the crash"


# -- processes and mounts ------------------------------------------------------------------

def in_mount_table(path: Path) -> bool:
    table = Path("/proc/self/mounts").read_text()
    return any(line.split()[1] == str(path) for line in table.splitlines())


def gone(pid: int) -> bool:
    return not procs.alive(pid)
