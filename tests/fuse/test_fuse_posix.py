"""POSIX semantics and errnos through a real mount, as Linux programs see them on a local
file system: open flags, holes, truncation (EFBIG past the largest file), rename and its
errors, directories, symlinks, FIFOs, sockets and device nodes, hard links,
chmod/chown/utimens, permission checks for a non-root user, extended attributes, statfs,
fsync.

One cluster (`mosafs up`, default chunker) serves the whole module; each test works in
its own directory and fails if a process logged a warning, an error or a traceback while
it ran.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mosafs.client.files.writer import MAX_FILE_SIZE
from tests.conftest import UpCluster, fuse_available, launch_up

KiB = 1 << 10
MiB = 1 << 20
NOBODY = 65534  # uid and gid of nobody/nogroup
_noise_seen: dict[int, int] = {}  # cluster -> noise lines already reported by a test


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpCluster]:
    reason = fuse_available()
    if reason:
        pytest.skip(reason)
    up = launch_up(tmp_path_factory.mktemp("posix"))
    mnt, proc = up.mountpoint, up.proc
    _noise_seen[id(up)] = 0
    try:
        yield up
    finally:
        try:
            up.stop(check=False)
        finally:
            if os.path.ismount(mnt):
                os.system(f"fusermount3 -u -z {mnt}")
        # Each test checked the noise it caused; what is left came with the shutdown.
        noise = proc.noise()[_noise_seen.pop(id(up)):]
        assert not noise, "noise while stopping the cluster:\n" + "\n".join(noise)


@pytest.fixture
def d(cluster: UpCluster, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory in the mount for this test; no new noise in any log after it."""
    before = len(cluster.proc.noise())
    path = cluster.mountpoint / re.sub(r"\W", "_", request.node.name)
    path.mkdir()
    yield path
    noise = cluster.proc.noise()
    _noise_seen[id(cluster)] = len(noise)
    assert not noise[before:], ("a process logged noise during this test:\n"
                                + "\n".join(noise[before:]))


def raises_errno(expected: int | tuple[int, ...], fn: Callable[..., Any], *args: Any,
                 **kwargs: Any) -> None:
    wanted = expected if isinstance(expected, tuple) else (expected,)
    with pytest.raises(OSError) as info:
        fn(*args, **kwargs)
    got = info.value.errno or 0
    assert got in wanted, (f"{fn.__name__}{args}: errno {errno.errorcode.get(got, got)}, "
                           f"expected {' or '.join(errno.errorcode[e] for e in wanted)}")


# -- open flags, holes, truncation -------------------------------------------------------------


def test_fuse_posix_o_excl_on_existing_file_is_eexist(d: Path) -> None:
    p = d / "f"
    fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, b"first")
    os.close(fd)
    raises_errno(errno.EEXIST, os.open, p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    raises_errno(errno.EEXIST, os.open, p, os.O_CREAT | os.O_EXCL | os.O_RDONLY)
    (d / "sub").mkdir()
    raises_errno(errno.EEXIST, os.open, d / "sub", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    assert p.read_bytes() == b"first"
    # O_CREAT without O_EXCL opens the existing file and keeps its content.
    os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o600))
    assert p.read_bytes() == b"first"
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o644


def test_fuse_posix_a_lock_file_renamed_while_a_listing_is_open_can_be_made_again(
        d: Path) -> None:
    """git's lock files with a listing of their directory open: `config.lock` renamed to
    `config` after the directory's listing was read, that listing then handed to the
    kernel (it may list the old name: POSIX leaves it open), and `config.lock` made again
    with O_EXCL. The kernel must not keep the listed old name: the create failed with
    EEXIST while it did (a CI run of git clone into a mount)."""
    (d / "HEAD").write_bytes(b"ref")
    for round_ in range(3):
        lock = d / "config.lock"
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, b"[core] %d" % round_)
        os.close(fd)
        listed = os.open(d, os.O_RDONLY | os.O_DIRECTORY)  # opendir: the listing is read
        try:
            os.rename(lock, d / "config")
            names = os.listdir(listed)  # readdir of the listing read before the rename
        finally:
            os.close(listed)
        assert "config" in names or "config.lock" in names, names
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
        os.unlink(lock)
    assert (d / "config").read_bytes() == b"[core] 2"
    assert sorted(os.listdir(d)) == ["HEAD", "config"]


def test_fuse_posix_open_missing_is_enoent(d: Path) -> None:
    raises_errno(errno.ENOENT, os.open, d / "missing", os.O_RDONLY)
    raises_errno(errno.ENOENT, os.open, d / "missing", os.O_WRONLY)
    raises_errno(errno.ENOENT, os.open, d / "no-dir" / "f", os.O_CREAT | os.O_WRONLY)
    raises_errno(errno.ENOENT, os.stat, d / "missing")
    raises_errno(errno.ENOENT, os.unlink, d / "missing")
    raises_errno(errno.ENOENT, os.rename, d / "missing", d / "other")
    (d / "file").write_bytes(b"x")
    raises_errno(errno.ENOTDIR, os.open, d / "file" / "f", os.O_CREAT | os.O_WRONLY)
    raises_errno(errno.ENOTDIR, os.listdir, d / "file")


