"""A newcomer's first hour (issue 16) on a real `mosafs up` with a FUSE mount: a write
into a folder whose pool has no benefactors fails at once with ENOSPC and the logs say
why; the pool commands warn about pools that cannot hold what they promise; benefactor ids
may be given in part; admin commands find the running cluster without --data-dir, and
read the [admin] section of `mosafs --config`.

The cluster and every command run with per-user state and data directories of their own
(XDG_STATE_HOME, XDG_DATA_HOME), so nothing here reads or writes the real user's."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import UpCluster, fuse_available, launch_up, stop_all

# The pool 'nobody' is the one written into: its refusal is logged by the manager (once a
# minute) and by the mount (once per refused open).
NOISE = [
    r"WARNING mosafs\.manager\.pools\[\d+\]: opens for writing fail with ENOSPC: pool "
    r"'nobody' has no benefactors",
    r"WARNING mosafs\.client\S*\[\d+\]: cannot write inode \d+: pool 'nobody' has no "
    r"benefactors",
]


@dataclass
class Ux:
    cluster: UpCluster
    home: Path  # where the commands run: outside the mount, with XDG dirs of its own
    state: Path  # the XDG_STATE_HOME of the cluster and the commands

    def env(self, state: Path | None = None, **extra: str) -> dict[str, str]:
        """The environment of a command: no variable that names a cluster, our XDG dirs."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("MOSAFS_")}
        return {**base, "XDG_STATE_HOME": str(state or self.state),
                "XDG_DATA_HOME": str(self.home / "xdg-data"), **extra}

    def run(self, *args: str, state: Path | None = None,
            **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mosafs", *args], capture_output=True,
                              text=True, timeout=120, cwd=self.home,
                              env=self.env(state, **extra))

    def json(self, *args: str) -> Any:
        done = self.run(*args, "--json")
        assert done.returncode == 0, f"mosafs {' '.join(args)}: {done.stderr}"
        return json.loads(done.stdout)

    @property
    def data(self) -> list[str]:
        return ["--data-dir", str(self.cluster.data_dir)]


@pytest.fixture(scope="module")
def ux(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ux]:
    reason = fuse_available()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("ux")
    state = tmp / "xdg-state"
    with pytest.MonkeyPatch.context() as patch:  # what `mosafs up` inherits
        patch.setenv("XDG_STATE_HOME", str(state))
        patch.setenv("XDG_DATA_HOME", str(tmp / "xdg-data"))
        cluster = launch_up(tmp, "--replication", "1", expected_noise=NOISE)
    home = tmp / "home"
    home.mkdir()
    try:
        yield Ux(cluster, home, state)
    finally:
        stop_all([cluster])
    assert not list((state / "mosafs" / "running").glob("*.json")), \
        "a stopped `mosafs up` left its record behind"


def one_warning(done: subprocess.CompletedProcess[str], command: str) -> str:
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mosafs {command}: warning: "), \
        done.stderr
    return lines[0]


# --- a pool without benefactors -------------------------------------------------------------

def test_fuse_write_into_a_pool_without_benefactors_is_enospc_at_once(ux: Ux) -> None:
    ux.json("pool", "create", "nobody", *ux.data)
    folder = ux.cluster.mountpoint / "nobody"
    folder.mkdir()
    ux.json("pool", "assign", str(folder), "nobody")
    for name in ("a.ckpt", "b.ckpt"):
        started = time.monotonic()
        with pytest.raises(OSError) as refused, open(folder / name, "wb") as f:
            f.write(b"checkpoint")
        took = time.monotonic() - started
        assert refused.value.errno == errno.ENOSPC, refused.value
        assert took < 2.0, f"ENOSPC after {took:.1f}s: retried as if the pool were coming back"
    logs = ux.cluster.data_dir / "logs"
    warned = [line for line in (logs / "manager.log").read_text().splitlines()
              if "WARNING" in line and "'nobody'" in line]
    assert len(warned) == 1, warned  # once a minute, not once per open
    assert "`mosafs benefactor move ID nobody`" in warned[0]
    assert "`mosafs pool assign FOLDER POOL`" in warned[0]
    mount = [line for line in (logs / "mount.log").read_text().splitlines()
             if "WARNING" in line and "pool 'nobody' has no benefactors" in line]
    assert len(mount) == 2, mount
    # The rest of the mount is unaffected.
    (ux.cluster.mountpoint / "fine.ckpt").write_bytes(b"stored")
    assert (ux.cluster.mountpoint / "fine.ckpt").read_bytes() == b"stored"


