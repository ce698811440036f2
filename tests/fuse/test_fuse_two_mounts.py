"""Session semantics across two clients of one cluster (close-to-open, as NFS promises):

* a file closed on mount 1 is read whole and current by any later open on mount 2, at
  once, even when mount 2 read and stat'ed the old version just before (the kernel's page
  and attribute caches on mount 2 must not serve the old bytes or the old size);
* fsync on mount 1 publishes like a close;
* bytes written on mount 1 and not yet closed (or fsynced) are invisible on mount 2, which
  keeps reading the previous version;
* names created or removed on mount 1 show on mount 2 within the entry/attribute timeout
  (1 s on both the kernel and the client cache; the test polls for up to ENTRY_WAIT).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import blake3
import pytest

from tests import harness
from tests.conftest import UpCluster

KiB = 1 << 10
MiB = 1 << 20
ENTRY_WAIT = 2.0  # seconds: the 1 s entry timeout, twice


def data(seed: str, n: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=n)


def write(path: Path, content: bytes) -> None:
    with open(path, "wb") as f:
        f.write(content)


def read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def same(got: bytes, want: bytes, what: str) -> None:
    if got != want:
        n = min(len(got), len(want))
        at = next((i for i in range(n) if got[i] != want[i]), n)
        raise AssertionError(f"{what}: read {len(got)} bytes, expected {len(want)}; "
                             f"first difference at {at}")


def wait_for(check: Callable[[], bool], timeout: float = ENTRY_WAIT) -> float:
    """Seconds until CHECK() held; fails after TIMEOUT."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not seen within {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - start


@pytest.fixture
def mounts(start_cluster, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    cluster: UpCluster = start_cluster()
    mnt2 = tmp_path / "mnt2"
    mnt2.mkdir()
    second = harness.start("mount2", ["mount", str(mnt2), "--manager", cluster.manager,
                                      "--tls-dir", str(cluster.data_dir / "tls"),
                                      "--tls-name", "client"], tmp_path / "procs")
    try:
        yield cluster.mountpoint, mnt2
    finally:
        try:
            second.stop()
        finally:
            if os.path.ismount(mnt2):
                os.system(f"fusermount3 -u -z {mnt2}")
        assert not os.path.ismount(mnt2), "the second mount was left behind"


def test_fuse_two_mounts_close_to_open(mounts: tuple[Path, Path]) -> None:
    m1, m2 = mounts
    write(m1 / "f", data("v1", 100 * KiB))
    same(read(m2 / "f"), data("v1", 100 * KiB), "mount 2 after the first close")
    # Each step: mount 2 reads and stats the current version (filling its caches), then
    # mount 1 replaces it; mount 2's next open must give exactly the new bytes.
    sizes = [3 * MiB + 1, 10, 5 * MiB, 5 * MiB, 64 * KiB - 1, 1]
    previous = data("v1", 100 * KiB)
    for step, size in enumerate(sizes, start=2):
        assert os.stat(m2 / "f").st_size == len(previous)
        same(read(m2 / "f"), previous, f"mount 2 before version {step}")
        new = data(f"v{step}", size)
        write(m1 / "f", new)
        with open(m2 / "f", "rb") as f:
            assert os.fstat(f.fileno()).st_size == size, f"fstat on mount 2, version {step}"
            same(f.read(), new, f"mount 2 right after version {step} was closed on mount 1")
        assert os.stat(m2 / "f").st_size == size
        previous = new
    # An edit in the middle (same size) and an append, through "r+b" and "ab".
    with open(m1 / "f", "r+b") as f:
        f.seek(0)
        f.write(b"edited")
    with open(m2 / "f", "rb") as f:
        assert f.read() == b"edited" + previous[6:]
    big = data("big", 2 * MiB)
    write(m1 / "g", big)
    same(read(m2 / "g"), big, "mount 2, g")
    with open(m1 / "g", "ab") as f:
        f.write(b"tail")
    same(read(m2 / "g"), big + b"tail", "mount 2 after an append on mount 1")
    with open(m1 / "g", "r+b") as f:
        f.seek(MiB)
        f.write(b"middle")
    same(read(m2 / "g"), big[:MiB] + b"middle" + big[MiB + 6:] + b"tail",
         "mount 2 after an edit in the middle")


def test_fuse_two_mounts_fsync_publishes(mounts: tuple[Path, Path]) -> None:
    m1, m2 = mounts
    write(m1 / "f", b"committed")
    fd = os.open(m1 / "f", os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, b"fsynced and still open")
        os.fsync(fd)
        assert read(m2 / "f") == b"fsynced and still open"
    finally:
        os.close(fd)


def test_fuse_two_mounts_unclosed_writes_are_invisible(mounts: tuple[Path, Path]) -> None:
    m1, m2 = mounts
    old = data("old", 1 * MiB)
    write(m1 / "f", old)
    same(read(m2 / "f"), old, "mount 2, old")
    with open(m1 / "f", "r+b") as w:
        w.write(data("new", 2 * MiB))
        w.flush()  # Python's buffer to the kernel: written, not closed
        time.sleep(0.1)
        same(read(m2 / "f"), old, "mount 2 while mount 1 writes (overwrite)")
        assert os.stat(m2 / "f").st_size == len(old)
    same(read(m2 / "f"), data("new", 2 * MiB), "mount 2 after mount 1 closed")
    # A truncation in progress is invisible too.
    with open(m1 / "f", "r+b") as w:
        w.truncate(10)
        w.seek(0, os.SEEK_END)
        w.write(b"x")
        w.flush()
        same(read(m2 / "f"), data("new", 2 * MiB), "mount 2 while mount 1 truncates")
    assert read(m2 / "f") == data("new", 10) + b"x"
    # A new file being written: mount 2 sees it (create is immediate) but empty.
    with open(m1 / "new", "wb") as w:
        w.write(b"not yet")
        w.flush()
        wait_for(lambda: (m2 / "new").exists())
        assert read(m2 / "new") == b""
    assert read(m2 / "new") == b"not yet"


def test_fuse_two_mounts_names_within_the_entry_timeout(mounts: tuple[Path, Path]) -> None:
    m1, m2 = mounts
    (m1 / "d").mkdir()
    assert wait_for(lambda: (m2 / "d").is_dir()) <= ENTRY_WAIT
    assert os.listdir(m2 / "d") == []
    with pytest.raises(FileNotFoundError):
        os.stat(m2 / "d" / "f")  # a negative lookup on mount 2 first
    write(m1 / "d" / "f", b"new file")
    waited = wait_for(lambda: os.path.exists(m2 / "d" / "f"))
    assert read(m2 / "d" / "f") == b"new file"
    wait_for(lambda: os.listdir(m2 / "d") == ["f"])
    # Rename and unlink on mount 1.
    os.rename(m1 / "d" / "f", m1 / "d" / "g")
    wait_for(lambda: sorted(os.listdir(m2 / "d")) == ["g"])
    assert read(m2 / "d" / "g") == b"new file"
    os.unlink(m1 / "d" / "g")
    wait_for(lambda: not os.path.exists(m2 / "d" / "g"))
    with pytest.raises(OSError) as info:
        os.open(m2 / "d" / "g", os.O_RDONLY)
    assert info.value.errno == errno.ENOENT
    # And the other way round.
    write(m2 / "d" / "from2", b"from mount 2")
    wait_for(lambda: os.path.exists(m1 / "d" / "from2"))
    assert read(m1 / "d" / "from2") == b"from mount 2"
    print(f"new file visible on the other mount after {waited:.3f} s")
