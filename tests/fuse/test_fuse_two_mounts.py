"""Session semantics across two clients of one cluster (close-to-open, as NFS promises):

* a file closed on mount 1 is read whole and current by any later open on mount 2, at
  once, even when mount 2 read and stat'ed the old version just before (the kernel's page
  and attribute caches on mount 2 must not serve the old bytes or the old size);
* fsync on mount 1 publishes like a close;
* bytes written on mount 1 and not yet closed (or fsynced) are invisible on mount 2, which
  keeps reading the previous version;
* names created or removed on mount 1 show on mount 2 within the entry/attribute timeout
  (1 s on both the kernel and the client cache; the test polls for up to ENTRY_WAIT);
* with coherent caches (docs/client.md, "Coherent caches"), mount 2 keeps names and
  attributes well past that timeout without asking the manager, and still sees mount 1's
  changes to them within ENTRY_WAIT; a paused manager ends that within the lease, and an
  idle mount stops asking until it is used again.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import blake3
import pytest

from mosafs.client.files.coherence import IDLE_S
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
def two(start_cluster, tmp_path: Path) -> Iterator[tuple[UpCluster, Path]]:
    """A cluster with its mount, and a second mount of it."""
    with _two(start_cluster(), tmp_path) as both:
        yield both


@contextmanager
def _two(cluster: UpCluster, tmp_path: Path) -> Iterator[tuple[UpCluster, Path]]:
    mnt2 = tmp_path / "mnt2"
    mnt2.mkdir()
    second = harness.start("mount2", ["mount", str(mnt2), "--manager", cluster.manager,
                                      "--tls-dir", str(cluster.data_dir / "tls"),
                                      "--tls-name", "client"], tmp_path / "procs")
    try:
        yield cluster, mnt2
    finally:
        try:
            second.stop()
        finally:
            if os.path.ismount(mnt2):
                os.system(f"fusermount3 -u -z {mnt2}")
        assert not os.path.ismount(mnt2), "the second mount was left behind"


@pytest.fixture
def mounts(two: tuple[UpCluster, Path]) -> tuple[Path, Path]:
    return two[0].mountpoint, two[1]


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


METADATA_CALLS = ("Lookup", "GetAttr", "Batch", "BatchRead", "ReadDir")


def _served(cluster: UpCluster, *methods: str) -> float:
    """Calls of METHODS the manager served so far."""
    served = harness.scrape(cluster.info["metrics"]["manager"])
    return sum(served.get(f"mosafs_rpc_server_seconds_count{{method={m},service=manager}}", 0)
               for m in methods)


def _metadata_calls(cluster: UpCluster) -> float:
    return _served(cluster, *METADATA_CALLS)


def test_fuse_two_mounts_coherent_caches_stay_and_hear_of_changes(
        two: tuple[UpCluster, Path]) -> None:
    cluster, m2 = two
    m1 = cluster.mountpoint
    (m1 / "d").mkdir()
    for i in range(20):
        write(m1 / "d" / f"f{i}", b"x" * i)
    wait_for(lambda: len(os.listdir(m2 / "d")) == 20)
    sizes = [os.stat(m2 / "d" / f"f{i}").st_size for i in range(20)]
    assert sizes == list(range(20))
    # Answers that came while mount 1's changes of them were being listed live 1 s: once
    # more, after the writes' lists have all come.
    time.sleep(1.5)
    assert [os.stat(m2 / "d" / f"f{i}").st_size for i in range(20)] == sizes
    time.sleep(1.5)  # past the 1 s attribute timeout
    before = _metadata_calls(cluster)
    for _ in range(3):
        assert [os.stat(m2 / "d" / f"f{i}").st_size for i in range(20)] == sizes
    assert _metadata_calls(cluster) == before, "stats of cached names asked the manager"

    # Mount 1 changes what mount 2 holds: mount 2 sees each change without opening, and
    # `ls -l` shows it too (a listing holds its entries' attributes).
    assert len(os.listdir(m2 / "d")) == 20
    time.sleep(1.2)
    os.chmod(m1 / "d" / "f4", 0o640)  # an inode's change only: no name in d changes
    time.sleep(ENTRY_WAIT)  # heard of by now; f4 not looked at on mount 2 meanwhile
    # The kernel takes entries' attributes from a listing (readdirplus) when it lacks
    # their dentries, as after this.
    Path("/proc/sys/vm/drop_caches").write_text("2")
    listed = {e.name: e.stat(follow_symlinks=False) for e in os.scandir(m2 / "d")}  # ls -l
    assert stat.S_IMODE(listed["f4"].st_mode) == 0o640
    os.chmod(m1 / "d" / "f0", 0o600)
    os.rename(m1 / "d" / "f1", m1 / "d" / "r1")
    os.unlink(m1 / "d" / "f2")
    write(m1 / "d" / "f3", b"longer than before")
    wait_for(lambda: stat.S_IMODE(os.stat(m2 / "d" / "f0").st_mode) == 0o600)
    wait_for(lambda: not os.path.exists(m2 / "d" / "f1"))
    assert os.stat(m2 / "d" / "r1").st_size == 1
    wait_for(lambda: not os.path.exists(m2 / "d" / "f2"))
    wait_for(lambda: os.stat(m2 / "d" / "f3").st_size == len(b"longer than before"))
    assert read(m2 / "d" / "f3") == b"longer than before"
    assert sorted(os.listdir(m2 / "d")) == sorted(
        ["f0", "r1", *(f"f{i}" for i in range(3, 20))])


def test_fuse_two_mounts_a_directory_made_here_answers_missing_names_itself(
        two: tuple[UpCluster, Path]) -> None:
    """A directory mount 1 made is known whole there: the lookups of names it does not
    hold (each create's first step) are answered without the manager, and a name mount 2
    makes in it is still seen on mount 1 within ENTRY_WAIT."""
    cluster, m2 = two
    m1 = cluster.mountpoint
    (m1 / "w").mkdir()
    before = _metadata_calls(cluster)
    for i in range(20):
        with pytest.raises(FileNotFoundError):
            os.stat(m1 / "w" / f"f{i}")
        write(m1 / "w" / f"f{i}", b"x" * i)
    assert _metadata_calls(cluster) == before, "lookups of missing names asked the manager"
    assert [os.stat(m1 / "w" / f"f{i}").st_size for i in range(20)] == list(range(20))
    with pytest.raises(FileExistsError):
        os.open(m1 / "w" / "f3", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    wait_for(lambda: (m2 / "w").is_dir())
    with pytest.raises(FileNotFoundError):
        os.stat(m1 / "w" / "from2")
    write(m2 / "w" / "from2", b"from mount 2")
    wait_for(lambda: os.path.exists(m1 / "w" / "from2"))
    assert read(m1 / "w" / "from2") == b"from mount 2"
    # Mount 2's create made mount 1 forget that it knew the directory whole: a missing
    # name is asked of the manager again.
    before = _metadata_calls(cluster)
    with pytest.raises(FileNotFoundError):
        os.stat(m1 / "w" / "nothing")
    assert _metadata_calls(cluster) > before


def test_fuse_two_mounts_stats_in_a_directory_fetch_its_listing(
        two: tuple[UpCluster, Path]) -> None:
    """Stat-ahead (docs/client.md): mount 2 has never seen the files mount 1 made in a
    directory; stat'ing them one after another fetches the directory's listing after a
    few lookups, and the rest are answered from it, attributes and all. Lookups of names
    that are not there (a create's first step) fetch nothing."""
    cluster, m2 = two
    m1 = cluster.mountpoint
    (m1 / "s").mkdir()
    modes = [0o640 if i % 3 else 0o600 for i in range(200)]
    for i, mode in enumerate(modes):
        os.close(os.open(m1 / "s" / f"f{i}", os.O_CREAT | os.O_WRONLY, mode))
        os.chmod(m1 / "s" / f"f{i}", mode)
    wait_for(lambda: (m2 / "s").is_dir())
    lookups, listings = _served(cluster, "Lookup", "Batch"), _served(cluster, "ReadDir")
    got = [stat.S_IMODE(os.stat(m2 / "s" / f"f{i}").st_mode) for i in range(200)]
    assert got == modes
    asked = _served(cluster, "Lookup", "Batch") - lookups
    assert _served(cluster, "ReadDir") > listings, "no listing was fetched"
    assert asked <= 40, f"{asked} of 200 stats asked the manager"

    (m1 / "new").mkdir()
    wait_for(lambda: (m2 / "new").is_dir())
    listings = _served(cluster, "ReadDir")
    for i in range(20):
        with pytest.raises(FileNotFoundError):
            os.stat(m2 / "new" / f"g{i}")
        write(m2 / "new" / f"g{i}", b"")
    assert _served(cluster, "ReadDir") == listings, "missing names fetched a listing"


# The benefactors' heartbeats meet the paused manager too.
PAUSE_NOISE = [r"WARNING mosafs\.benefactor\[\d+\]: manager \S+ unreachable"]


def test_fuse_two_mounts_a_paused_manager_ends_the_long_cache(
        start_cluster, tmp_path: Path) -> None:
    with _two(start_cluster(expected_noise=PAUSE_NOISE), tmp_path) as (cluster, m2):
        _paused_manager(cluster, m2)


def _paused_manager(cluster: UpCluster, m2: Path) -> None:
    write(cluster.mountpoint / "x", b"cached")
    wait_for(lambda: os.path.exists(m2 / "x"))
    assert os.stat(m2 / "x").st_size == 6
    ready = json.loads((cluster.data_dir / "run" / "manager.ready.json").read_text())
    done: list[int] = []
    harness.pause(int(ready["pid"]))
    try:
        time.sleep(2.0)  # past the 1 s lease of the change lists
        asker = threading.Thread(target=lambda: done.append(os.stat(m2 / "x").st_size))
        asker.start()
        asker.join(1.0)
        # Nothing cached outlived the lease: the stat waits for the manager.
        assert not done, "a stat was answered from a cache past its lease"
    finally:
        os.kill(int(ready["pid"]), signal.SIGCONT)
    asker.join(30)
    assert done == [6]
    assert os.stat(m2 / "x").st_size == 6


def test_fuse_an_idle_mount_stops_asking_for_changes(start_cluster) -> None:
    cluster: UpCluster = start_cluster()
    url = cluster.info["metrics"]["client"]
    key = "mosafs_rpc_client_seconds_count{method=Changes,service=manager}"

    def asked() -> float:
        return harness.scrape(url).get(key, 0.0)

    assert not os.path.exists(cluster.mountpoint / "nothing")  # a lookup: in use
    time.sleep(1.0)
    assert asked() >= 3  # about five questions a second while in use
    time.sleep(IDLE_S + 1.0)
    idle = asked()
    time.sleep(1.5)
    assert asked() == idle, "an idle mount kept asking"
    assert not os.path.exists(cluster.mountpoint / "nothing either")  # in use again
    time.sleep(1.0)
    assert asked() >= idle + 3
