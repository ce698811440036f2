"""The mount with short-lived chunk access tokens (docs/operations.md, "Chunk access
tokens"): a file kept open for reading longer than a token lives reads on (the mount asks
for the block-map again before its tokens expire), and a file written for longer than
that is stored whole (each lease renewal's write token reaches the pipeline, also in a
data-path worker process); tokens a benefactor refuses (a manager that lost its keys) are
asked for again. TLS manager, benefactors and mount, each its own process."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import blake3
import lmdb
import pytest

from tests import harness
from tests.conftest import fuse_available
from tests.harness import cli

MiB = 1 << 20
TTL_S = 3.0  # tokens and write leases (renewed every second)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[harness.Proc]]]:
    reason = fuse_available()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("fuse-tokens")
    tls = base / "tls"
    assert cli("certs", "init", "--dir", str(tls)).returncode == 0
    for name, extra in (("manager", []), ("benefactor", []), ("client", ["--allow-root"])):
        done = cli("certs", "issue", name, "--role", name, "--dir", str(tls), *extra)
        assert done.returncode == 0, done.stderr
    procs = base / "procs"
    manager = start_manager(base)
    started = [manager]
    try:
        for i in range(2):
            started.append(harness.start(f"benefactor-{i}", [
                "benefactor", "--data-dir", str(base / f"b{i}"), "--manager",
                manager.address, "--tls-dir", str(tls)], procs))
        deadline = time.monotonic() + 30
        while sum(b["alive"] for b in harness.cli_json(
                "status", "--manager", manager.address, "--tls-dir", str(tls),
                "--tls-name", "client")["benefactors"]) < 2:
            assert time.monotonic() < deadline, "the benefactors did not register"
            time.sleep(0.2)
        mounts = []
        for workers in ("0", "1"):
            mnt = base / f"mnt-{workers}"
            mnt.mkdir()
            started.append(harness.start(f"mount-{workers}", [
                "mount", str(mnt), "--manager", manager.address, "--tls-dir", str(tls),
                "--cache-mib", "16", "--datapath-workers", workers], procs))
            mounts.append(mnt)
        yield base, started
    finally:
        try:
            harness.stop_every(started)
        finally:
            for mnt in base.glob("mnt-*"):
                if os.path.ismount(mnt):
                    os.system(f"fusermount3 -u -z {mnt}")


def start_manager(base: Path, port: int = 0, ttl: float = TTL_S) -> harness.Proc:
    return harness.start("manager", [
        "manager", "--data-dir", str(base / "m"), "--tls-dir", str(base / "tls"),
        "--listen", f"127.0.0.1:{port}",
        "--chunker", "cdc:16384:65536:262144", "--replication", "1",
        "--heartbeat-interval", "0.25", "--write-lease", str(TTL_S),
        "--token-ttl", str(ttl), "--token-rotate", str(TTL_S)], base / "procs")


def restart_manager(base: Path, procs: list[harness.Proc], ttl: float,
                    lose_keys: bool) -> None:
    """Stop the manager, and start it again on its port, without its key file if
    LOSE_KEYS; wait until a benefactor heard of the new start."""
    old = procs[0]
    port = int(old.address.rpartition(":")[2])
    old.stop()
    if lose_keys:  # a new master secret: every key derived from it is new
        env = lmdb.open(str(base / "m" / "metadata.lmdb"), max_dbs=32)
        with env.begin(write=True, db=env.open_db(b"meta")) as txn:
            assert txn.replace(b"token_master", os.urandom(32)) is not None
        env.close()
    benefactors = [p for p in procs if p.name.startswith("benefactor")]
    heard = [p.log().count("manager 127.0.0.1") for p in benefactors]
    for proc in benefactors:
        proc.expected_noise.append(r"WARNING .*manager 127\.0\.0\.1:\d+ unreachable")
    procs[0] = start_manager(base, port, ttl)
    deadline = time.monotonic() + 30  # "reachable again" / "new keys" in their logs
    while any(p.log().count("manager 127.0.0.1") <= n for p, n in zip(benefactors, heard,
                                                                          strict=True)):
        assert time.monotonic() < deadline, "the benefactors did not see the new manager"
        time.sleep(0.1)
    time.sleep(1.0)  # a few heartbeats: the new keys are theirs


def data(seed: str, n: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=n)


@pytest.mark.parametrize("workers", ["0", "1"])
def test_fuse_reads_and_writes_outlive_their_tokens(
        cluster: tuple[Path, list[harness.Proc]], workers: str) -> None:
    base, procs = cluster
    mnt = base / f"mnt-{workers}"
    mount = next(p for p in procs if p.name == f"mount-{workers}")
    # Written over 2 token lifetimes, a MiB at a time: the puts of the last MiBs carry a
    # token of a lease renewal, not the one OpenWrite gave.
    content = data(f"slow-{workers}", 16 * MiB)
    with open(mnt / "slow", "wb") as f:
        for off in range(0, len(content), MiB):
            f.write(content[off:off + MiB])
            time.sleep(2 * TTL_S / 16)
    # Kept open past its tokens' life: 24 MiB, more than the 16 MiB chunk cache keeps.
    big = data(f"big-{workers}", 24 * MiB)
    (mnt / "big").write_bytes(big)
    with open(mnt / "big", "rb") as f:
        head = f.read(MiB)
        time.sleep(TTL_S + 0.5)
        rest = f.read()
    assert head + rest == big
    assert (mnt / "slow").read_bytes() == content
    assert "refused a read token" not in mount.log()  # renewed in time, not refused


def test_fuse_refused_tokens_are_asked_for_again(
        cluster: tuple[Path, list[harness.Proc]]) -> None:
    """A manager restarted with other keys (its token master secret replaced): the
    benefactors learn the new ones and refuse every token signed before; a reader of a
    file it keeps open asks for the block-map again and reads on."""
    base, procs = cluster
    mnt = base / "mnt-1"
    restart_manager(base, procs, ttl=600, lose_keys=False)  # tokens that live long
    content = data("restart", 40 * MiB)  # beyond the cache and the read-ahead window
    (mnt / "kept").write_bytes(content)
    with open(mnt / "kept", "rb") as f:
        head = f.read(64 << 10)
        restart_manager(base, procs, ttl=600, lose_keys=True)
        assert any("sent new keys only" in p.log() for p in procs[1:3])
        rest = f.read()
    assert head + rest == content
    mount = next(p for p in procs if p.name == "mount-1")
    assert "refused a read token" in mount.log()
