"""The checkpoint lifecycle through a real mount (`mosafs up`: manager, benefactors, LMDB,
FUSE) and the admin CLI: pruning policies, series, versions and restore, the `.versions`
view, and the CLI's JSON and errors. Most tests share one cluster (R=1, a 1 s GC grace),
each in its own folder; the keep-last acceptance test has a cluster of its own, so that
"what the benefactors hold" is its files alone."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3
import pytest

from tests.conftest import UpCluster, fuse_available, launch_up, stop_all
from tests.harness import cli, cli_json

KiB, MiB = 1 << 10, 1 << 20
CHUNKER = "cdc:16384:65536:262144"
UP_ARGS = ("--replication", "1", "--gc-grace", "1", "--chunker", CHUNKER)


def random_bytes(seed: str, n: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=n)


def similar(data: bytes, seed: str) -> bytes:
    """The next checkpoint: 64 KiB changed in the middle, 4 KiB inserted near the start."""
    mid = len(data) // 2
    changed = data[:mid] + random_bytes(seed, 64 * KiB) + data[mid + 64 * KiB:]
    return changed[:100 * KiB] + random_bytes(seed + "+", 4 * KiB) + changed[100 * KiB:]


def wait_for(check, timeout: float, what: str) -> float:  # type: ignore[no-untyped-def]
    """Poll CHECK until it is true; the moment it was (time.monotonic())."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout}s"
        time.sleep(0.1)
    return time.monotonic()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpCluster]:
    reason = fuse_available()
    if reason:
        pytest.skip(reason)
    up = launch_up(tmp_path_factory.mktemp("lifecycle"), *UP_ARGS)
    try:
        yield up
    finally:
        stop_all([up])


@pytest.fixture
def folder(cluster: UpCluster, request: pytest.FixtureRequest) -> Path:
    """A fresh folder of the shared cluster, named after the test."""
    path = cluster.mountpoint / request.node.name.removeprefix("test_fuse_")[:60]
    path.mkdir()
    return path


# --- pruning ---------------------------------------------------------------------------------

def test_fuse_keep_last_2_leaves_steps_5_and_6_and_gc_frees_the_rest(start_cluster) -> None:
    up = start_cluster(*UP_ARGS)
    ckpt = up.mountpoint / "ckpt"
    ckpt.mkdir()
    assert cli("policy", "set", str(ckpt), "--keep-last", "2").returncode == 0
    steps = {n: random_bytes(f"step {n}", MiB) for n in range(1, 7)}
    for n, data in steps.items():
        (ckpt / f"app.n0.{n}").write_bytes(data)
    assert sorted(os.listdir(ckpt)) == ["app.n0.5", "app.n0.6"]
    assert (ckpt / "app.n0.5").read_bytes() == steps[5]
    assert (ckpt / "app.n0.6").read_bytes() == steps[6]

    def collected() -> bool:
        assert cli("gc", "--data-dir", str(up.data_dir)).returncode == 0
        return up.stored_bytes() <= 2 * MiB

    wait_for(collected, 30, "garbage collection freed the four pruned steps")
    assert up.stored_bytes() == 2 * MiB  # exactly the two kept steps (R=1, no shared chunk)
    assert (ckpt / "app.n0.6").read_bytes() == steps[6]


