"""Versions of files fsync'ed while open, and where a version's chunks came from, through a
real mount (`mosafs up`) and the admin CLI (issue 16, points 6 and 7).

Point 7: a commit by fsync (or by the close of one of several writable descriptors) is
provisional: the same write session's next commit replaces it, so a program that rewrites
and fsyncs a file many times in one open session (a database) leaves one version, while
separate open/write/close sessions each leave theirs, and a writer killed after an fsync
leaves the fsync'ed version. Point 6: `mosafs stats` says which chunks came from the base
(named by its path), which were found elsewhere in the cluster, and which were stored.

One cluster serves the module (R=1, a small chunker so small files have several chunks);
each test works in its own folder and fails on noise in any log.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest

from tests.conftest import UpCluster, fuse_available, launch_up, stop_all
from tests.harness import cli, cli_json

KiB, MiB = 1 << 10, 1 << 20
CHUNKER = "cdc:16384:65536:262144"


def random_bytes(seed: str, n: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=n)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpCluster]:
    reason = fuse_available()
    if reason:
        pytest.skip(reason)
    up = launch_up(tmp_path_factory.mktemp("fsync"), "--replication", "1",
                   "--chunker", CHUNKER)
    try:
        yield up
    finally:
        stop_all([up])


@pytest.fixture
def folder(cluster: UpCluster, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh folder in the mount; no new noise in any log after the test."""
    before = len(cluster.proc.noise())
    path = cluster.mountpoint / re.sub(r"\W", "_", request.node.name)
    path.mkdir()
    yield path
    noise = cluster.proc.noise()[before:]
    assert not noise, "a process logged noise during this test:\n" + "\n".join(noise)


def versions(path: Path) -> list[dict[str, Any]]:
    return list(cli_json("versions", str(path))["versions"])


def command(code: str, *args: str) -> list[str]:
    """CODE as a process of its own: a real application, whose descriptors the kernel
    closes when it exits or is killed."""
    return [sys.executable, "-c", textwrap.dedent(code), *args]


