"""Metadata backups kept in the cluster (`mosafs backup`) and a manager rebuilt from the
benefactors alone (`mosafs manager --recover`, docs/coordination.md, "Metadata backups").

Every manager is lost the way it happens: the cluster stopped and the manager's data
directory deleted. The benefactors and a new manager are then started by hand on the same
disks; the new manager finds the newest backup on the benefactors, and every version
committed before it reads back byte-identical. What was written after it is reported and
kept, not collected."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import blake3
import pytest

from mosafs.procutil import free_port
from tests import harness
from tests.conftest import UpCluster

MiB = 1 << 20
KEPT_NOISE = [r"WARNING mosafs\.manager\[\d+\]: \d+ blobs \(\d+ bytes\) on the benefactors "
              r"are newer than backup"]


def _data(seed: str, size: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=size)


@pytest.fixture
def by_hand(tmp_path: Path) -> Iterator[list[harness.Proc]]:
    """Processes a test starts by hand; stopped (noise checked) at the end."""
    procs: list[harness.Proc] = []
    try:
        yield procs
    finally:
        try:
            harness.stop_every(procs)
        finally:
            for mnt in tmp_path.glob("mnt-*"):
                if os.path.ismount(mnt):
                    os.system(f"fusermount3 -u -z {mnt}")


def test_fuse_recovery_from_the_newest_backup_after_every_manager_is_lost(
        start_cluster: Callable[..., UpCluster], tmp_path: Path,
        by_hand: list[harness.Proc]) -> None:
    # Small chunks: the backup of a small store spans many, and the next one shares some.
    cluster = start_cluster("--chunker", "cdc:4096:16384:65536")
    before = {f"model.0.{i}": _data(f"before {i}", 2 * MiB + i) for i in range(4)}
    for name, data in before.items():
        (cluster.mountpoint / name).write_bytes(data)
    for i in range(400):  # a store where one change leaves most pages as they were
        (cluster.mountpoint / f"small.{i}").write_bytes(_data(f"small {i}", 1000))
        before[f"small.{i}"] = _data(f"small {i}", 1000)
    first = harness.cli_json("backup", "--data-dir", str(cluster.data_dir))
    assert first["path"] == "/.mosafs/backups/metadata.lmdb" and first["version"] == 1
    assert first["benefactors"] == 3 and first["size"] > 0
    (cluster.mountpoint / "model.0.0").write_bytes(before["model.0.0"][::-1])  # a change
    before["model.0.0"] = before["model.0.0"][::-1]
    newest = harness.cli_json("backup", "--data-dir", str(cluster.data_dir))
    assert newest["version"] == 2 and newest["name"] > first["name"]
    assert newest["new_bytes"] < newest["size"]  # deduplicated against the first
    after = _data("after the backup", 3 * MiB)
    (cluster.mountpoint / "late.bin").write_bytes(after)
    benefactors = cluster.info["benefactors"]
    tls = cluster.data_dir / "tls"
    cluster.stop()
    shutil.rmtree(cluster.data_dir / "manager")  # every manager (there was one) is lost

    procs = tmp_path / "procs"
    port = free_port()
    for i, b in enumerate(benefactors):  # each on its disk and address, as a host keeps
        by_hand.append(harness.start(f"benefactor-{i}", [
            "benefactor", "--data-dir", b["data_dir"], "--manager", f"127.0.0.1:{port}",
            "--listen", b["address"], "--tls-dir", str(tls), "--tls-name",
            f"benefactor-{i}"], procs))
    addresses = ",".join(p.ready["address"] for p in by_hand)  # the benefactors
    rebuilt = tmp_path / "manager"
    manager = harness.start("manager", [
        "manager", "--data-dir", str(rebuilt), "--listen", f"127.0.0.1:{port}",
        "--tls-dir", str(tls), "--tls-name", "manager", "--recover", addresses], procs)
    manager.expected_noise = list(KEPT_NOISE)
    # Stopped last (the list is stopped from its end): a benefactor that outlives its
    # manager warns that it is unreachable.
    by_hand.insert(0, manager)
    report = json.loads((rebuilt / "recovery-report.json").read_text())
    assert report["backup"] == newest["name"] and report["seq"] == newest["seq"]
    assert sorted(report["benefactors"]) == sorted(addresses.split(","))
    # The late file's chunks (3 MiB, stored twice) are newer than the backup: kept.
    assert report["after_backup_bytes"] >= len(after)
    assert report["kept_in"] == f"/.mosafs/recovered/after-{newest['name']}"

    admin = ("--manager", f"127.0.0.1:{port}", "--tls-dir", str(tls), "--tls-name", "admin")
    harness.wait_for(lambda: sum(b["alive"] for b in harness.cli_json(
        "status", *admin)["benefactors"]) == len(benefactors), timeout=30,
        what="the benefactors to register with the rebuilt manager")
    mnt = tmp_path / "mnt-recovered"
    mnt.mkdir()
    by_hand.append(harness.start("mount", [
        "mount", str(mnt), "--manager", f"127.0.0.1:{port}", "--tls-dir", str(tls),
        "--tls-name", "client"], procs))
    for name, data in before.items():
        assert (mnt / name).read_bytes() == data, name
    assert not (mnt / "late.bin").exists()  # committed after the backup: its name is lost
    kept = mnt / ".mosafs" / "recovered" / f"after-{newest['name']}"
    assert kept.stat().st_size == report["after_backup_bytes"]
    assert harness.cli("fsck", *admin).returncode == 0
    versions = harness.cli_json("versions", str(mnt / "model.0.0"))
    assert len(versions["versions"]) == 2


def test_recover_refuses_a_data_directory_with_metadata_and_needs_a_backup(
        start_cluster: Callable[..., UpCluster], tmp_path: Path) -> None:
    cluster = start_cluster()
    (cluster.mountpoint / "f").write_bytes(b"x")
    address = cluster.info["benefactors"][0]["address"]
    tls = cluster.data_dir / "tls"
    common = ("manager", "--tls-dir", str(tls), "--tls-name", "manager", "--recover", address)
    done = harness.cli(*common, "--data-dir", str(tmp_path / "empty"))
    assert done.returncode != 0 and "no metadata backup is recorded" in done.stderr
    assert "Traceback" not in done.stderr
    cluster.stop()
    done = harness.cli(*common, "--data-dir", str(cluster.data_dir / "manager"))
    assert done.returncode == 2 and "holds metadata already" in done.stderr