@contextlib.contextmanager
def burning_cpu() -> Iterator[None]:
    """A busy machine: one CPU-burning process per core while the block runs."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


WRITERS, STEPS, STEP_BYTES = 4, 20, 256 * KiB


def test_fuse_keep_last_2_keeps_the_2_newest_steps_of_every_series_under_load(
        start_cluster, tmp_path: Path) -> None:
    """Issue 15: 4 writers `cp` 20 steps each of their own series (app.nK.1..20) into one
    folder with --keep-last 2 while the CPU is busy: exactly steps 19 and 20 of every series
    stay, each made by one close (one version), and `mosafs gc` frees everything else."""
    up = start_cluster(*UP_ARGS)
    ckpt = up.mountpoint / "ckpt"
    ckpt.mkdir()
    assert cli("policy", "set", str(ckpt), "--keep-last", "2").returncode == 0

    def data(k: int, n: int) -> bytes:
        return random_bytes(f"writer {k} step {n}", STEP_BYTES)

    def writer(k: int) -> None:
        source = tmp_path / f"source-{k}"
        for n in range(1, STEPS + 1):
            source.write_bytes(data(k, n))
            subprocess.run(["cp", str(source), str(ckpt / f"app.n{k}.{n}")], check=True,
                           timeout=120)

    with burning_cpu(), ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(writer, range(WRITERS)))  # a writer's failure fails the test
    kept = [(k, n) for k in range(WRITERS) for n in (STEPS - 1, STEPS)]
    assert sorted(os.listdir(ckpt)) == sorted(f"app.n{k}.{n}" for k, n in kept)
    for k, n in kept:
        path = ckpt / f"app.n{k}.{n}"
        assert path.read_bytes() == data(k, n)
        assert [v["version"] for v in cli_json("versions", str(path))["versions"]] == [1]
    manager_log = (up.data_dir / "logs" / "manager.log").read_text()
    assert manager_log.count("pruned /ckpt/") == WRITERS * (STEPS - 2)
    assert "superseded" not in manager_log  # no close made a second version

    def collected() -> bool:
        assert cli("gc", "--data-dir", str(up.data_dir)).returncode == 0
        return up.stored_bytes() <= len(kept) * STEP_BYTES

    wait_for(collected, 30, "garbage collection freed the pruned steps")
    assert up.stored_bytes() == len(kept) * STEP_BYTES  # R=1, random data: no chunk shared


def test_fuse_policy_set_and_apply_print_what_they_pruned(folder: Path) -> None:
    for n in (1, 2, 3):
        (folder / f"app.n0.{n}").write_bytes(random_bytes(f"print {n}", 32 * KiB))
    where = f"/{folder.name}"
    done = cli("policy", "set", str(folder), "--keep-last", "1")
    assert done.returncode == 0, done.stderr
    assert f"removed file {where}/app.n0.1 v1 (32 KiB, committed " in done.stdout
    assert f"removed file {where}/app.n0.2 v1 (32 KiB" in done.stdout
    assert "): keep-last 1\n" in done.stdout
    assert "removed 2 versions, 2 files (64 KiB of checkpoint data)" in done.stdout
    assert "(64 KiB, 64 KiB with every copy): `mosafs gc` frees them" in done.stdout
    # A hard-linked step is left alone; once its other name goes, `policy apply` removes it.
    (folder / "app.n0.4").write_bytes(random_bytes("print 4", 32 * KiB))
    os.link(folder / "app.n0.4", folder / "pinned")
    (folder / "app.n0.5").write_bytes(random_bytes("print 5", 32 * KiB))
    assert sorted(os.listdir(folder)) == ["app.n0.4", "app.n0.5", "pinned"]
    skipped = cli_json("policy", "apply", str(folder), "--dry-run")
    assert skipped["skipped"] == [f"{where}/app.n0.4: hard-linked"]
    os.unlink(folder / "pinned")
    dry = cli("policy", "apply", str(folder), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would remove file {where}/app.n0.4 v1 (32 KiB" in dry.stdout
    assert "would remove 1 versions, 1 files (32 KiB of checkpoint data)" in dry.stdout
    assert "would leave" in dry.stdout
    assert sorted(os.listdir(folder)) == ["app.n0.4", "app.n0.5"]
    applied = cli_json("policy", "apply", str(folder))
    assert [(i["path"], i["version"], i["whole_file"], i["reason"])
            for i in applied["pruned"]] == [(f"{where}/app.n0.4", 1, True, "keep-last 1")]
    assert applied["bytes_released"] == applied["bytes_unreferenced"] == 32 * KiB
    assert applied["stored_bytes_unreferenced"] == 32 * KiB  # R=1
    wait_for(lambda: sorted(os.listdir(folder)) == ["app.n0.5"], 5,
             "the mount's cached listing caught up")


def test_fuse_a_name_pruned_after_this_mounts_commit_leaves_its_cache(folder: Path) -> None:
    """Pruning after a commit runs inside the mount's own request, yet it is the manager's
    work: the change list tells this mount too, which drops the pruned name at once
    instead of serving it for the coherent timeout (60 s)."""
    assert cli("policy", "set", str(folder), "--keep-last", "1").returncode == 0
    (folder / "app.n0.1").write_bytes(b"one" * 1000)
    assert os.stat(folder / "app.n0.1").st_size == 3000  # cached by this mount
    (folder / "app.n0.2").write_bytes(b"two" * 1000)  # its close prunes app.n0.1
    wait_for(lambda: not os.path.exists(folder / "app.n0.1"), 5,
             "the pruned name left the committing mount's cache")
    assert sorted(os.listdir(folder)) == ["app.n0.2"]


def test_fuse_purge_after_removes_files_on_schedule(folder: Path) -> None:
    assert cli("policy", "set", str(folder), "--purge-after", "2s").returncode == 0
    before = time.monotonic()
    (folder / "sim.n0.1").write_bytes(random_bytes("purge", 64 * KiB))
    written = time.monotonic()
    assert (folder / "sim.n0.1").exists()
    gone = wait_for(lambda: not (folder / "sim.n0.1").exists(), 10, "the file was purged")
    assert gone - before >= 2.0, "purged before its time"
    assert gone - written < 5.0, "purged late"


def test_fuse_policy_dry_run_lists_then_set_prunes(folder: Path) -> None:
    for n in (1, 2, 3):
        (folder / f"app.n0.{n}").write_bytes(random_bytes(f"dry {n}", 32 * KiB))
    dry = cli_json("policy", "set", str(folder), "--keep-last", "1", "--dry-run")
    assert dry["dry_run"] is True
    assert sorted(i["path"].rsplit("/", 1)[1] for i in dry["pruned"]) == ["app.n0.1",
                                                                       "app.n0.2"]
    assert dry["files_removed"] == 2 and dry["bytes_released"] == 64 * KiB
    assert sorted(os.listdir(folder)) == ["app.n0.1", "app.n0.2", "app.n0.3"]
    shown = cli_json("policy", "set", str(folder), "--keep-last", "1")
    assert shown["own"]["policy"]["keep_last"] == 1
    # Applied at once, and reported: what the dry run said would go.
    assert shown["prune"]["dry_run"] is False
    assert sorted(i["path"] for i in shown["prune"]["pruned"]) == \
        sorted(i["path"] for i in dry["pruned"])
    assert shown["prune"]["bytes_unreferenced"] == dry["bytes_unreferenced"] == 64 * KiB
    wait_for(lambda: sorted(os.listdir(folder)) == ["app.n0.3"], 5,
             "the mount's cached listing caught up")
    again = cli_json("policy", "apply", str(folder), "--dry-run")
    assert again["pruned"] == []


def test_fuse_policy_show_inheritance_and_keep_all_override(cluster: UpCluster,
                                                            folder: Path) -> None:
    sub = folder / "sub"
    sub.mkdir()
    assert cli("policy", "set", str(folder), "--keep-last", "3", "--purge-after",
               "7d").returncode == 0
    shown = cli_json("policy", "show", str(sub))
    assert shown["effective"]["policy"]["text"] == "keep-last 3, purge-after 1w"
    assert shown["effective"]["policy_from"] == folder.stat().st_ino
    assert shown["own"]["policy"] is None
    assert cli("policy", "set", str(sub), "--keep-all").returncode == 0
    assert cli_json("policy", "show", str(sub))["effective"]["policy"]["text"] == "keep-all"
    listed = cli_json("policy", "show", "--data-dir", str(cluster.data_dir))
    paths = {f["path"] for f in listed["folders"]}
    assert {f"/{folder.name}", f"/{folder.name}/sub"} <= paths


# --- series ----------------------------------------------------------------------------------

def test_fuse_new_step_dedupes_against_the_newest_step_of_its_series(folder: Path) -> None:
    first = random_bytes("series", 4 * MiB)
    (folder / "run.n0.1").write_bytes(first)
    shutil.copyfile(folder / "run.n0.1", folder / "other.n0.1")  # another series
    (folder / "run.n0.2").write_bytes(similar(first, "step 2"))
    stats = cli_json("stats", str(folder / "run.n0.2"))
    assert stats["deduped_against"] == {"inode": (folder / "run.n0.1").stat().st_ino,
                                        "version": 1}
    assert stats["shared_bytes"] > 3 * MiB
    assert stats["new_bytes"] < MiB
    (folder / "run.n1.1").write_bytes(random_bytes("node 1", MiB))
    assert cli_json("stats", str(folder / "run.n1.1"))["deduped_against"] is None


def test_fuse_series_pattern_is_configurable_per_folder(folder: Path) -> None:
    assert cli("policy", "set", str(folder), "--series-pattern",
               "{job}-{step}.ckpt").returncode == 0
    first = random_bytes("pattern", 2 * MiB)
    (folder / "lulesh-10.ckpt").write_bytes(first)
    (folder / "lulesh-20.ckpt").write_bytes(similar(first, "pattern 2"))
    stats = cli_json("stats", str(folder / "lulesh-20.ckpt"))
    assert stats["deduped_against"]["inode"] == (folder / "lulesh-10.ckpt").stat().st_ino
    assert stats["shared_bytes"] > MiB


# --- versions --------------------------------------------------------------------------------

def two_versions(folder: Path) -> tuple[Path, bytes, bytes]:
    v1, v2 = random_bytes("v1", 3 * MiB), random_bytes("v2", MiB + 17)
    path = folder / "model.pt"
    path.write_bytes(v1)
    path.write_bytes(v2)
    return path, v1, v2


def test_fuse_versions_json_and_restore(folder: Path, tmp_path: Path) -> None:
    path, v1, v2 = two_versions(folder)
    listed = cli_json("versions", str(path))
    assert [(v["version"], v["size"]) for v in listed["versions"]] == [(1, len(v1)),
                                                                      (2, len(v2))]
    assert all(v["commit_time_ns"] > 0 and v["new_bytes"] > 0 for v in listed["versions"])
    dest = tmp_path / "restored"
    done = cli_json("restore", str(path), "--version", "1", "--to", str(dest))
    assert done["bytes"] == len(v1) and dest.read_bytes() == v1
    refused = cli("restore", str(path), "--version", "2", "--to", str(dest))
    assert refused.returncode == 4 and "pass --force" in refused.stderr
    assert dest.read_bytes() == v1
    assert cli("restore", str(path), "--version", "2", "--to", str(tmp_path),
               "--force").returncode == 0
    assert (tmp_path / "model.pt").read_bytes() == v2
    in_place = cli_json("restore", str(path), "--version", "1", "--in-place")
    assert in_place["new_version"] == 3
    assert path.read_bytes() == v1
    assert [v["version"] for v in cli_json("versions", str(path))["versions"]] == [1, 2, 3]


def test_fuse_versions_view_reads_old_versions_read_only(folder: Path,
                                                        tmp_path: Path) -> None:
    path, v1, v2 = two_versions(folder)
    view = folder / ".versions"
    assert ".versions" not in os.listdir(folder)  # hidden: cp -a, tar, rsync skip it
    assert os.listdir(view) == ["model.pt"]
    assert sorted(os.listdir(view / "model.pt")) == ["1", "2"]
    assert (view / "model.pt" / "1").read_bytes() == v1
    assert (view / "model.pt" / "2").read_bytes() == v2
    st = (view / "model.pt" / "1").stat()
    assert st.st_size == len(v1) and st.st_mode & 0o222 == 0
    for attempt, code in [
        (lambda: os.open(view / "model.pt" / "1", os.O_RDWR), errno.EROFS),
        (lambda: (view / "model.pt" / "1").unlink(), errno.EROFS),
        (lambda: (view / "model.pt" / "new").write_bytes(b"x"), errno.EROFS),
        (lambda: (view / "x").mkdir(), errno.EROFS),
        (lambda: view.rename(folder / "elsewhere"), errno.EROFS),
        (lambda: os.truncate(view / "model.pt" / "2", 0), errno.EROFS),
        (lambda: view.mkdir(), errno.EEXIST),
        (lambda: (view / "model.pt" / "3").stat(), errno.ENOENT),
        (lambda: (view / "model.pt" / "01").stat(), errno.ENOENT),
    ]:
        with pytest.raises(OSError) as caught:
            attempt()
        assert caught.value.errno == code
    assert path.read_bytes() == v2  # nothing changed
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    assert os.listdir(copy) == ["model.pt"]


# --- the CLI ---------------------------------------------------------------------------------

def test_fuse_every_json_output_parses(cluster: UpCluster, folder: Path) -> None:
    path, _, _ = two_versions(folder)
    manager = ("--data-dir", str(cluster.data_dir))
    assert cli_json("stats", str(path))["version"] == 2
    assert len(cli_json("versions", str(path))["versions"]) == 2
    assert cli_json("policy", "show", str(folder))["effective"]["pool"] == "default"
    assert "folders" in cli_json("policy", "show", *manager)
    assert "pruned" in cli_json("policy", "apply", *manager, "--dry-run")
    pools = cli_json("pool", "list", *manager)["pools"]
    assert [p["name"] for p in pools] == ["default"] and pools[0]["replication"] == 1
    assert cli_json("pool", "show", "default", *manager)["chunker"] == CHUNKER
    benefactors = cli_json("benefactor", "list", *manager)["benefactors"]
    assert len(benefactors) == 3 and all(b["alive"] and not b["draining"]
                                         for b in benefactors)
    assert len(cli_json("status", *manager)["benefactors"]) == 3
    assert cli_json("gc", *manager)["benefactors"] == 3


@pytest.mark.parametrize("args, code, message", [
    (("policy", "set", "{file}", "--keep-last", "2"), 4, "is a file"),
    (("policy", "set", "{dir}", "--purge-after", "7x"), 2, "malformed duration '7x'"),
    (("policy", "set", "{dir}", "--keep-every", "3"), 2, "needs --keep-last"),
    (("policy", "set", "{dir}"), 2, "nothing to set"),
    (("policy", "set", "{dir}", "--series-pattern", "{app}.{node}"), 2, "exactly once"),
    (("policy", "set", "/tmp", "--keep-last", "1"), 2, "not inside a mosafs mount"),
    (("policy", "show", "{dir}/.versions"), 2, "inside a .versions view"),
    (("pool", "assign", "{dir}", "nope"), 3, "no pool 'nope'"),
    (("pool", "show", "nope", "{data}"), 3, "no pool 'nope'"),
    (("pool", "create", "no/slash", "{data}"), 2, "bad pool name"),
    (("pool", "create", "p", "--replication", "99", "{data}"), 2, "replication must be"),
    (("pool", "delete", "default", "{data}"), 4, "cannot be deleted"),
    (("restore", "{file}", "--version", "99", "--to", "/tmp/x"), 3, "has no version 99"),
    (("restore", "{file}", "--version", "1"), 2, "one of the arguments"),
    (("versions", "{dir}"), 2, "is a directory"),
    (("versions", "{dir}/missing"), 3, "no such file"),
    (("benefactor", "remove", "nope", "{data}"), 3, "no benefactor 'nope'"),
    (("benefactor", "drain", "nope", "{data}"), 3, "no benefactor 'nope'"),
    (("status", "--manager", "127.0.0.1:1", "--insecure"), 7, ""),
    (("status", "--manager", "127.0.0.1:1"), 2, "no TLS certificate"),
])
def test_fuse_cli_errors_are_one_line_with_meaningful_codes(
        cluster: UpCluster, args: tuple[str, ...], code: int, message: str) -> None:
    d = cluster.mountpoint / "errors"
    d.mkdir(exist_ok=True)
    if not (d / "f").exists():
        (d / "f").write_bytes(b"one version")
    fill = {"{file}": str(d / "f"), "{dir}": str(d), "{data}": "--data-dir"}
    argv: list[str] = []
    for arg in args:
        if arg == "{data}":
            argv += ["--data-dir", str(cluster.data_dir)]
        else:
            for key, value in fill.items():
                arg = arg.replace(key, value)
            argv.append(arg)
    # Each command names its cluster (or none, on purpose): the record of the running `up`
    # must not supply one (nor its certificates).
    nothing_running = cluster.data_dir.parent / "no-running-up"
    done = cli(*argv, env={"XDG_STATE_HOME": str(nothing_running)})
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mosafs "), done.stderr
    assert message in lines[0]
    assert done.stdout == ""
