"""Garbage collection and reconciliation with real processes (manager with a 1 s grace
period, three benefactors with R=2, a mount). Chunks whose last reference goes are
collected by the manager without any inventory round; inventory rounds are forced with
`mosafs gc`, the periodic ones an hour apart so that the tests decide when rounds run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import blake3

from mosafs._proto import manager_pb2 as mpb
from mosafs._proto import manager_pb2_grpc as mgrpc
from mosafs.rpc.channels import channel
from tests.cluster.conftest import Cluster, start_cluster
from tests.harness import chunk_files

MiB = 1 << 20
GRACE_S = 1.0


def _data(seed: int, size: int) -> bytes:
    return blake3.blake3(seed.to_bytes(8, "little")).digest(length=size)


def _start(cluster_factory: list[Cluster], base: Path) -> Cluster:
    cluster = start_cluster(base, "--gc-grace", str(GRACE_S),
                            benefactor_args=("--inventory-interval", "3600"))
    cluster_factory.append(cluster)
    return cluster


def _gc(cluster: Cluster) -> dict:  # type: ignore[type-arg]
    out = subprocess.run(
        [sys.executable, "-m", "mosafs", "gc", "--manager", cluster.manager.address, "--json"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = dict(json.loads(out.stdout))
    assert report["benefactors"] == sum(p.alive() for p in cluster.benefactors)
    return report


def _collect_after_grace(cluster: Cluster) -> dict:  # type: ignore[type-arg]
    _gc(cluster)  # sightings start
    time.sleep(GRACE_S + 0.2)
    return _gc(cluster)


def test_cluster_gc_deletes_the_chunks_of_a_removed_file_only(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    """Without any inventory round: the manager finds the chunks as they lose their last
    reference and asks their benefactors to delete them once the grace period is over."""
    cluster = _start(cluster_factory, tmp_path)
    mnt = cluster.mount("mnt")
    kept, gone = _data(1, 3 * MiB), _data(2, 3 * MiB)
    (mnt / "kept").write_bytes(kept)
    (mnt / "gone").write_bytes(gone)
    cluster.wait_redundant()
    before = cluster.chunk_copies()

    first = _gc(cluster)
    assert first["deleted_chunks"] == 0  # everything is referenced
    (mnt / "gone").unlink()
    unlinked = time.monotonic()
    deadline = unlinked + 30
    while True:
        after = cluster.chunk_copies()
        if len(after) < len(before) and cluster.status()["chunks"] == len(after):
            break
        assert time.monotonic() < deadline, "the removed file's chunks were not collected"
        time.sleep(0.1)
    assert time.monotonic() - unlinked >= GRACE_S, "collected within the grace period"
    deleted = set(before) - set(after)
    assert len(deleted) >= 2
    assert all(after[c] == 2 for c in after), "kept chunks lost a copy"
    status = cluster.status()
    assert status["under_replicated_chunks"] == 0
    gc = status["garbage_collection"]
    assert gc["waiting_chunks"] == 0 and gc["collected_chunks"] == len(deleted)
    assert gc["deleted_blobs"] == sum(before[c] for c in deleted)
    assert gc["freed_bytes"] >= 2 * 3 * MiB - 2 * 64 * 1024  # both copies of `gone`
    assert (mnt / "kept").read_bytes() == kept
    assert _gc(cluster)["deleted_chunks"] == 0  # nothing was left for the rounds
    assert cluster.chunk_copies() == after


WRITER = """
import sys
data = open(sys.argv[2], "rb").read()
with open(sys.argv[1], "wb") as f:
    f.write(data[:10 << 20])
    print("written", flush=True)
    sys.stdin.readline()
    f.write(data[10 << 20:])
print("closed", flush=True)
"""


def test_cluster_gc_spares_the_chunks_of_a_write_in_flight(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    cluster = _start(cluster_factory, tmp_path)
    mnt = cluster.mount("mnt")
    data = _data(3, 12 * MiB)
    (tmp_path / "src").write_bytes(data)
    # The writer is its own process: a child forked by this one would close (and so
    # flush, which commits) an inherited descriptor of the file.
    with subprocess.Popen([sys.executable, "-c", WRITER, str(mnt / "big"),
                           str(tmp_path / "src")], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as writer:
        assert writer.stdout is not None and writer.stdin is not None
        try:
            assert writer.stdout.readline().strip() == "written"
            deadline = time.monotonic() + 30
            while not cluster.chunk_copies():  # the window's first batches are stored
                assert time.monotonic() < deadline, "nothing uploaded while writing"
                time.sleep(0.05)
            uploaded = cluster.chunk_copies()
            report = _collect_after_grace(cluster)
            assert report["deleted_chunks"] == 0
            assert report["waiting_chunks"] >= len(uploaded)
            assert set(uploaded) <= set(cluster.chunk_copies())
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "closed"
        finally:
            writer.kill()
    assert (mnt / "big").read_bytes() == data
    cluster.wait_redundant()
    assert _collect_after_grace(cluster)["deleted_chunks"] == 0
    fresh = cluster.mount("mnt2")
    assert (fresh / "big").read_bytes() == data


def test_cluster_gc_rewriting_a_deleted_file_keeps_it(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    """A file removed and written again with the same bytes while its chunks wait for
    collection: the writer stores them again (the index calls them absent), which spares
    them, and the new file reads back whole after the round."""
    cluster = _start(cluster_factory, tmp_path)
    mnt = cluster.mount("mnt")
    data = _data(4, 4 * MiB)
    (mnt / "f").write_bytes(data)
    cluster.wait_redundant()
    (mnt / "f").unlink()
    _gc(cluster)  # the chunks are seen unreferenced
    time.sleep(GRACE_S + 0.2)
    (mnt / "g").write_bytes(data)
    _gc(cluster)
    fresh = cluster.mount("mnt2")
    assert (fresh / "g").read_bytes() == data
    assert cluster.wait_redundant()["lost_chunks"] == 0


def test_cluster_returning_benefactor_copies_count_again(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    cluster = _start(cluster_factory, tmp_path)
    mnt = cluster.mount("mnt")
    (mnt / "f").write_bytes(_data(5, 3 * MiB))
    cluster.wait_redundant()
    victim = cluster.benefactors[2]
    bid = victim.ready["id"]
    held = [bytes.fromhex(p.name) for p in chunk_files(tmp_path / "b2")]
    assert held
    victim.expected_noise = [".*"]
    victim.kill(signal.SIGKILL)
    cluster.wait_dead(bid)
    cluster.wait_redundant()  # copies made elsewhere; the index still names the victim
    cluster.start_benefactor(2)  # registers, then reports its inventory
    deadline = time.monotonic() + 30
    with channel(cluster.manager.address) as ch:
        stub = mgrpc.ManagerStub(ch)
        while True:
            reply = stub.LocateChunks(mpb.LocateChunksRequest(ids=held), timeout=30)
            holders = [list(loc.benefactor_ids) for loc in reply.locations]
            if len(holders) == len(held) and all(bid in h for h in holders):
                break
            assert time.monotonic() < deadline, f"copies of {bid} not counted: {holders}"
            time.sleep(0.2)
    assert cluster.status()["under_replicated_chunks"] == 0