def test_fuse_pool_commands_warn_about_pools_short_of_benefactors(ux: Ux) -> None:
    line = one_warning(ux.run("pool", "create", "big", "--replication", "5", *ux.data),
                       "pool create")
    assert "pool 'big' keeps R=5 copies (the whole cluster has 3 live) but has no live " \
           "benefactor" in line
    assert "add benefactors to it: `mosafs benefactor move ID big`" in line
    line = one_warning(ux.run("pool", "set", "big", "--replication", "6", *ux.data),
                       "pool set")
    assert "R=6" in line
    folder = ux.cluster.mountpoint / "big"
    folder.mkdir()
    done = ux.run("pool", "assign", str(folder), "big", "--json")
    line = one_warning(done, "pool assign")
    assert f"pool 'big' has no live benefactor: writes in {folder} fail until one joins" in line
    assert json.loads(done.stdout)["effective"]["pool"] == "big"  # stdout stays JSON
    # A pool with enough live benefactors: nothing to say.
    for args in (("pool", "set", "default", "--replication", "1"),
                 ("pool", "assign", str(folder), "default")):
        done = ux.run(*args, *(ux.data if args[1] == "set" else ()))
        assert done.returncode == 0 and done.stderr == "", done.stderr


# --- numbers --------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (("pool", "create", "neg", "--replication", "-1"), "replication must be 1..16, got '-1'"),
    (("pool", "set", "default", "--replication", "-2"), "replication must be 1..16"),
    (("pool", "create", "x", "--stripe-width", "-1"), "stripe width must be 1..1024"),
    (("policy", "set", "{mnt}", "--purge-after", "-5d"), "durations are positive, like 7d"),
])
def test_fuse_negative_numbers_are_one_line_errors(ux: Ux, args: tuple[str, ...],
                                                   message: str) -> None:
    argv = [a.replace("{mnt}", str(ux.cluster.mountpoint)) for a in args]
    done = ux.run(*argv)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert all(p["name"] != "neg" for p in ux.json("pool", "list")["pools"])


# --- benefactor ids in part -----------------------------------------------------------------

def unique_prefix(bid: str, others: list[str]) -> str:
    n = 4
    while any(o != bid and o.startswith(bid[:n]) for o in others):
        n += 1
    return bid[:n]


def test_fuse_benefactor_commands_take_a_unique_prefix(ux: Ux) -> None:
    ids = [b["id"] for b in ux.json("benefactor", "list")["benefactors"]]
    assert len(ids) == 3 and all(len(i) == 32 for i in ids)
    prefix = unique_prefix(ids[0], ids)
    drained = ux.json("benefactor", "drain", prefix, "--cancel")
    assert drained["id"] == ids[0] and not drained["draining"]
    moved = ux.json("benefactor", "move", prefix.upper(), "default")
    assert (moved["id"], moved["pool"]) == (ids[0], "default")
    done = ux.run("benefactor", "drain", ids[0][:3], "--cancel")
    assert done.returncode == 2 and "is too short: give at least 4" in done.stderr, done.stderr
    unknown = next(p for p in ("ffffffff", "00000000") if not any(i.startswith(p) for i in ids))
    done = ux.run("benefactor", "remove", unknown)
    assert done.returncode == 3 and f"no benefactor '{unknown}'" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1


# --- finding the cluster --------------------------------------------------------------------

def test_fuse_admin_commands_find_the_running_up_without_data_dir(ux: Ux) -> None:
    assert "default" in [p["name"] for p in ux.json("pool", "list")["pools"]]
    assert len(ux.json("benefactor", "list")["benefactors"]) == 3
    assert "folders" in ux.json("policy", "show")
    assert len(ux.json("status")["benefactors"]) == 3
    # A second cluster running: both are named, and --data-dir picks one.
    other = ux.home / "other-cluster"
    other.mkdir()
    (other / "cluster.json").write_text(json.dumps({"manager": "127.0.0.1:1",
                                                    "pid": os.getpid()}))
    record = ux.state / "mosafs" / "running" / "other.json"
    record.write_text(json.dumps({"data_dir": str(other), "pid": os.getpid()}))
    try:
        done = ux.run("pool", "list")
        assert done.returncode == 2, done.stderr
        assert "2 mosafs clusters are running" in done.stderr
        assert str(ux.cluster.data_dir) in done.stderr and str(other) in done.stderr
        assert "pass --data-dir DIR" in done.stderr and done.stderr.count("\n") == 1
        assert ux.json("pool", "list", *ux.data)["pools"]
    finally:
        record.unlink()


def test_fuse_admin_commands_read_the_admin_section_of_the_config(ux: Ux) -> None:
    nothing = ux.home / "no-state"  # no running `up` recorded: only the file says where
    done = ux.run("pool", "list", state=nothing)
    assert done.returncode == 2 and "no manager found" in done.stderr, done.stderr
    config = ux.home / "mosafs.toml"
    config.write_text(f'[admin]\ndata-dir = "{ux.cluster.data_dir}"\n')
    done = ux.run("--config", str(config), "benefactor", "list", "--json", state=nothing)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["benefactors"]) == 3
    done = ux.run("pool", "list", "--json", state=nothing, MOSAFS_CONFIG=str(config))
    assert done.returncode == 0 and json.loads(done.stdout)["pools"], done.stderr
    config.write_text('[admin]\ndata-dir = "/nonexistent"\nmanagr = "x:1"\n')
    done = ux.run("--config", str(config), "pool", "list", state=nothing)
    assert done.returncode == 2 and "[admin] managr: unknown key" in done.stderr, done.stderr
