"""File-system operations through a real mount: namespace calls, random-access writes,
truncation, appends, statfs."""

from __future__ import annotations

import errno
import os
import time

import pytest

MiB = 1 << 20


@pytest.fixture
def mnt(start_cluster):
    return start_cluster("--chunker", "cdc:4096:16384:65536").mountpoint


def test_fuse_namespace_operations(mnt):
    (mnt / "d1").mkdir()
    (mnt / "d1" / "f").write_bytes(b"one")
    (mnt / "d2").mkdir()
    assert sorted(os.listdir(mnt)) == ["d1", "d2"]
    os.rename(mnt / "d1" / "f", mnt / "d2" / "g")
    assert os.listdir(mnt / "d1") == []
    assert (mnt / "d2" / "g").read_bytes() == b"one"
    with pytest.raises(OSError) as info:
        os.rmdir(mnt / "d2")
    assert info.value.errno == errno.ENOTEMPTY
    with pytest.raises(FileExistsError):
        os.mkdir(mnt / "d2")
    with pytest.raises(FileNotFoundError):
        os.stat(mnt / "missing")
    os.unlink(mnt / "d2" / "g")
    os.rmdir(mnt / "d2")
    assert sorted(os.listdir(mnt)) == ["d1"]
    st = os.stat(mnt / "d1")
    assert st.st_nlink == 2
    fd = os.open(mnt / "x", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)
    os.close(fd)
    assert os.stat(mnt / "x").st_mode & 0o777 == 0o640
    with pytest.raises(FileExistsError):
        os.open(mnt / "x", os.O_CREAT | os.O_EXCL | os.O_WRONLY)


def test_fuse_random_writes_truncate_and_append(mnt):
    path = mnt / "f"
    model = bytearray(os.urandom(300_000))
    path.write_bytes(model)
    with open(path, "r+b") as f:
        for off, size in [(5, 10), (100_000, 70_000), (299_990, 50), (400_000, 3)]:
            chunk = os.urandom(size)
            f.seek(off)
            f.write(chunk)
            if off > len(model):
                model.extend(b"\0" * (off - len(model)))
            model[off:off + size] = chunk
        f.flush()
        f.seek(0)
        assert f.read() == bytes(model)  # uncommitted content read back through the mount
    assert path.read_bytes() == bytes(model)
    os.truncate(path, 123_457)
    del model[123_457:]
    assert path.read_bytes() == bytes(model)
    os.truncate(path, 200_000)
    model.extend(b"\0" * (200_000 - len(model)))
    assert path.read_bytes() == bytes(model)
    with open(path, "ab") as f:
        tail = os.urandom(90_000)
        f.write(tail)
    model.extend(tail)
    assert os.stat(path).st_size == len(model)
    assert path.read_bytes() == bytes(model)
    with open(path, "wb") as f:  # O_TRUNC
        f.write(b"short")
    assert path.read_bytes() == b"short"


def test_fuse_statfs_reports_benefactor_space(mnt):
    st = os.statvfs(mnt)
    assert st.f_blocks > 0
    assert 0 < st.f_bavail <= st.f_blocks
    assert st.f_namemax == 255


def _version(path) -> int:
    return int(os.getxattr(path, "user.mosafs.version"))


def test_fuse_each_close_after_writing_makes_one_version(mnt):
    path = mnt / "f"
    path.write_bytes(b"first")
    assert _version(path) == 1
    # What a shell does for `echo x > f`: open(O_TRUNC), dup2 the fd, close the original
    # (a flush of the still-empty file), write, close.
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    dup = os.dup(fd)
    os.close(fd)
    os.write(dup, b"second")
    os.close(dup)
    assert path.read_bytes() == b"second"
    assert _version(path) == 2
    # Emptying a file on purpose is a version too, committed by the release that follows
    # the last close (the kernel sends it asynchronously, so wait for it).
    os.close(os.open(path, os.O_WRONLY | os.O_TRUNC))
    assert path.read_bytes() == b""
    deadline = time.monotonic() + 10
    while _version(path) != 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _version(path) == 3
    # Reopening without writing commits nothing.
    os.close(os.open(path, os.O_RDWR))
    assert _version(path) == 3