def run_writer(code: str, *args: str, timeout: float = 120) -> None:
    done = subprocess.run(command(code, *args), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr


FSYNC_LOOP = """
    import os, sys
    path, steps, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    for step in range(steps):
        os.write(fd, bytes([step]) * size)
        os.fsync(fd)
    os.close(fd)
"""


def test_fuse_fsync_loop_in_one_open_session_leaves_one_version(folder: Path) -> None:
    path = folder / "journal"
    run_writer(FSYNC_LOOP, str(path), "20", str(40 * KiB))
    expected = b"".join(bytes([step]) * (40 * KiB) for step in range(20))
    assert path.read_bytes() == expected
    listed = versions(path)
    assert len(listed) == 1, listed
    stats = cli_json("stats", str(path))
    assert (stats["version"], stats["size"]) == (20, len(expected))
    # The version stands for the whole session: every chunk it stored counts as stored.
    assert (stats["committed_by"], stats["replaced_versions"]) == ("fsync", 19)
    assert stats["sources"]["stored"]["bytes"] + stats["sources"]["repeated"]["bytes"] \
        == len(expected)
    assert stats["sources"]["cluster"]["chunks"] == 0
    assert stats["deduped_against"] is None
    assert cli_json("fsck", str(folder))["findings"] == []


def test_fuse_separate_sessions_keep_their_versions(folder: Path) -> None:
    path = folder / "model.pt"
    for step in range(3):
        run_writer(FSYNC_LOOP, str(path), "2", str(10 * KiB + step))
    # Three sessions, each of two fsyncs: the second replaced the first, every session's
    # last version stays.
    assert [v["size"] for v in versions(path)] == [20 * KiB, 20 * KiB + 2, 20 * KiB + 4]
    # A plain open/write/close twice: two more versions.
    path.write_bytes(b"one")
    path.write_bytes(b"two")
    assert [v["size"] for v in versions(path)][-2:] == [3, 3]
    assert len(versions(path)) == 5


CRASH_AFTER_FSYNC = """
    import os, sys, time
    path, more = sys.argv[1], sys.argv[2]
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"A" * 100_000)
    os.fsync(fd)
    if more == "yes":
        os.write(fd, b"B" * 50_000)  # written, never fsync'ed
    print("synced", flush=True)
    time.sleep(120)
"""


def killed_after_fsync(path: Path, more: bool) -> None:
    with subprocess.Popen(command(CRASH_AFTER_FSYNC, str(path), "yes" if more else "no"),
                          stdout=subprocess.PIPE, text=True) as writer:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "synced\n"
        writer.send_signal(signal.SIGKILL)
        assert writer.wait(timeout=30) == -signal.SIGKILL  # its descriptors are closed now


def test_fuse_writer_killed_after_fsync_keeps_the_fsynced_version(folder: Path) -> None:
    path = folder / "state"
    killed_after_fsync(path, more=False)
    assert path.read_bytes() == b"A" * 100_000
    listed = versions(path)
    assert [v["size"] for v in listed] == [100_000]
    assert cli_json("stats", str(path))["committed_by"] == "fsync"
    # Another session does not replace the dead one's version: it adds its own.
    path.write_bytes(b"next")
    assert [v["size"] for v in versions(path)] == [100_000, 4]


def test_fuse_kill_closes_the_files_of_the_writer(folder: Path) -> None:
    """What was written after the fsync reaches the file: the kernel closes the killed
    process's descriptor, and that close commits, replacing the fsync'ed version."""
    path = folder / "state"
    killed_after_fsync(path, more=True)
    assert path.read_bytes() == b"A" * 100_000 + b"B" * 50_000
    listed = versions(path)
    assert [v["size"] for v in listed] == [150_000]
    stats = cli_json("stats", str(path))
    assert (stats["committed_by"], stats["replaced_versions"]) == ("close", 1)


def test_fuse_sqlite_database_of_20_transactions_has_one_version(folder: Path) -> None:
    """The issue's case: SQLite fsyncs the database at every commit of a transaction, with
    the file open all along (journal_mode DELETE: the journal is a file of its own, made
    and removed by every transaction)."""
    path = folder / "app.db"
    code = """
        import sqlite3, sys
        db = sqlite3.connect(sys.argv[1], isolation_level=None)
        db.execute("PRAGMA journal_mode=DELETE")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE t (n INTEGER, blob BLOB)")
        for n in range(20):
            db.execute("BEGIN")
            db.execute("INSERT INTO t VALUES (?, randomblob(50000))", (n,))
            db.execute("COMMIT")
        db.close()
    """
    run_writer(code, str(path), timeout=300)
    listed = versions(path)
    assert len(listed) == 1, listed
    assert listed[0]["size"] == path.stat().st_size > 20 * 50_000
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("SELECT count(*), sum(n) FROM t").fetchone() == (20, sum(range(20)))
    finally:
        db.close()
    assert sorted(p.name for p in folder.iterdir()) == ["app.db"]  # journals removed


# --- where a version's chunks came from ---------------------------------------------------------


def stats_text(path: Path) -> str:
    done = cli("stats", str(path))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_fuse_stats_names_the_base_and_what_was_found_where(folder: Path) -> None:
    step1 = random_bytes("step 1", 2 * MiB)
    (folder / "run.n0.1").write_bytes(step1)
    # The case: the next step written under a temporary name and renamed: no base
    # at write time, so everything it did not send was found elsewhere in the cluster.
    step2 = step1[:MiB] + random_bytes("step 2", 256 * KiB) + step1[MiB + 256 * KiB:]
    (folder / "ckpt.tmp").write_bytes(step2)
    os.rename(folder / "ckpt.tmp", folder / "run.n0.2")
    renamed = cli_json("stats", str(folder / "run.n0.2"))
    sources = renamed["sources"]
    assert renamed["base"] is None and renamed["deduped_against"] is None
    assert sources["cluster"]["bytes"] > MiB
    assert sources["stored"]["bytes"] == renamed["new_bytes"] < MiB
    assert sum(s["bytes"] for s in sources.values()) == len(step2)
    assert sum(s["chunks"] for s in sources.values()) == renamed["chunks"]
    text = stats_text(folder / "run.n0.2")
    assert f"found elsewhere in the cluster: {sources['cluster']['chunks']} chunks" in text
    assert "base: none" in text
    # A step written under its own name dedupes against the newest step of its series,
    # named by its path on this machine.
    step3 = step2[:MiB] + random_bytes("step 3", 256 * KiB) + step2[MiB + 256 * KiB:]
    (folder / "run.n0.3").write_bytes(step3)
    stats = cli_json("stats", str(folder / "run.n0.3"))
    base = stats["base"]
    assert (base["local_path"], base["version"]) == (str(folder / "run.n0.2"), 1)
    assert base["path"] == f"/{folder.name}/run.n0.2" and not base["removed"]
    assert stats["sources"]["base"]["bytes"] > MiB
    assert f"base: {folder / 'run.n0.2'}, version 1" in stats_text(folder / "run.n0.3")
    # The base removed since: said so.
    (folder / "run.n0.2").unlink()
    stats = cli_json("stats", str(folder / "run.n0.3"))
    assert stats["base"]["removed"] and stats["base"]["path"] is None
    assert "of a file removed since" in stats_text(folder / "run.n0.3")
    # A rewrite of the same file: its own previous version.
    (folder / "run.n0.3").write_bytes(step3[:-1])
    assert "base: version 1 of this file" in stats_text(folder / "run.n0.3")


def test_fuse_stats_json_is_one_object(folder: Path) -> None:
    (folder / "f").write_bytes(random_bytes("json", 100 * KiB))
    done = cli("stats", str(folder / "f"), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report["sources"]) == {"base", "stored", "cluster", "repeated"}
    assert report["committed_by"] == "close"


def test_fuse_chunks_of_a_replaced_version_are_stored_again_after_gc(
        start_cluster: Any) -> None:
    """A replaced provisional version releases its chunks, and garbage collection may
    delete them while the file is still open: when the session writes those bytes again,
    it must store them again, not count on the copies it stored for the replaced
    version."""
    up = start_cluster("--replication", "1", "--gc-grace", "1", "--chunker", CHUNKER)
    path = up.mountpoint / "db"
    first, second = random_bytes("first", 512 * KiB), random_bytes("second", 512 * KiB)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, first)
        os.fsync(fd)  # version 1, provisional
        os.ftruncate(fd, 0)
        os.pwrite(fd, second, 0)
        os.fsync(fd)  # version 2 replaces it: the chunks of `first` are unreferenced
        assert [v["size"] for v in versions(path)] == [len(second)]
        # Collected once the grace period is over (by the manager, or by a round):
        # only `second` stays stored (R=1).
        for _ in range(40):
            cli_json("gc", str(up.mountpoint))
            if up.stored_bytes() <= len(second):
                break
            time.sleep(0.5)
        assert up.stored_bytes() == len(second)
        os.ftruncate(fd, 0)
        os.pwrite(fd, first, 0)
    finally:
        os.close(fd)  # the final version: `first` again
    assert path.read_bytes() == first
    assert [v["size"] for v in versions(path)] == [len(first)]
    assert cli_json("fsck", str(up.mountpoint))["findings"] == []


def test_fuse_bytes_stored_but_never_committed_are_stored_again(folder: Path) -> None:
    """Chunks a session uploaded for content it then truncated away never reach the index:
    written again later in the same session, they must be stored again."""
    path = folder / "f"
    data, other = random_bytes("uploaded", 6 * MiB), random_bytes("other", 256 * KiB)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, data)  # one batch (4 MiB) goes to the benefactors at once
        os.ftruncate(fd, 0)  # ... and is thrown away before any commit
        os.pwrite(fd, other, 0)
        os.fsync(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)
    assert path.read_bytes() == data
    assert cli_json("fsck", str(folder))["findings"] == []