def test_fuse_posix_o_append_always_writes_at_the_end(d: Path) -> None:
    p = d / "log"
    p.write_bytes(b"0123456789")
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, b"abc")
        assert os.lseek(fd, 0, os.SEEK_CUR) == 13
        os.lseek(fd, 2, os.SEEK_SET)
        os.write(fd, b"def")
    finally:
        os.close(fd)
    assert p.read_bytes() == b"0123456789abcdef"
    # Another descriptor's write before an append: the append lands after it.
    a = os.open(p, os.O_RDWR | os.O_APPEND)
    b = os.open(p, os.O_RDWR)
    try:
        os.pwrite(b, b"XYZW", 16)
        os.write(a, b"!")
        assert os.pread(b, 100, 0) == b"0123456789abcdefXYZW!"
    finally:
        os.close(a)
        os.close(b)
    assert p.read_bytes() == b"0123456789abcdefXYZW!"


def test_fuse_posix_o_trunc_empties_the_file(d: Path) -> None:
    p = d / "f"
    p.write_bytes(os.urandom(3 * MiB))
    fd = os.open(p, os.O_RDWR | os.O_TRUNC)
    try:
        assert os.fstat(fd).st_size == 0
        assert os.pread(fd, 100, 0) == b""
        os.write(fd, b"new")
    finally:
        os.close(fd)
    assert p.read_bytes() == b"new"
    assert os.stat(p).st_size == 3
    os.close(os.open(p, os.O_WRONLY | os.O_TRUNC))
    assert p.read_bytes() == b""
    assert os.stat(p).st_size == 0
    # Emptying is committed by the release after the close, which the kernel sends while
    # the next open and read already run: repeat to catch races there.
    for i in range(50):
        p.write_bytes(b"x" * 1000)
        os.close(os.open(p, os.O_WRONLY | os.O_TRUNC))
        got = p.read_bytes()
        assert got == b"", f"iteration {i}: read {len(got)} bytes after O_TRUNC and close"


def test_fuse_posix_holes_read_as_zeros(d: Path) -> None:
    p = d / "sparse"
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.pwrite(fd, b"end", 5 * MiB)
        assert os.fstat(fd).st_size == 5 * MiB + 3
        assert os.pread(fd, 4096, 1 * MiB) == bytes(4096)  # before commit
    finally:
        os.close(fd)
    data = p.read_bytes()
    assert len(data) == 5 * MiB + 3
    assert data[:5 * MiB] == bytes(5 * MiB)
    assert data[5 * MiB:] == b"end"
    # A hole in the middle of an existing file, past its end with seek + write.
    q = d / "middle"
    head = os.urandom(100 * KiB)
    q.write_bytes(head)
    with open(q, "r+b") as f:
        f.seek(300 * KiB)
        f.write(b"tail")
    assert q.read_bytes() == head + bytes(200 * KiB) + b"tail"


def test_fuse_posix_truncate_down_and_up(d: Path) -> None:
    p = d / "f"
    data = os.urandom(2 * MiB + 123)
    p.write_bytes(data)
    os.truncate(p, 1 * MiB + 7)
    assert os.stat(p).st_size == 1 * MiB + 7
    assert p.read_bytes() == data[:1 * MiB + 7]
    os.truncate(p, 3 * MiB)
    assert p.read_bytes() == data[:1 * MiB + 7] + bytes(3 * MiB - (1 * MiB + 7))
    with open(p, "r+b") as f:
        f.truncate(10)
        assert os.fstat(f.fileno()).st_size == 10
        f.seek(0)
        assert f.read() == data[:10]
        f.truncate(20)
        f.seek(0)
        assert f.read() == data[:10] + bytes(10)
    assert p.read_bytes() == data[:10] + bytes(10)
    os.truncate(p, 0)
    assert p.read_bytes() == b""
    assert os.stat(p).st_size == 0


