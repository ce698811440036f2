"""Pools and benefactor administration on a cluster of separate processes: a folder
assigned to a pool (W=2, R=1) puts its new chunks on that pool's benefactors only; raising
a pool's R re-replicates existing data; a drained benefactor's chunks are copied off, after
which it can be stopped and removed with nothing lost; a benefactor moves between pools."""

from __future__ import annotations

import time
from pathlib import Path

import blake3

from tests.cluster.conftest import Cluster, start_cluster
from tests.harness import chunk_files, cli, cli_json

MiB = 1 << 20


def chunk_names(directory: Path) -> set[str]:
    return {p.name for p in chunk_files(directory)}


def wait_copies(cluster: Cluster, dirs: list[Path], want: int, ids: set[str],
                timeout: float = 60) -> None:
    """Until every id of IDS has WANT copies among DIRS."""
    deadline = time.monotonic() + timeout
    while True:
        counts = {i: sum(i in chunk_names(d) for d in dirs) for i in ids}
        if all(n == want for n in counts.values()):
            return
        assert time.monotonic() < deadline, f"copies not at {want}: {sorted(counts.values())}"
        time.sleep(0.3)


def test_cluster_pools_placement_replication_drain_and_move(tmp_path: Path,
                                                            cluster_factory: list) -> None:
    cluster = start_cluster(tmp_path)  # manager (default pool R=2), benefactors b0..b2
    cluster_factory.append(cluster)
    manager = ("--manager", cluster.manager.address)
    created = cli_json("pool", "create", "fast", "--replication", "1", "--stripe-width", "2",
                       *manager)
    assert (created["replication"], created["stripe_width"]) == (1, 2)
    cluster.benefactor_args = ("--pool", "fast")
    cluster.start_benefactor(3)
    cluster.start_benefactor(4)
    default_dirs = [tmp_path / f"b{i}" for i in range(3)]
    fast_dirs = [tmp_path / "b3", tmp_path / "b4"]
    deadline = time.monotonic() + 30
    while sorted(cli_json("pool", "show", "fast", *manager)["benefactors"]) == []:
        assert time.monotonic() < deadline, "fast benefactors did not register"
        time.sleep(0.2)
    mnt = cluster.mount("mnt")

    # A folder assigned to the pool: its new chunks land on the pool's benefactors only.
    (mnt / "fast").mkdir()
    assigned = cli_json("pool", "assign", str(mnt / "fast"), "fast")
    assert assigned["effective"]["pool"] == "fast"
    before = set().union(*(chunk_names(d) for d in default_dirs))
    data = blake3.blake3(b"fast pool").digest(length=3 * MiB)
    (mnt / "fast" / "sub").mkdir()  # children inherit the pool
    (mnt / "fast" / "sub" / "x").write_bytes(data)
    on_fast = [chunk_names(d) for d in fast_dirs]
    assert all(on_fast), "W=2: both benefactors of the pool take chunks"
    assert not on_fast[0] & on_fast[1], "R=1: one copy of each chunk"
    assert set().union(*(chunk_names(d) for d in default_dirs)) == before
    assert (mnt / "fast" / "sub" / "x").read_bytes() == data

    # Raising R re-replicates existing data; lowering it back keeps working.
    (mnt / "plain").write_bytes(blake3.blake3(b"default pool").digest(length=2 * MiB))
    cluster.wait_redundant()
    plain = set().union(*(chunk_names(d) for d in default_dirs))
    assert cli_json("pool", "set", "default", "--replication", "3", *manager)["replication"] == 3
    wait_copies(cluster, default_dirs, 3, plain)
    assert cli("pool", "set", "default", "--replication", "2", *manager).returncode == 0

    # Drain b0: its chunks get R copies elsewhere; then it is stopped and removed.
    b0 = cluster.benefactors[0].ready["id"]
    drained = cli_json("benefactor", "drain", b0, "--timeout", "60", *manager)
    assert drained["done"] and drained["pending_chunks"] == 0 and drained["chunks"] > 0
    listed = {b["id"]: b for b in cli_json("benefactor", "list", *manager)["benefactors"]}
    assert listed[b0]["draining"]
    refused = cli("benefactor", "remove", b0, *manager)
    assert refused.returncode == 5 and "is alive" in refused.stderr
    cluster.benefactors[0].stop()
    cluster.wait_dead(b0)
    assert cli_json("benefactor", "remove", b0, *manager) == {"removed": b0}
    listed = {b["id"]: b for b in cli_json("benefactor", "list", *manager)["benefactors"]}
    assert b0 not in listed and len(listed) == 4
    status = cluster.wait_redundant()
    assert status["lost_chunks"] == 0
    wait_copies(cluster, default_dirs[1:], 2, plain)
    fresh = cluster.mount("fresh")
    assert (fresh / "plain").read_bytes() == (mnt / "plain").read_bytes()
    assert (fresh / "fast" / "sub" / "x").read_bytes() == data

    # Move a benefactor of the fast pool to the default pool.
    b4 = cluster.benefactors[4].ready["id"]
    moved = cli_json("benefactor", "move", b4, "default", *manager)
    assert moved["pool"] == "default"
    assert cli_json("pool", "show", "fast", *manager)["benefactors"] == [
        cluster.benefactors[3].ready["id"]]
    refused = cli("pool", "delete", "fast", *manager)
    assert refused.returncode == 5 and "still has benefactors" in refused.stderr
