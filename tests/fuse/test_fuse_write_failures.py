"""A write session after a failure (docs/client.md, "When a write fails"): what the
application was told failed changes nothing, a retry stores what it wrote, and the mount
never shows bytes that no version holds.

Real `mosafs up` clusters and mounts; failures made as they happen: chunk files corrupted
on the benefactor's disk, a benefactor's disk filled (tmpfs), a version pruned and
collected under an open session.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest

from tests import harness

KiB, MiB = 1 << 10, 1 << 20
CHUNKER = "cdc:16384:65536:262144"  # small chunks: a 1 MiB file is a dozen of them
FULL = [r"No space left|is full|no space|not enough space|full",
        r"unmounting with uncommitted changes"]


def _data(seed: str, n: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=n)


def _versions(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return harness.cli_json("versions", str(path))["versions"]  # type: ignore[no-any-return]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """The only benefactor's data directory on a 24 MiB tmpfs."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a tmpfs for the benefactor's disk)")
    with harness.tmpfs(tmp_path / "data" / "benefactors" / "b0", "24M") as path:
        yield path


def _fill(disk: Path) -> Path:
    """Fill DISK to the last byte; the ballast file, to unlink for room again."""
    ballast = disk / "ballast"
    with open(ballast, "wb") as f:
        try:
            while True:
                f.write(b"\1" * MiB)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return ballast


def test_an_overwrite_whose_base_cannot_be_read_changes_nothing(start_cluster) -> None:
    cluster = start_cluster("--replication", "1", "--chunker", CHUNKER,
                            expected_noise=[r"WARNING .*corrupt", r"does not verify"])
    path = cluster.mountpoint / "f"
    orig = _data("orig", MiB)
    path.write_bytes(orig)
    chunks = {chunk: chunk.read_bytes() for chunk in cluster.chunk_files()}
    assert len(chunks) > 2
    for chunk, raw in chunks.items():  # no intact copy left: the base cannot be fetched
        chunk.write_bytes(raw[:100] + bytes([raw[100] ^ 0xFF]) + raw[101:])
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(OSError) as failed:
            os.pwrite(fd, b"X" * 10, 100)  # an overwrite: the session fetches the base
        assert failed.value.errno == errno.EIO
    finally:
        os.close(fd)  # nothing was written: nothing to commit
    versions = _versions(path)
    assert [(v["version"], v["size"], v["chunks"]) for v in versions] == \
        [(1, MiB, len(chunks))], "no version of made-up bytes"


@pytest.mark.parametrize("mode", ["spill", "stream"])
def test_a_retry_after_a_failed_upload_stores_the_bytes(
        small_disk: Path, start_cluster, mode: str) -> None:
    cluster = start_cluster("--benefactors", "1", "--replication", "1",
                            "--chunker", CHUNKER, expected_noise=FULL)
    path = cluster.mountpoint / "f"
    data = _data("payload", MiB)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        offset = 1 if mode == "spill" else 0  # past the end: a local spill file
        os.pwrite(fd, data, offset)
        ballast = _fill(small_disk)
        with pytest.raises(OSError):
            os.fsync(fd)
        ballast.unlink()
        time.sleep(3)  # the benefactor's next heartbeat has room again
        if mode == "stream":
            os.ftruncate(fd, 0)  # the streamed bytes were lost: written anew
            os.pwrite(fd, data, 0)
        os.fsync(fd)  # stores every chunk the failed attempt did not
    finally:
        os.close(fd)
    assert path.read_bytes() == b"\0" * offset + data


def test_a_failed_last_close_leaves_the_committed_version_in_view(
        small_disk: Path, start_cluster) -> None:
    cluster = start_cluster("--benefactors", "1", "--replication", "1",
                            "--chunker", CHUNKER, expected_noise=FULL)
    path = cluster.mountpoint / "f"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    os.pwrite(fd, _data("payload", MiB), 1)  # a spill file
    ballast = _fill(small_disk)
    try:
        with pytest.raises(OSError):
            os.close(fd)  # its flush fails, and so does the release's commit
        time.sleep(2)
        assert _versions(path) == []
        assert os.stat(path).st_size == 0, "the size of bytes that no version holds"
        assert path.read_bytes() == b""
    finally:
        ballast.unlink()


def test_a_base_pruned_and_collected_under_an_open_session_is_stored_again(
        start_cluster) -> None:
    up = start_cluster("--replication", "1", "--gc-grace", "1", "--chunker", CHUNKER,
                       expected_noise=[r"unmounting with uncommitted changes"])
    folder = up.mountpoint / "ckpt"
    folder.mkdir()
    assert harness.cli("policy", "set", str(folder), "--keep-last", "1").returncode == 0
    path = folder / "model.pt"
    first, second = _data("first", 512 * KiB), _data("second", 512 * KiB)
    path.write_bytes(first)  # version 1: the base of the session below
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, second, 0)
        os.fsync(fd)  # version 2; the policy prunes version 1
        assert [v["size"] for v in _versions(path)] == [len(second)]
        for _ in range(40):
            harness.cli_json("gc", str(up.mountpoint))
            if up.stored_bytes() <= len(second):
                break
            time.sleep(0.5)
        assert up.stored_bytes() == len(second), "version 1's chunks were not collected"
        os.ftruncate(fd, 0)
        os.pwrite(fd, first, 0)  # the base's bytes again: stored again, not assumed
    finally:
        os.close(fd)
    assert path.read_bytes() == first


def _failed_overwrite(cluster, disk: Path) -> tuple[Path, bytes, Path]:  # type: ignore[no-untyped-def]
    """Version 1 of 1 MiB, then an overwrite whose close fails (DISK full): the file, its
    version 1's bytes, and the ballast to unlink."""
    path = cluster.mountpoint / "f"
    old = _data("old", MiB)
    path.write_bytes(old)
    assert path.read_bytes() == old
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, _data("new", MiB), 0)  # an overwrite: a spill file, stored at close
    ballast = _fill(disk)
    with pytest.raises(OSError):
        os.close(fd)
    return path, old, ballast


def test_a_read_right_after_a_failed_close_reads_the_committed_version(
        small_disk: Path, start_cluster) -> None:
    # The kernel sends RELEASE after close(2) returned; a read meanwhile waits for the
    # session that the release's failed commit then ends.
    cluster = start_cluster("--benefactors", "1", "--replication", "1",
                            "--chunker", CHUNKER, expected_noise=FULL)
    path, old, ballast = _failed_overwrite(cluster, small_disk)
    try:
        assert path.read_bytes() == old
    finally:
        ballast.unlink()


def test_the_kernel_keeps_no_page_of_a_failed_write(small_disk: Path,
                                                    start_cluster) -> None:
    cluster = start_cluster("--benefactors", "1", "--replication", "1",
                            "--chunker", CHUNKER, expected_noise=FULL)
    path, old, ballast = _failed_overwrite(cluster, small_disk)
    try:
        time.sleep(3)  # the release is done, the attribute timeout (1 s) past
        assert [v["version"] for v in _versions(path)] == [1]
        assert os.stat(path).st_size == len(old)
        assert path.read_bytes() == old, "the page cache served the failed write's bytes"
    finally:
        ballast.unlink()
