"""A newcomer's first hour (issue 16), without processes: bounded numbers refused in one
line before any RPC, benefactor ids given in part, the [admin] section of the config file,
the per-user record of running `mosafs up`s, and where a write into a pool without
benefactors is refused at once (NoSpace, logged once a minute) rather than retried."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mosafs import cli
from mosafs.admin import common
from mosafs.admin.policy import duration_ms
from mosafs.admin.pools import match_id
from mosafs.config import apply
from mosafs.errors import ConfigError, NoSpace, NotFound, Unavailable
from mosafs.manager import pools
from mosafs.manager.core import Manager
from mosafs.manager.metadata import ROOT_INODE
from mosafs.running import forget_running, record_running, running_dir
from tests.unit.managers import Clock, new_file, register

# --- numbers and durations: one line, exit code 2, nothing asked ------------------------------


@pytest.mark.parametrize("argv, message", [
    (["pool", "create", "neg", "--replication", "-1"], "replication must be 1..16, got '-1'"),
    (["pool", "set", "fast", "--replication", "-2"], "replication must be 1..16, got '-2'"),
    (["pool", "set", "fast", "--replication", "2.5"], "replication must be a whole number"),
    (["pool", "create", "x", "--stripe-width", "-1"], "stripe width must be 1..1024"),
    (["pool", "create", "x", "--stripe-width", "0"], "stripe width must be 1..1024"),
    (["pool", "create", "x", "--chunker", "fixed:-1"], "chunker 'fixed:-1'"),
    (["policy", "set", "/tmp", "--purge-after", "-5d"], "durations are positive, like 7d"),
    (["policy", "set", "/tmp", "--purge-after=-5d"], "durations are positive, like 7d"),
    (["policy", "set", "/tmp", "--purge-after", "-1.5h"], "durations are positive"),
    (["policy", "set", "/tmp", "--purge-after", "0s"], "must be more than 0"),
    (["policy", "set", "/tmp", "--keep-last", "-1"], "must be 1..1000000, got '-1'"),
    (["policy", "set", "/tmp", "--keep-last", "3", "--keep-every", "-3"], "must be 1..1000000"),
    (["benefactor", "drain", "3f2a", "--timeout", "-1"], "must be at least 0, got '-1'"),
    (["benefactor", "drain", "3f2a", "--timeout", "nan"], "not a finite number"),
    (["restore", "/tmp/f", "--version", "-1", "--to", "/tmp/x"], "must be at least 1, got '-1'"),
    (["restore", "/tmp/f", "--version", "0", "--in-place"], "must be at least 1, got '0'"),
])
def test_unit_bad_numbers_are_one_line_errors_before_any_rpc(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOSAFS_MANAGER", "127.0.0.1:1")  # never asked: parsing refuses first
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_unit_negative_number_in_a_real_process_has_no_traceback() -> None:
    done = subprocess.run([sys.executable, "-m", "mosafs", "pool", "create", "neg",
                           "--replication", "-1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("mosafs pool create: argument --replication: replication "
                                  "must be 1..16, got '-1'"), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def _admin_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """Every parser of an administrative command or action (daemons and benchmarks are
    not), by name."""
    cli.build_parser()
    out = []
    for name, parser in cli.COMMAND_PARSERS.items():
        if name in ("up", "manager", "mount", "bench"):
            continue
        if name != "benefactor":  # the daemon; its actions are admin commands
            out.append((name, parser))
        out += [(f"{name} {sub}", p) for action in parser._actions
                if isinstance(action, argparse._SubParsersAction)
                for sub, p in action.choices.items()]
    return out


def test_unit_every_numeric_option_of_the_admin_commands_is_bounded() -> None:
    """A bare int or float type takes -1 (a protobuf field then raises ValueError, a
    traceback) and nan: every number an admin command takes goes through mosafs.argtypes."""
    bare = [f"{name} {'/'.join(action.option_strings)}"
            for name, parser in _admin_parsers() for action in parser._actions
            if action.type in (int, float)]
    assert not bare, bare


def test_unit_duration_type_says_durations_are_positive() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="durations are positive, like 7d"):
        duration_ms(" -5d")
    assert duration_ms("7d") == 7 * 86400 * 1000


# --- benefactor ids given in part -----------------------------------------------------------

IDS = ["3f2a9c0e5b7d41c8a6e2f0b9d4c7e1a5", "3f2b0000000000000000000000000000",
       "8c1d5e0f9a2b4c6d8e0f1a3b5c7d9e1f"]


def test_unit_benefactor_id_prefix_resolves_like_git() -> None:
    assert match_id(IDS[0], IDS) == IDS[0]
    assert match_id("3f2a", IDS) == IDS[0]
    assert match_id("8C1D5E", IDS) == IDS[2]  # hex in either case
    assert match_id("bf-1", ["bf-1", "bf-10"]) == "bf-1"  # an exact id wins over a prefix
    with pytest.raises(ConfigError, match="'3f2' is too short: give at least 4"):
        match_id("3f2", IDS)
    other = "3f2a0000000000000000000000000000"
    with pytest.raises(ConfigError, match=rf"'3f2a' is ambiguous: 2 ids start with it "
                                          rf"\({other}, {IDS[0]}\); give more characters"):
        match_id("3f2a", [*IDS, other])
    with pytest.raises(NotFound, match=r"no benefactor 'ffff' \(`mosafs benefactor list`"):
        match_id("ffff", IDS)


# --- the [admin] section of `mosafs --config` -----------------------------------------------

def parsed(argv: list[str], text: str, environ: dict[str, str], tmp_path: Path) -> Any:
    path = tmp_path / "mosafs.toml"
    path.write_text(text)
    parser = cli.build_parser()
    apply(cli.COMMAND_PARSERS[argv[0]], argv[0], path, environ=environ)
    return parser.parse_args(argv)


def test_unit_admin_section_sets_the_defaults_of_every_admin_command(tmp_path: Path) -> None:
    text = ('[admin]\nmanager = "mgr:7070"\ndata-dir = "/srv/up"\ntls_dir = "/etc/tls"\n'
            'insecure = false\n[benefactor]\ndata-dir = "/srv/chunks"\n')
    for argv in (["pool", "list"], ["status"], ["policy", "show"], ["benefactor", "list"],
                 ["versions", "/mnt/f"], ["pool", "assign", "/mnt/d", "fast"]):
        args = parsed(argv, text, {}, tmp_path)
        assert (args.manager, args.data_dir, args.tls_dir, args.insecure) == \
            ("mgr:7070", "/srv/up", "/etc/tls", False), argv
    # The benefactor daemon reads [benefactor], its admin actions [admin].
    args = parsed(["benefactor"], text, {}, tmp_path)
    assert (args.data_dir, args.manager) == ("/srv/chunks", None)
    # A flag wins; the environment wins over the file, the admin commands' own variables too.
    args = parsed(["pool", "list", "--data-dir", "/flag"], text,
                  {"MOSAFS_ADMIN_TLS_NAME": "ops", "MOSAFS_MANAGER": "env:1",
                   "MOSAFS_INSECURE": "1"}, tmp_path)
    assert (args.data_dir, args.tls_name, args.manager, args.insecure) == \
        ("/flag", "ops", None, None)
    # Daemons and commands without these options take the file as it is.
    assert parsed(["certs", "list", "--dir", "/x"], text, {}, tmp_path).dir == Path("/x")
    assert parsed(["manager"], text, {}, tmp_path).data_dir is None


@pytest.mark.parametrize("text, environ, message", [
    ('[admin]\nmanagr = "x:1"\n', {}, "[admin] managr: unknown key (keys: manager, data-dir"),
    ('[admin]\ninsecure = "maybe"\n', {}, "[admin] insecure: not a boolean"),
    ("", {"MOSAFS_ADMIN_COLOUR": "blue"}, "MOSAFS_ADMIN_COLOUR: no key colour of [admin]"),
])
def test_unit_admin_section_errors_name_the_key(tmp_path: Path, text: str,
                                                environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parsed(["pool", "list"], text, environ, tmp_path)
    assert message in caught.value.message and "\n" not in caught.value.message


# --- finding the cluster of a running `mosafs up` -------------------------------------------

def admin_args(**kwargs: Any) -> argparse.Namespace:
    values = {"manager": None, "data_dir": None, "tls_dir": None, "tls_name": None,
              "insecure": True, **kwargs}
    return argparse.Namespace(**values)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A per-user state and data directory of our own, the current directory outside any
    mount, no $MOSAFS_MANAGER."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data-home"))
    monkeypatch.delenv("MOSAFS_MANAGER", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def fake_cluster(where: Path, manager: str, pid: int, record: str | None = None) -> Path:
    """DIR/cluster.json as `mosafs up` writes it, and its record (RECORD.json)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "cluster.json").write_text(json.dumps({"manager": manager, "pid": pid,
                                                    "tls": None}))
    if record is not None:
        running_dir().mkdir(parents=True, exist_ok=True)
        (running_dir() / f"{record}.json").write_text(json.dumps({"data_dir": str(where),
                                                                  "pid": pid}))
    return where


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_unit_the_running_up_is_found_without_data_dir(state: Path) -> None:
    record_running(fake_cluster(state / "c1", "127.0.0.1:7001", os.getpid()))
    assert [p.name for p in running_dir().iterdir()] == [f"{os.getpid()}.json"]
    assert common.find_manager(admin_args()).address == "127.0.0.1:7001"
    assert common.find_manager(admin_args(manager="m:1")).address == "m:1"
    # Records of an `up` that is gone: its pid dead, or its cluster.json of another process.
    fake_cluster(state / "dead", "127.0.0.1:7002", dead_pid(), record="dead")
    fake_cluster(state / "reused", "127.0.0.1:7003", os.getppid(), record="reused")
    (state / "reused" / "cluster.json").write_text(json.dumps({"manager": "x:1", "pid": 1}))
    assert common.find_manager(admin_args()).address == "127.0.0.1:7001"
    assert sorted(p.name for p in running_dir().iterdir()) == [f"{os.getpid()}.json"]
    forget_running()
    assert not list(running_dir().iterdir())
    with pytest.raises(ConfigError, match="no manager found: no mount here, no running"):
        common.find_manager(admin_args())


