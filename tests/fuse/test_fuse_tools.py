"""Real tools on a real mount: cp -a, tar, rsync, git, sqlite (the Python stdlib module),
numpy. Each copies a tree or a data set into the mount (and back out) and compares
contents, kinds, modes, link targets, hard links and mtimes with the source.

A tool test is skipped only when the tool's binary is missing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

KiB = 1 << 10
MiB = 1 << 20


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (apt-get install {tool})")
    return path


def run(*cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 120) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    assert done.returncode == 0, (f"{' '.join(map(str, cmd))} exited with "
                                  f"{done.returncode}:\n{done.stderr}{done.stdout}")
    return done.stdout


def blob(seed: str, n: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha512(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:n])


def make_tree(root: Path) -> None:
    """Files of several sizes (empty, small, over several 1 MiB chunks), nested and empty
    directories, odd names, modes, symlinks (to a file, to a directory, dangling), a hard
    link, a FIFO, and distinct old mtimes with nanoseconds everywhere."""
    files = {
        "empty": b"",
        "small.txt": b"hello\n",
        "exec.sh": b"#!/bin/sh\necho hi\n",
        "bin/one_mib": blob("one", MiB + 3),
        "bin/chunky": blob("chunky", 3 * MiB + 5),
        "deep/a/b/c/leaf": b"leaf",
        "name with spaces & ünïcode": b"odd name",
    }
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    (root / "emptydir").mkdir()
    os.link(root / "bin" / "one_mib", root / "bin" / "hard")
    os.symlink("small.txt", root / "link-to-small")
    os.symlink("deep/a", root / "link-to-dir")
    os.symlink("nowhere", root / "dangling")
    os.mkfifo(root / "pipe", 0o640)
    os.chmod(root / "exec.sh", 0o755)
    os.chmod(root / "small.txt", 0o600)
    os.chmod(root / "bin", 0o750)
    os.chmod(root / "deep" / "a", 0o700)
    stamp = 1_500_000_000_123_456_789
    # Bottom-up, so that setting a child's time does not move its directory's afterwards.
    for i, (dirpath, dirnames, filenames) in enumerate(os.walk(root, topdown=False)):
        for j, name in enumerate(sorted(dirnames + filenames)):
            p = Path(dirpath) / name
            t = stamp + (i * 100 + j) * 1_000_001_001
            os.utime(p, ns=(t, t), follow_symlinks=False)
        os.utime(dirpath, ns=(stamp - i, stamp - i))


def snapshot(root: Path, *, hard_links: bool = True,
             link_times: bool = True) -> dict[str, dict[str, Any]]:
    """What a faithful copy keeps, by relative path ('.' is the root itself)."""
    out: dict[str, dict[str, Any]] = {}
    by_inode: dict[int, list[str]] = {}
    paths = [root] + [Path(d) / n for d, dirs, files in os.walk(root) for n in dirs + files]
    for p in paths:
        rel = str(p.relative_to(root))
        st = os.lstat(p)
        entry: dict[str, Any] = {"kind": stat.S_IFMT(st.st_mode),
                                 "mode": oct(stat.S_IMODE(st.st_mode))}
        if stat.S_ISLNK(st.st_mode):
            entry["target"] = os.readlink(p)
            if link_times:
                entry["mtime_ns"] = st.st_mtime_ns
        else:
            entry["mtime_ns"] = st.st_mtime_ns
        if stat.S_ISREG(st.st_mode):
            entry["size"] = st.st_size
            entry["sha256"] = hashlib.sha256(p.read_bytes()).hexdigest()
            if st.st_nlink > 1:
                by_inode.setdefault(st.st_ino, []).append(rel)
        out[rel] = entry
    if hard_links:
        for names in by_inode.values():
            for name in names:
                out[name]["hard_links"] = sorted(names)
    return out


def assert_same_tree(copy: Path, source: Path, **options: Any) -> None:
    want, got = snapshot(source, **options), snapshot(copy, **options)
    problems = [f"{name}: missing" for name in sorted(want) if name not in got]
    problems += [f"{name}: unexpected" for name in sorted(got) if name not in want]
    for name in sorted(set(want) & set(got)):
        for key in sorted(set(want[name]) | set(got[name])):
            if want[name].get(key) != got[name].get(key):
                problems.append(f"{name}: {key} {got[name].get(key)!r}, "
                                f"expected {want[name].get(key)!r}")
    assert not problems, f"{copy} differs from {source}:\n" + "\n".join(problems)


@pytest.fixture
def cluster(start_cluster):
    return start_cluster()


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    make_tree(root)
    return root


def test_fuse_tools_cp_a_in_and_out(cluster, src: Path, tmp_path: Path) -> None:
    need("cp")
    mnt = cluster.mountpoint
    run("cp", "-a", src, mnt / "copy")
    assert_same_tree(mnt / "copy", src)
    run("cp", "-a", mnt / "copy", tmp_path / "back")
    assert_same_tree(tmp_path / "back", src)
    # A second cp -a over the existing copy (files opened with O_TRUNC, times set again).
    run("cp", "-a", "-T", src, mnt / "copy")
    assert_same_tree(mnt / "copy", src)


def test_fuse_tools_tar_in_and_out(cluster, src: Path, tmp_path: Path) -> None:
    need("tar")
    mnt = cluster.mountpoint
    # Extract into the mount (a pipe from tar c of the local tree); pax keeps nanoseconds.
    (mnt / "x").mkdir()
    archive = tmp_path / "src.tar"
    run("tar", "--format=posix", "-C", src, "-cf", archive, ".")
    run("tar", "-C", mnt / "x", "-xpf", archive)
    assert_same_tree(mnt / "x", src)
    run("tar", "-C", mnt / "x", "--compare", "-f", archive)
    # An archive written on the mount from the mount, extracted back out.
    run("tar", "--format=posix", "-C", mnt / "x", "-cf", mnt / "x.tar", ".")
    (tmp_path / "out").mkdir()
    run("tar", "-C", tmp_path / "out", "-xpf", mnt / "x.tar")
    assert_same_tree(tmp_path / "out", src)


def test_fuse_tools_rsync_then_nothing_to_do(cluster, src: Path) -> None:
    need("rsync")
    mnt = cluster.mountpoint
    run("rsync", "-a", f"{src}/", f"{mnt / 'r'}/")
    # -a does not keep hard links (-H): the two names are two files on the mount.
    assert_same_tree(mnt / "r", src, hard_links=False)
    again = run("rsync", "-a", "--itemize-changes", f"{src}/", f"{mnt / 'r'}/")
    assert again == "", f"a second rsync -a found changes:\n{again}"
    # A changed file is sent again (delta transfer edits the destination's copy) and the
    # result is exact.
    with open(src / "bin" / "chunky", "r+b") as f:
        f.seek(MiB)
        f.write(b"changed in the middle")
    os.utime(src / "bin" / "chunky", ns=(1_600_000_000_000_000_007,) * 2)
    changes = run("rsync", "-a", "--itemize-changes", "--no-whole-file", f"{src}/",
                  f"{mnt / 'r'}/")
    assert "bin/chunky" in changes
    assert_same_tree(mnt / "r", src, hard_links=False)
    assert run("rsync", "-a", "--itemize-changes", f"{src}/", f"{mnt / 'r'}/") == ""


def git(*args: str | Path, cwd: Path | None = None, home: Path) -> str:
    return run("git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main",
               *args, cwd=cwd,
               env={"HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1",
                    "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z",
                    "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z"})


def test_fuse_tools_git_clone_fsck_log_commit_gc(cluster, tmp_path: Path) -> None:
    need("git")
    mnt, home = cluster.mountpoint, tmp_path
    repo = tmp_path / "repo"
    git("init", "-q", repo, home=home)
    for i in range(5):
        (repo / f"file{i}.txt").write_text(f"line {i}\n" * (i * 1000 + 1))
        (repo / "data.bin").write_bytes(blob(f"data{i}", 200 * KiB))
        git("add", "-A", cwd=repo, home=home)
        git("commit", "-q", "-m", f"commit {i}", cwd=repo, home=home)
    git("tag", "v1", cwd=repo, home=home)
    git("clone", "-q", repo, mnt / "clone", home=home)
    clone = mnt / "clone"
    git("fsck", "--full", "--strict", cwd=clone, home=home)
    log = ["log", "--format=%H %s", "--all"]
    assert git(*log, cwd=clone, home=home) == git(*log, cwd=repo, home=home)
    assert git("status", "--porcelain", cwd=clone, home=home) == ""
    assert (clone / "data.bin").read_bytes() == (repo / "data.bin").read_bytes()
    # Work in the clone on the mount: edit, commit, repack, check again.
    (clone / "file0.txt").write_text("changed on the mount\n")
    (clone / "new.txt").write_text("new\n")
    git("add", "-A", cwd=clone, home=home)
    git("commit", "-q", "-m", "on the mount", cwd=clone, home=home)
    git("gc", "-q", "--aggressive", "--prune=now", cwd=clone, home=home)
    git("fsck", "--full", "--strict", cwd=clone, home=home)
    assert git("status", "--porcelain", cwd=clone, home=home) == ""
    assert git("log", "-1", "--format=%s", cwd=clone, home=home) == "on the mount\n"
    assert git("rev-list", "--count", "HEAD", cwd=clone, home=home) == "6\n"
    # And a clone out of the mount.
    git("clone", "-q", "--no-local", clone, tmp_path / "out", home=home)
    assert (tmp_path / "out" / "file0.txt").read_text() == "changed on the mount\n"


def _fill(db: Path, journal_mode: str) -> int:
    con = sqlite3.connect(db)
    try:
        assert con.execute(f"PRAGMA journal_mode={journal_mode}").fetchone()[0] == journal_mode
        con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, payload BLOB)")
        con.execute("CREATE INDEX t_name ON t (name)")
        total = 0
        for batch in range(10):
            with con:  # one transaction per batch
                rows = [(batch * 1000 + i, f"name-{(batch * 1000 + i) % 997}",
                         blob(f"{batch}.{i}", 64 + i % 200)) for i in range(1000)]
                con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
                total += len(rows)
            if batch == 5:
                with con:
                    con.execute("DELETE FROM t WHERE id % 7 = 0")
                    total -= sum(1 for k in range(6000) if k % 7 == 0)
        with con:
            con.execute("UPDATE t SET name = 'updated' WHERE id % 10 = 3")
        con.execute("VACUUM")
        return total
    finally:
        con.close()


def _check_db(db: Path, rows: int) -> None:
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert con.execute("SELECT count(*) FROM t").fetchone()[0] == rows
        assert con.execute("SELECT count(*) FROM t WHERE name = 'updated'").fetchone()[0] == \
            sum(1 for k in range(10000) if k % 10 == 3 and (k >= 6000 or k % 7))
        row = con.execute("SELECT name, payload FROM t WHERE id = 9999").fetchone()
        assert row == (f"name-{9999 % 997}", blob("9.999", 64 + 999 % 200))
    finally:
        con.close()


def test_fuse_tools_sqlite_survives_a_restart(start_cluster) -> None:
    cluster = start_cluster()
    db = cluster.mountpoint / "db.sqlite"
    rows = _fill(db, "delete")
    _check_db(db, rows)
    assert not (cluster.mountpoint / "db.sqlite-journal").exists()
    cluster.stop()
    again = start_cluster(data_dir=cluster.data_dir, name="up-again")
    _check_db(again.mountpoint / "db.sqlite", rows)
    con = sqlite3.connect(again.mountpoint / "db.sqlite")
    with con:
        con.execute("INSERT INTO t VALUES (100000, 'after restart', x'00')")
    con.close()
    _check_db(again.mountpoint / "db.sqlite", rows + 1)


def test_fuse_tools_sqlite_wal_mode(cluster) -> None:
    """WAL mode: the -shm file is a shared writable mmap."""
    db = cluster.mountpoint / "wal.sqlite"
    rows = _fill(db, "wal")
    _check_db(db, rows)


def test_fuse_tools_numpy_save_load(cluster) -> None:
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(7)
    big = rng.standard_normal(16 * MiB)  # 128 MiB of float64
    small = rng.integers(0, 2**31, size=(1000, 333), dtype=np.int32)
    path = cluster.mountpoint / "big.npy"
    np.save(path, big)
    assert os.stat(path).st_size == big.nbytes + 128
    loaded = np.load(path)
    assert loaded.dtype == big.dtype and np.array_equal(loaded, big)
    mapped = np.load(path, mmap_mode="r")  # reads through a shared mapping of the file
    assert np.array_equal(mapped[::4096], big[::4096])
    assert np.array_equal(mapped[-1000:], big[-1000:])
    del mapped
    np.savez(cluster.mountpoint / "both.npz", big=big[: MiB], small=small)
    with np.load(cluster.mountpoint / "both.npz") as z:
        assert np.array_equal(z["big"], big[: MiB])
        assert np.array_equal(z["small"], small)