def test_fuse_posix_sizes_past_the_largest_file_are_efbig(d: Path,
                                                          cluster: UpCluster) -> None:
    """pjdfstest's truncate of 999999999999999 bytes (and writes past the largest file):
    EFBIG, the file unchanged, and no bug in the mount's log."""
    p = d / "f"
    p.write_bytes(b"keep")
    done = subprocess.run(["truncate", "-s", "999999999999999", str(p)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "File too large" in done.stderr, done
    raises_errno(errno.EFBIG, os.truncate, p, 999_999_999_999_999)
    (d / "empty").write_bytes(b"")
    raises_errno(errno.EFBIG, os.truncate, d / "empty", MAX_FILE_SIZE + 1)
    assert os.stat(d / "empty").st_size == 0
    fd = os.open(p, os.O_RDWR)
    try:
        raises_errno(errno.EFBIG, os.ftruncate, fd, 999_999_999_999_999)
        raises_errno(errno.EFBIG, os.pwrite, fd, b"x", MAX_FILE_SIZE)
        raises_errno(errno.EFBIG, os.pwrite, fd, b"x", 999_999_999_999_999)
        assert os.fstat(fd).st_size == 4
        os.pwrite(fd, b"!", 4)  # the descriptor still works
    finally:
        os.close(fd)
    assert p.read_bytes() == b"keep!"
    assert "bug in" not in cluster.proc.log()


def test_fuse_posix_fsync_then_read_back(d: Path) -> None:
    p = d / "f"
    data = os.urandom(MiB + 17)
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
        assert p.read_bytes() == data  # another descriptor, while this one is open
        os.pwrite(fd, b"patch", 1000)
        os.fdatasync(fd)
        assert os.pread(fd, len(data), 0) == data[:1000] + b"patch" + data[1005:]
    finally:
        os.close(fd)
    assert p.read_bytes() == data[:1000] + b"patch" + data[1005:]


def test_fuse_posix_readers_see_other_descriptors_changes(d: Path) -> None:
    """On one machine every descriptor of a file sees the same bytes: a reader opened before
    another descriptor's write is committed (closed), or before a truncate by path, reads
    the new bytes."""
    p = d / "f"
    p.write_bytes(b"")
    w = os.open(p, os.O_WRONLY)
    os.pwrite(w, b"x" * 100_000, 0)
    r = os.open(p, os.O_RDONLY)  # opened while the write is not yet committed
    os.close(w)  # commits
    try:
        got = os.pread(r, 100_000, 0)
        assert got == b"x" * 100_000, (
            f"a reader opened before the writer closed read {len(got)} bytes "
            f"starting {got[:8]!r}; expected 100000 x")
    finally:
        os.close(r)
    old = os.urandom(200 * KiB)
    p.write_bytes(old)
    r = os.open(p, os.O_RDONLY)
    try:
        assert os.pread(r, 10, 0) == old[:10]
        os.truncate(p, 300 * KiB)
        assert os.fstat(r).st_size == 300 * KiB
        got = os.pread(r, 300 * KiB, 0)
        assert got == old + bytes(100 * KiB), (
            f"a reader opened before truncate() read {len(got)} bytes; expected {300 * KiB}")
        new = os.urandom(400 * KiB)
        with open(p, "r+b") as f:
            f.write(new)
        assert os.pread(r, 400 * KiB, 0) == new, "a reader missed a write closed by another fd"
    finally:
        os.close(r)


# -- names: rename, unlink, directories --------------------------------------------------------


def test_fuse_posix_rename_over_an_existing_file(d: Path) -> None:
    (d / "a").write_bytes(b"content of a")
    (d / "b").write_bytes(b"old b, longer than a" * 1000)
    ino = os.stat(d / "a").st_ino
    os.rename(d / "a", d / "b")
    assert not (d / "a").exists()
    assert (d / "b").read_bytes() == b"content of a"
    assert os.stat(d / "b").st_ino == ino
    assert sorted(os.listdir(d)) == ["b"]


def test_fuse_posix_rename_across_directories(d: Path) -> None:
    (d / "x").mkdir()
    (d / "y").mkdir()
    data = os.urandom(300 * KiB)
    (d / "x" / "f").write_bytes(data)
    os.rename(d / "x" / "f", d / "y" / "g")
    assert os.listdir(d / "x") == []
    assert os.listdir(d / "y") == ["g"]
    assert (d / "y" / "g").read_bytes() == data
    raises_errno(errno.ENOENT, os.stat, d / "x" / "f")


def test_fuse_posix_rename_a_directory_with_contents(d: Path) -> None:
    src = d / "src"
    (src / "deep" / "deeper").mkdir(parents=True)
    (src / "f").write_bytes(b"f")
    (src / "deep" / "deeper" / "g").write_bytes(b"g" * 70000)
    (d / "dest").mkdir()
    os.rename(src, d / "dest" / "moved")
    assert not src.exists()
    moved = d / "dest" / "moved"
    assert sorted(os.listdir(moved)) == ["deep", "f"]
    assert (moved / "f").read_bytes() == b"f"
    assert (moved / "deep" / "deeper" / "g").read_bytes() == b"g" * 70000
    assert os.stat(d).st_nlink == 3  # ".", its entry in the parent, dest/..
    assert os.stat(d / "dest").st_nlink == 3
    # Over an empty directory: allowed; over a non-empty one: ENOTEMPTY.
    (d / "empty").mkdir()
    os.rename(moved, d / "empty")
    assert (d / "empty" / "f").read_bytes() == b"f"
    (d / "other").mkdir()
    (d / "other" / "x").write_bytes(b"x")
    raises_errno((errno.ENOTEMPTY, errno.EEXIST), os.rename, d / "empty", d / "other")


def test_fuse_posix_rename_errors(d: Path) -> None:
    (d / "dir" / "sub").mkdir(parents=True)
    (d / "file").write_bytes(b"f")
    raises_errno(errno.EINVAL, os.rename, d / "dir", d / "dir" / "sub" / "inside")
    raises_errno(errno.EINVAL, os.rename, d / "dir", d / "dir" / "inside")
    raises_errno(errno.EISDIR, os.rename, d / "file", d / "dir")
    raises_errno(errno.ENOTDIR, os.rename, d / "dir", d / "file")
    assert (d / "file").read_bytes() == b"f"
    assert os.listdir(d / "dir") == ["sub"]


def test_fuse_posix_rmdir_and_unlink_errors(d: Path) -> None:
    (d / "full").mkdir()
    (d / "full" / "f").write_bytes(b"f")
    raises_errno(errno.ENOTEMPTY, os.rmdir, d / "full")
    raises_errno(errno.EISDIR, os.unlink, d / "full")  # Linux: EISDIR (POSIX allows EPERM)
    raises_errno(errno.ENOTDIR, os.rmdir, d / "full" / "f")
    raises_errno(errno.EEXIST, os.mkdir, d / "full")
    raises_errno(errno.EEXIST, os.mkdir, d / "full" / "f")
    os.unlink(d / "full" / "f")
    os.rmdir(d / "full")
    assert os.listdir(d) == []


def test_fuse_posix_unlinked_open_file_stays_readable_and_writable(d: Path) -> None:
    p = d / "f"
    data = os.urandom(1 * MiB + 5)
    p.write_bytes(data)
    r = os.open(p, os.O_RDONLY)
    w = os.open(p, os.O_RDWR)
    try:
        os.unlink(p)
        assert not p.exists()
        assert os.listdir(d) == []
        assert os.fstat(r).st_nlink == 0
        assert os.fstat(r).st_size == len(data)
        assert os.pread(r, len(data), 0) == data
        os.pwrite(w, b"still here", 100)
        os.fsync(w)
        assert os.pread(w, 10, 100) == b"still here"
        assert os.pread(r, 10, 100) == b"still here"
        # A new file under the same name is another file.
        p.write_bytes(b"new")
        assert os.pread(r, 5, 0) == data[:5]
    finally:
        os.close(w)
        os.close(r)
    assert p.read_bytes() == b"new"
    # A descriptor open for reading and writing that has not written (nor read) yet.
    q = d / "g"
    q.write_bytes(b"y" * 5000)
    rw = os.open(q, os.O_RDWR)
    try:
        os.unlink(q)
        assert os.pread(rw, 100, 0) == b"y" * 100
        os.pwrite(rw, b"z", 0)
        assert os.pread(rw, 3, 0) == b"zyy"
    finally:
        os.close(rw)


def test_fuse_posix_rename_over_an_open_file_keeps_its_bytes(d: Path) -> None:
    (d / "target").write_bytes(b"old target")
    (d / "src").write_bytes(b"replacement")
    r = os.open(d / "target", os.O_RDONLY)
    try:
        os.rename(d / "src", d / "target")
        assert (d / "target").read_bytes() == b"replacement"
        assert os.pread(r, 100, 0) == b"old target"
        assert os.fstat(r).st_nlink == 0
    finally:
        os.close(r)


# -- symlinks, FIFOs, sockets, devices, hard links ---------------------------------------------


def test_fuse_posix_symlink_and_readlink(d: Path) -> None:
    (d / "dir").mkdir()
    (d / "dir" / "target").write_bytes(b"through the link")
    os.symlink("dir/target", d / "rel")
    os.symlink(str(d / "dir"), d / "abs")
    os.symlink("nowhere/at/all", d / "dangling")
    assert os.readlink(d / "rel") == "dir/target"
    assert os.readlink(d / "abs") == str(d / "dir")
    assert os.readlink(d / "dangling") == "nowhere/at/all"
    st = os.lstat(d / "rel")
    assert stat.S_ISLNK(st.st_mode)
    assert st.st_size == len("dir/target")
    assert stat.S_ISREG(os.stat(d / "rel").st_mode)
    assert (d / "rel").read_bytes() == b"through the link"
    assert (d / "abs" / "target").read_bytes() == b"through the link"
    assert os.path.isdir(d / "abs")
    raises_errno(errno.ENOENT, os.stat, d / "dangling")
    raises_errno(errno.EEXIST, os.symlink, "x", d / "rel")
    raises_errno(errno.EINVAL, os.readlink, d / "dir" / "target")
    # Writing through a link writes the target.
    with open(d / "rel", "ab") as f:
        f.write(b"!")
    assert (d / "dir" / "target").read_bytes() == b"through the link!"
    # A long target, non-ASCII bytes; rename and unlink act on the link itself.
    long_target = "x/" * 1000 + "é"
    os.symlink(long_target, d / "long")
    assert os.readlink(d / "long") == long_target
    os.rename(d / "rel", d / "rel2")
    assert os.readlink(d / "rel2") == "dir/target"
    os.unlink(d / "rel2")
    assert (d / "dir" / "target").exists()
    kinds = {e.name: (e.is_symlink(), e.is_dir(follow_symlinks=False)) for e in os.scandir(d)}
    assert kinds == {"dir": (False, True), "abs": (True, False), "dangling": (True, False),
                     "long": (True, False)}


def test_fuse_posix_fifo(d: Path) -> None:
    p = d / "fifo"
    os.mkfifo(p, 0o640)
    st = os.lstat(p)
    assert stat.S_ISFIFO(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o640
    # I/O on a FIFO is the kernel's pipe, whatever file system holds the node.
    fd = os.open(p, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(fd, b"through the pipe")
        assert os.read(fd, 100) == b"through the pipe"
    finally:
        os.close(fd)
    raises_errno(errno.EEXIST, os.mkfifo, p)
    assert [e.name for e in os.scandir(d) if stat.S_ISFIFO(e.stat(follow_symlinks=False)
                                                           .st_mode)] == ["fifo"]
    os.unlink(p)
    assert os.listdir(d) == []


def test_fuse_posix_socket_nodes(d: Path) -> None:
    p = d / "sock-node"
    os.mknod(p, stat.S_IFSOCK | 0o600)
    st = os.lstat(p)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    os.unlink(p)
    # bind() makes the node through mknod; connect() finds the listening socket by it.
    path = str(d / "server.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
            conn, _ = server.accept()
            with conn:
                client.sendall(b"hello")
                assert conn.recv(5) == b"hello"
    os.unlink(path)


def _device(path: Path) -> tuple[str, int, int, int]:
    """(type, major, minor, permission bits) of a device node, as lstat shows it."""
    st = os.lstat(path)
    kind = "b" if stat.S_ISBLK(st.st_mode) else "c" if stat.S_ISCHR(st.st_mode) else "?"
    return kind, os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode)


def test_fuse_posix_device_nodes(d: Path) -> None:
    """Block and character device nodes are metadata, as FIFOs and sockets are: root-run
    tools make them (tar and rsync of a root file system, image unpacking)."""
    os.mknod(d / "null", stat.S_IFCHR | 0o644, os.makedev(1, 3))  # modes the umask keeps
    os.mknod(d / "loop0", stat.S_IFBLK | 0o640, os.makedev(7, 0))
    done = subprocess.run(["mknod", str(d / "f"), "b", "1", "2"], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    # The largest numbers FUSE carries (12-bit major, 20-bit minor), and 0/0 (a whiteout).
    os.mknod(d / "big", stat.S_IFCHR | 0o600, os.makedev(4095, (1 << 20) - 1))
    os.mknod(d / "whiteout", stat.S_IFCHR, 0)
    assert _device(d / "null") == ("c", 1, 3, 0o644)
    assert _device(d / "loop0") == ("b", 7, 0, 0o640)
    assert _device(d / "f")[:3] == ("b", 1, 2)
    assert _device(d / "big")[:3] == ("c", 4095, (1 << 20) - 1)
    assert _device(d / "whiteout")[:3] == ("c", 0, 0)
    assert os.lstat(d / "null").st_size == 0
    listing = subprocess.run(["ls", "-l", str(d / "f")], capture_output=True, text=True,
                             timeout=30).stdout
    assert listing.startswith("b") and "1, 2" in listing
    raises_errno(errno.EEXIST, os.mknod, d / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    # Links, renames, chmod and chown work as for any inode; the number stays.
    os.link(d / "null", d / "null2")
    os.rename(d / "loop0", d / "loop-renamed")
    os.chmod(d / "null", 0o600)
    os.chown(d / "null", NOBODY, NOBODY)
    assert _device(d / "null2") == ("c", 1, 3, 0o600)
    assert os.lstat(d / "null2").st_nlink == 2
    assert _device(d / "loop-renamed") == ("b", 7, 0, 0o640)
    # Only a process with CAP_MKNOD makes one: the kernel refuses others before mosafs
    # (in a directory where they may make a FIFO).
    os.chmod(d, 0o777)
    got = _as_nobody(d, lambda: {
        "mknod": _errno_of(lambda: os.mknod("mine", stat.S_IFCHR | 0o600,
                                            os.makedev(1, 3))),
        "mkfifo": _errno_of(lambda: os.mkfifo("fifo", 0o600))})
    assert got == {"mknod": "EPERM", "mkfifo": "ok"}
    for name in ("null", "null2", "loop-renamed", "f", "big", "whiteout", "fifo"):
        os.unlink(d / name)
    assert os.listdir(d) == []
    # mknod of a regular file is an empty regular file.
    os.mknod(d / "plain", stat.S_IFREG | 0o644)
    assert stat.S_ISREG(os.stat(d / "plain").st_mode)
    assert (d / "plain").read_bytes() == b""


def test_fuse_posix_tar_keeps_device_nodes(d: Path, tmp_path: Path) -> None:
    """Unpacking an archive of a root file system (as root): its device nodes come out."""
    src = tmp_path / "rootfs"
    (src / "dev").mkdir(parents=True)
    os.mknod(src / "dev" / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.mknod(src / "dev" / "sda", stat.S_IFBLK | 0o660, os.makedev(8, 0))
    (src / "etc").mkdir()
    (src / "etc" / "hostname").write_text("box\n")
    archive = tmp_path / "rootfs.tar"
    for args in (["tar", "-C", str(src), "-cf", str(archive), "."],
                 ["tar", "-C", str(d), "-xpf", str(archive)]):
        done = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    for name, numbers in (("null", ("c", 1, 3)), ("sda", ("b", 8, 0))):
        assert _device(d / "dev" / name) == _device(src / "dev" / name)
        assert _device(d / "dev" / name)[:3] == numbers
    assert (d / "etc" / "hostname").read_text() == "box\n"


def test_fuse_posix_hard_links(d: Path) -> None:
    a, b = d / "a", d / "b"
    data = os.urandom(500 * KiB)
    a.write_bytes(data)
    os.link(a, b)
    sa, sb = os.stat(a), os.stat(b)
    assert sa.st_ino == sb.st_ino
    assert sa.st_nlink == sb.st_nlink == 2
    assert b.read_bytes() == data
    # A write through one name is seen through the other.
    with open(b, "r+b") as f:
        f.write(b"changed")
    assert a.read_bytes() == b"changed" + data[7:]
    os.truncate(a, 100)
    assert os.stat(b).st_size == 100
    os.unlink(a)
    assert os.stat(b).st_nlink == 1
    assert b.read_bytes() == (b"changed" + data[7:])[:100]
    # Across directories; to an existing name; to a directory.
    (d / "sub").mkdir()
    os.link(b, d / "sub" / "c")
    assert os.stat(b).st_nlink == 2
    assert (d / "sub" / "c").read_bytes() == b.read_bytes()
    raises_errno(errno.EEXIST, os.link, b, d / "sub" / "c")
    raises_errno(errno.EPERM, os.link, d / "sub", d / "sub-link")
    # A hard link to a symlink is a link to the symlink itself.
    os.symlink("b", d / "sym")
    os.link(d / "sym", d / "sym2", follow_symlinks=False)
    assert os.readlink(d / "sym2") == "b"
    assert os.lstat(d / "sym").st_nlink == 2
    # Renaming one name over the other (same inode) is a no-op.
    os.rename(b, d / "sub" / "c")
    assert b.exists() and (d / "sub" / "c").exists()


# -- attributes --------------------------------------------------------------------------------


def test_fuse_posix_chmod_chown_utime(d: Path) -> None:
    p = d / "f"
    p.write_bytes(b"x")
    before = os.stat(p)
    time.sleep(0.01)
    os.chmod(p, 0o640)
    st = os.stat(p)
    assert stat.S_IMODE(st.st_mode) == 0o640
    assert stat.S_ISREG(st.st_mode)
    assert st.st_ctime_ns > before.st_ctime_ns, "chmod did not move ctime"
    assert st.st_mtime_ns == before.st_mtime_ns, "chmod moved mtime"
    os.chmod(p, 0o4755)  # setuid as root: kept
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o4755
    os.chown(p, 1234, 5678)
    st = os.stat(p)
    assert (st.st_uid, st.st_gid) == (1234, 5678)
    assert stat.S_IMODE(st.st_mode) == 0o755  # chown clears setuid (Linux, even for root)
    os.chown(p, -1, 42)
    assert (os.stat(p).st_uid, os.stat(p).st_gid) == (1234, 42)
    # Exact nanosecond round trip of atime and mtime, ctime set to now.
    atime, mtime = 1_234_567_890_123_456_789, 1_111_111_111_222_333_444
    t0 = time.time_ns()
    os.utime(p, ns=(atime, mtime))
    st = os.stat(p)
    assert (st.st_atime_ns, st.st_mtime_ns) == (atime, mtime)
    assert st.st_ctime_ns >= t0 - 10**9
    # UTIME_NOW for both.
    os.utime(p)
    st = os.stat(p)
    assert abs(st.st_mtime_ns - time.time_ns()) < 5 * 10**9
    # On a directory and on a symlink itself.
    os.utime(d, ns=(atime, mtime))
    assert os.stat(d).st_mtime_ns == mtime
    os.symlink("f", d / "link")
    os.utime(d / "link", ns=(atime, mtime + 1), follow_symlinks=False)
    assert os.lstat(d / "link").st_mtime_ns == mtime + 1
    assert os.stat(p).st_mtime_ns != mtime + 1
    os.chmod(d, 0o700)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    os.chmod(d, 0o755)


def test_fuse_posix_write_moves_mtime_and_kept_after_close(d: Path) -> None:
    p = d / "f"
    p.write_bytes(b"one")
    os.utime(p, ns=(10**18, 10**18))
    time.sleep(0.01)
    t0 = time.time_ns()
    with open(p, "ab") as f:
        f.write(b"two")
    st = os.stat(p)
    assert st.st_mtime_ns >= t0 - 10**9
    assert st.st_mtime_ns != 10**18
    # utime after writing (what cp -p and tar do) survives the close that commits.
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"three")
    os.utime(fd, ns=(5 * 10**17, 6 * 10**17))
    os.close(fd)
    assert os.stat(p).st_mtime_ns == 6 * 10**17
    assert p.read_bytes() == b"onetwothree"


def test_fuse_posix_listing_does_not_bring_back_old_attributes(d: Path) -> None:
    """A directory listing (READDIRPLUS hands the kernel attributes too) right after this
    mount changed a file must not give the kernel the attributes from before the change."""
    p = d / "f"
    p.write_bytes(b"")
    os.listdir(d)
    os.truncate(p, 409416)
    os.chmod(p, 0o600)
    os.utime(p, ns=(10**18, 10**18))
    os.listdir(d)
    st = os.stat(p)
    assert (st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (409416, 0o600, 10**18)
    assert [e.stat().st_size for e in os.scandir(d)] == [409416]


def _as_nobody(cwd: Path, checks: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run CHECKS in a forked child with uid/gid 65534 and cwd CWD (entered as root, so
    the parents of the mount point need not be searchable by nobody)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 0
        try:
            os.close(rfd)
            os.chdir(cwd)
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            out = checks()
        except BaseException as exc:  # reported to the parent
            out = {"child error": repr(exc)}
            code = 1
        with contextlib.suppress(BaseException):
            os.write(wfd, json.dumps(out).encode())
        os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as f:
        raw = f.read()
    os.waitpid(pid, 0)
    return dict(json.loads(raw))


def _errno_of(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "ok"


def _nobody_checks() -> dict[str, Any]:
    def read(name: str) -> Any:
        with open(name, "rb") as f:
            return f.read().decode()

    def create(name: str) -> None:
        os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644))

    out: dict[str, Any] = {
        "open 0600 root file": _errno_of(lambda: read("secret")),
        "read 0644 root file": _errno_of(lambda: read("public")),
        "write 0644 root file": _errno_of(lambda: os.open("public", os.O_WRONLY)),
        "create in 0755 root dir": _errno_of(lambda: create("closed/new")),
        "mkdir in 0755 root dir": _errno_of(lambda: os.mkdir("closed/newdir")),
        "unlink in 0755 root dir": _errno_of(lambda: os.unlink("closed/inside")),
        "list 0700 root dir": _errno_of(lambda: os.listdir("private")),
        "chmod root file": _errno_of(lambda: os.chmod("public", 0o666)),
        "unlink other's file in sticky dir": _errno_of(lambda: os.unlink("sticky/roots")),
        "create in 0777 dir": _errno_of(lambda: create("open/mine")),
    }
    with open("public", "rb") as f:
        out["public content"] = f.read().decode()
    out["list 0755 root dir"] = sorted(os.listdir("closed"))
    st = os.stat("open/mine")
    out["owner of created file"] = [st.st_uid, st.st_gid]
    out["chmod own file"] = _errno_of(lambda: os.chmod("open/mine", 0o600))
    return out


def test_fuse_posix_permissions_for_a_non_root_user(d: Path) -> None:
    """The mount checks permissions like a local file system (default_permissions) and lets
    other users in (allow_other, which `mosafs up` run by root must pass)."""
    os.chmod(d, 0o755)
    (d / "secret").write_bytes(b"root only")
    os.chmod(d / "secret", 0o600)
    (d / "public").write_bytes(b"everyone")
    os.chmod(d / "public", 0o644)
    (d / "closed").mkdir(mode=0o755)
    (d / "closed" / "inside").write_bytes(b"i")
    (d / "private").mkdir(mode=0o700)
    (d / "open").mkdir()
    os.chmod(d / "open", 0o777)
    (d / "sticky").mkdir()
    os.chmod(d / "sticky", 0o1777)
    (d / "sticky" / "roots").write_bytes(b"r")
    os.chmod(d / "sticky" / "roots", 0o666)
    got = _as_nobody(d, _nobody_checks)
    assert got == {
        "open 0600 root file": "EACCES",
        "read 0644 root file": "ok",
        "write 0644 root file": "EACCES",
        "create in 0755 root dir": "EACCES",
        "mkdir in 0755 root dir": "EACCES",
        "unlink in 0755 root dir": "EACCES",
        "list 0700 root dir": "EACCES",
        "chmod root file": "EPERM",
        "unlink other's file in sticky dir": "EPERM",
        "create in 0777 dir": "ok",
        "public content": "everyone",
        "list 0755 root dir": ["inside"],
        "owner of created file": [NOBODY, NOBODY],
        "chmod own file": "ok",
    }
    assert (d / "closed" / "inside").exists()
    assert (d / "sticky" / "roots").exists()


# -- extended attributes -----------------------------------------------------------------------


def test_fuse_posix_user_xattrs(d: Path) -> None:
    p = d / "f"
    p.write_bytes(b"data")
    os.setxattr(p, "user.a", b"alpha")
    os.setxattr(p, "user.empty", b"")
    binary = bytes(range(256)) * 16
    os.setxattr(p, "user.binary", binary)
    assert os.getxattr(p, "user.a") == b"alpha"
    assert os.getxattr(p, "user.empty") == b""
    assert os.getxattr(p, "user.binary") == binary
    listed = os.listxattr(p)
    assert {"user.a", "user.empty", "user.binary"} <= set(listed)
    assert not [n for n in listed if not n.startswith("user.")], listed
    # Replace, XATTR_CREATE / XATTR_REPLACE.
    os.setxattr(p, "user.a", b"beta")
    assert os.getxattr(p, "user.a") == b"beta"
    raises_errno(errno.EEXIST, os.setxattr, p, "user.a", b"x", os.XATTR_CREATE)
    raises_errno(errno.ENODATA, os.setxattr, p, "user.new", b"x", os.XATTR_REPLACE)
    os.setxattr(p, "user.new", b"created", os.XATTR_CREATE)
    os.setxattr(p, "user.new", b"replaced", os.XATTR_REPLACE)
    assert os.getxattr(p, "user.new") == b"replaced"
    # Missing and removed.
    raises_errno(errno.ENODATA, os.getxattr, p, "user.missing")
    os.removexattr(p, "user.a")
    raises_errno(errno.ENODATA, os.getxattr, p, "user.a")
    raises_errno(errno.ENODATA, os.removexattr, p, "user.a")
    assert "user.a" not in os.listxattr(p)
    # The largest value the kernel passes (64 KiB); attributes of a directory.
    big = os.urandom(65536)
    os.setxattr(p, "user.big", big)
    assert os.getxattr(p, "user.big") == big
    os.setxattr(d, "user.dir", b"on a directory")
    assert os.getxattr(d, "user.dir") == b"on a directory"
    # Attributes survive a write and a rename, and go with the inode to its hard links.
    with open(p, "ab") as f:
        f.write(b"more")
    os.rename(p, d / "g")
    assert os.getxattr(d / "g", "user.new") == b"replaced"
    os.link(d / "g", d / "h")
    assert os.getxattr(d / "h", "user.binary") == binary
    # Setting an attribute moves ctime, not mtime.
    st = os.stat(d / "g")
    time.sleep(0.01)
    os.setxattr(d / "g", "user.t", b"1")
    st2 = os.stat(d / "g")
    assert st2.st_ctime_ns > st.st_ctime_ns
    assert st2.st_mtime_ns == st.st_mtime_ns


def test_fuse_posix_other_xattr_namespaces_are_not_supported(d: Path) -> None:
    p = d / "f"
    p.write_bytes(b"x")
    for name in ("trusted.x", "security.x"):
        raises_errno(errno.EOPNOTSUPP, os.setxattr, p, name, b"v")
    raises_errno((errno.EOPNOTSUPP, errno.ENODATA), os.getxattr, p, "trusted.x")
    # What the kernel asks before every write (answered without a manager call).
    raises_errno(errno.ENODATA, os.getxattr, p, "security.capability")
    assert [n for n in os.listxattr(p) if not n.startswith("user.")] == []


def test_fuse_posix_read_only_mosafs_xattrs(d: Path) -> None:
    p = d / "f"
    p.write_bytes(b"one")
    p.write_bytes(b"two")
    names = [n for n in os.listxattr(p) if n.startswith("user.mosafs.")]
    assert "user.mosafs.version" in names
    assert int(os.getxattr(p, "user.mosafs.version")) == 2
    for name in names:
        value = os.getxattr(p, name)
        assert value, f"{name} is empty"
        raises_errno(errno.EPERM, os.setxattr, p, name, b"1")
        raises_errno(errno.EPERM, os.removexattr, p, name)
    raises_errno(errno.EPERM, os.setxattr, p, "user.mosafs.anything-new", b"1")
    assert int(os.getxattr(p, "user.mosafs.version")) == 2
    # Directories list the attributes that make sense for them; all readable.
    for name in [n for n in os.listxattr(d) if n.startswith("user.mosafs.")]:
        os.getxattr(d, name)


# -- file system ------------------------------------------------------------------------------


def test_fuse_posix_statfs(d: Path) -> None:
    st = os.statvfs(d)
    assert st.f_bsize > 0 and st.f_frsize > 0
    assert st.f_blocks > 0
    assert 0 < st.f_bavail <= st.f_blocks
    assert 0 < st.f_bfree <= st.f_blocks
    assert st.f_namemax == 255
    raises_errno(errno.ENAMETOOLONG, os.open, d / ("n" * 256), os.O_CREAT | os.O_WRONLY)
    (d / ("n" * 255)).write_bytes(b"longest name")
    assert (d / ("n" * 255)).read_bytes() == b"longest name"


def test_fuse_posix_listing_of_many_pages_is_whole_and_in_order(d: Path) -> None:
    """The manager answers a listing 1,000 entries a page and the mount hands the kernel
    the first page while the others arrive: every entry comes once, in order, with its
    attributes, in a listing started cold and in one started again at once (cached)."""
    names = [f"f{i:05d}" for i in range(2500)]
    for i, name in enumerate(names):
        fd = os.open(d / name, os.O_CREAT | os.O_WRONLY, 0o600 | (i % 2) * 0o044)
        os.close(fd)
    for _ in range(2):
        listed = [(e.name, stat.S_IMODE(e.stat(follow_symlinks=False).st_mode))
                  for e in os.scandir(d)]
        assert listed == [(n, 0o600 | (i % 2) * 0o044) for i, n in enumerate(names)]
