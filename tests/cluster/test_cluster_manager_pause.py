"""The manager out of reach while a mount works (SIGSTOP: its connections stay open and
nothing answers): a write in progress completes once it answers again, byte for byte; a
call that waits longer than --manager-timeout fails with ETIMEDOUT and the mount stays up;
everything works again when the manager returns."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import blake3
import pytest

from tests import harness
from tests.cluster.conftest import start_cluster

MiB = 1 << 20
# While the manager is stopped, benefactors' heartbeats and the mount's lease renewals fail.
NOISE = [r"heartbeat|manager .* (unreachable|did not answer)|cannot renew|registration",
         r"DEADLINE_EXCEEDED|Deadline Exceeded|UNAVAILABLE"]


def test_cluster_write_survives_a_manager_stopped_for_10_s(tmp_path: Path,
                                                           cluster_factory: list) -> None:
    cluster = start_cluster(tmp_path)
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt", "--manager-timeout", "60")
    for proc in [*cluster.benefactors, *cluster.mounts]:
        proc.expected_noise = NOISE
    data = blake3.blake3(b"written across a pause").digest(length=24 * MiB)
    outcome: dict[str, object] = {}

    def write() -> None:
        try:
            with open(mnt / "ckpt", "wb") as f:
                for off in range(0, len(data), MiB):
                    f.write(data[off:off + MiB])
                    time.sleep(0.05)
            outcome["closed"] = time.monotonic()
        except OSError as exc:
            outcome["error"] = exc

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(0.4)  # the write is under way
    harness.pause(cluster.manager.popen.pid)
    stopped = time.monotonic()
    time.sleep(10)
    os.kill(cluster.manager.popen.pid, signal.SIGCONT)
    writer.join(timeout=120)
    assert not writer.is_alive()
    # Either outcome is allowed, never a corrupt file: here the lease outlives the pause.
    assert "error" not in outcome, outcome
    assert float(outcome["closed"]) > stopped  # type: ignore[arg-type]
    assert (mnt / "ckpt").read_bytes() == data
    assert os.listdir(mnt) == ["ckpt"]  # the mount stayed usable
    fresh = cluster.mount("fresh")
    assert (fresh / "ckpt").read_bytes() == data


def test_cluster_calls_time_out_while_the_manager_is_away_and_recover(
        tmp_path: Path, cluster_factory: list) -> None:
    cluster = start_cluster(tmp_path)
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt", "--manager-timeout", "2")
    for proc in [*cluster.benefactors, *cluster.mounts]:
        proc.expected_noise = NOISE
    (mnt / "before").write_bytes(b"x")
    harness.pause(cluster.manager.popen.pid)
    try:
        started = time.monotonic()
        with pytest.raises(OSError) as caught:
            os.stat(mnt / "never-looked-up")
        waited = time.monotonic() - started
        assert caught.value.errno == errno.ETIMEDOUT
        assert 1.5 <= waited < 15, waited  # bounded: --manager-timeout, plus retries
        # Still mounted (stat would wait for the manager too: /proc/mounts does not).
        assert str(mnt) in Path("/proc/mounts").read_text()
    finally:
        os.kill(cluster.manager.popen.pid, signal.SIGCONT)
    with pytest.raises(FileNotFoundError):
        os.stat(mnt / "never-looked-up")
    (mnt / "after").write_bytes(b"y")
    assert sorted(os.listdir(mnt)) == ["after", "before"]


def test_cluster_a_mount_stopped_while_its_manager_is_away_still_exits(
        tmp_path: Path, cluster_factory: list) -> None:
    """SIGTERM to a mount while an application's create waits on the paused manager and
    the mount, its coherence lost, takes the directory's names back from the kernel: the
    kernel takes the directory's lock for that invalidation, and the create holds it until
    answered. The mount lets every invalidation in flight end while its FUSE loop still
    answers (the create fails once --manager-timeout has passed), starts none after, and
    exits. An invalidation left waiting when the loop had ended, on a request that came
    too late to be answered, kept its thread in the kernel on the connection's file, so
    the connection never closed, the request was never failed and the mount's process
    never exited (seen once in a loop of manager restarts under a writer; that
    interleaving is too narrow to reproduce on purpose)."""
    cluster = start_cluster(tmp_path)
    cluster_factory.append(cluster)
    mnt = cluster.mount("mnt", "--manager-timeout", "10")
    mount = cluster.mounts[-1]
    for proc in [*cluster.benefactors, mount]:
        proc.expected_noise = NOISE
    connection = os.minor(os.stat(mnt).st_dev)  # its number under /sys/fs/fuse/connections
    folder = mnt / "d"
    folder.mkdir()
    for i in range(8):
        (folder / f"f{i}").write_bytes(b"x")
    assert sorted(os.listdir(folder)) == [f"f{i}" for i in range(8)]  # names held for long
    outcome: dict[str, object] = {}

    def create() -> None:
        try:
            (folder / "new").write_bytes(b"y")
            outcome["created"] = True
        except OSError as exc:
            outcome["errno"] = exc.errno

    creator = threading.Thread(target=create, daemon=True)
    harness.pause(cluster.manager.popen.pid)
    try:
        creator.start()
        deadline = time.monotonic() + 30
        while "metadata caches no longer coherent" not in mount.log():
            assert time.monotonic() < deadline, mount.log()
            time.sleep(0.05)
        time.sleep(0.5)  # the invalidation waits for the directory
        assert creator.is_alive(), outcome  # the create waits on the manager
        mount.popen.send_signal(signal.SIGTERM)
        try:
            mount.popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _abort(connection)  # frees this process's create and the stuck mount
            raise AssertionError(f"the mount did not exit:\n{mount.log()}") from None
    finally:
        os.kill(cluster.manager.popen.pid, signal.SIGCONT)
    creator.join(timeout=30)
    assert not creator.is_alive()
    assert mount.popen.returncode == 0, mount.log()
    assert outcome.get("errno") == errno.ETIMEDOUT, outcome  # answered by the loop
    assert "waiting for 1 cache invalidation(s) in flight" in mount.log(), mount.log()


def _abort(connection: int) -> None:
    """Abort FUSE connection CONNECTION: every request waiting on it fails at once."""
    control = Path("/sys/fs/fuse/connections")
    mounted = not (control / str(connection)).exists() and subprocess.run(
        ["mount", "-t", "fusectl", "none", str(control)], check=False).returncode == 0
    try:
        with contextlib.suppress(OSError):
            (control / str(connection) / "abort").write_text("1")
    finally:
        if mounted:  # leave the control file system as it was found
            subprocess.run(["umount", str(control)], check=False)