def test_unit_several_running_ups_are_named_and_data_dir_asked_for(state: Path) -> None:
    first = fake_cluster(state / "c1", "127.0.0.1:7001", os.getpid(), record="a")
    second = fake_cluster(state / "c2", "127.0.0.1:7002", os.getpid(), record="b")
    with pytest.raises(ConfigError) as caught:
        common.find_manager(admin_args())
    assert caught.value.message == (f"2 mosafs clusters are running (data directories "
                                    f"{first}, {second}): pass --data-dir DIR to pick one")
    assert common.find_manager(admin_args(data_dir=str(second))).address == "127.0.0.1:7002"
    # With the manager given, the clusters are only asked for a TLS directory.
    assert common.find_manager(admin_args(manager="m:1")).address == "m:1"


# --- a pool that cannot take a write: NoSpace at once, or Unavailable (retried) -------------

def _write_into(mgr: Manager, pool: str) -> int:
    mgr.store.update_pool(pool, create=True)
    folder = mgr.store.mkdir(ROOT_INODE, pool, 0o755).inode
    mgr.set_folder(folder, pool=pool, series_pattern=None, policy=None, clear_policy=False)
    return new_file(mgr.store, "f", folder)


def test_unit_a_pool_without_benefactors_refuses_writes_at_once(
        mgr: Manager, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    f = new_file(mgr.store, "f")
    with pytest.raises(Unavailable, match="no live benefactor in pool 'default'"):
        mgr.open_write(f, "c")  # no benefactor registered anywhere yet: a cluster starting
    register(mgr, "b1")
    empty = _write_into(mgr, "empty-ux")
    caplog.set_level(logging.WARNING, logger="mosafs.manager.pools")
    for _ in range(3):
        with pytest.raises(NoSpace, match=r"pool 'empty-ux' has no benefactors: move one into "
                                          r"it \(`mosafs benefactor move ID empty-ux`\) or "
                                          r"assign the folder to another pool"):
            mgr.open_write(empty, "c")
    warned = [r.getMessage() for r in caplog.records if r.name == "mosafs.manager.pools"]
    assert len(warned) == 1 and "pool 'empty-ux' has no benefactors" in warned[0], warned
    assert "ENOSPC" in warned[0]
    # Registered but not live right now (a restart, a pause): retried by clients.
    mgr.registry.update("b1", pool="empty-ux")
    clock.now += 10
    with pytest.raises(Unavailable, match="no live benefactor in pool 'empty-ux'"):
        mgr.open_write(empty, "c")
    register(mgr, "b1")
    assert [t.id for t in mgr.open_write(empty, "c").targets] == ["b1"]
    # Every benefactor of the pool draining: waiting changes nothing.
    mgr.registry.update("b1", draining=True)
    with pytest.raises(NoSpace, match="every benefactor of pool 'empty-ux' is draining"):
        mgr.open_write(empty, "c")


def test_unit_unwritable_pool_warning_is_rate_limited_per_pool(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="mosafs.manager.pools")
    every = pools.UNWRITABLE_WARN_EVERY_S
    assert pools.warn_unwritable("rl-a", "pool 'rl-a' has no benefactors", now=0.0)
    assert not pools.warn_unwritable("rl-a", "again", now=every - 1)
    assert pools.warn_unwritable("rl-b", "pool 'rl-b' has no benefactors", now=1.0)
    assert pools.warn_unwritable("rl-a", "pool 'rl-a' has no benefactors", now=every + 1)
    assert len(caplog.records) == 3
