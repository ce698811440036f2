"""A real `mosafs manager --map-size 2M` over gRPC, driven until its metadata is full:
creates get RESOURCE_EXHAUSTED (NoSpace: ENOSPC at a mount), unlink still works, the map
grew by itself to its ceiling, creates resume, and `mosafs fsck` is clean, all in one
manager process (no restart). tests/cluster/test_cluster_mapsize.py does it through a
FUSE mount."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mosafs._proto import benefactor_pb2, common_pb2
from mosafs._proto import manager_pb2 as pb
from mosafs._proto import manager_pb2_grpc as pb_grpc
from mosafs.errors import NoSpace
from mosafs.ids import chunk_id
from mosafs.rpc.channels import channel
from mosafs.rpc.errors import call
from tests import harness

ROOT = 1
MiB = 1 << 20
CHUNKS = 500  # a checkpoint's chunks
FULL = r"metadata store .* is full \(ceiling --map-size 2097152, reserve 262144 bytes\)"
PASSED = r"metadata map of .* grown from 2097152 to \d+ bytes .*passed for a deletion"


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[harness.Proc, pb_grpc.ManagerStub]]:
    proc = harness.start("manager", ["manager", "--data-dir", str(tmp_path / "data"),
                                     "--map-size", "2M"], tmp_path / "procs")
    # Once, when creates start to be refused; and an unlink may grow the map past the
    # ceiling (its copy-on-write pages did not fit in the reserve).
    proc.expected_noise = [FULL, PASSED]
    ch = channel(proc.address)
    try:
        yield proc, pb_grpc.ManagerStub(ch)
    finally:
        ch.close()
        proc.stop()
        assert proc.popen.returncode == 0, proc.log()


def test_full_metadata_refuses_creates_frees_on_unlink_and_grows_without_restart(
        manager: tuple[harness.Proc, pb_grpc.ManagerStub], tmp_path: Path) -> None:
    """Checkpoints of 500 chunks each fill the index. Unlinking one rewrites the 500 chunk
    records it named (their reference counts), which needs fresh pages in a full map:
    before the fix that was ENOSPC, and only a restart with a larger --map-size helped."""
    proc, stub = manager
    pid = proc.ready["pid"]

    def rpc(method: str, request: object) -> object:
        return call(getattr(stub, method), request, timeout=10)

    def create(name: str) -> int:
        reply = rpc("Create", pb.CreateRequest(parent=ROOT, name=name, mode=0o644))
        return int(reply.inode)  # type: ignore[attr-defined]

    def checkpoint(name: str, first: int) -> None:
        inode = create(name)
        opened = rpc("OpenWrite", pb.OpenWriteRequest(inode=inode, client_id="t"))
        ids = [chunk_id(b"%d" % n) for n in range(first, first + CHUNKS)]
        rpc("CommitVersion", pb.CommitVersionRequest(
            lease_id=opened.lease_id, inode=inode,  # type: ignore[attr-defined]
            chunks=[common_pb2.ChunkRef(id=c, length=4096) for c in ids],
            placements=[pb.ChunkPlacement(id=c, benefactor_ids=["bf-1"]) for c in ids]))

    info = benefactor_pb2.BenefactorInfo(id="bf-1", address="127.0.0.1:7101",
                                         capacity_bytes=10**12, free_bytes=10**11)
    rpc("RegisterBenefactor", pb.RegisterBenefactorRequest(info=info))
    names: list[str] = []
    with pytest.raises(NoSpace, match="--map-size") as full:
        for i in range(1000):
            checkpoint(f"ckpt.{i:04d}", i * CHUNKS)
            names.append(f"ckpt.{i:04d}")
    assert len(names) >= 5, full.value
    with pytest.raises(NoSpace, match="kept for deletions"):
        for i in range(100_000):  # small creates fill the rest, up to the reserve
            create(f"small.{i:06d}")
    # The status a mount turns into ENOSPC. A refusal above may have come from a full map
    # whose free pages an older reader still pinned (MapSizer.full); once that reader
    # ends, LMDB reuses them and creates are admitted again until the live pages reach the
    # reserve: on a loaded CI machine once a few more, once over a thousand. The map is
    # bounded, so creates are refused again in the end.
    with pytest.raises(grpc.RpcError) as refused:
        for i in range(100_000):
            stub.Create(pb.CreateRequest(parent=ROOT, name=f"one-more.{i}", mode=0o644),
                        timeout=10)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(NoSpace):  # the same for folders (reclaimed pages: as above, so
        for i in range(100_000):   # as many as it takes; the map is bounded)
            rpc("Mkdir", pb.MkdirRequest(parent=ROOT, name=f"dir.{i}", mode=0o755))

    # What keeps the cluster going or frees space goes on, without a restart.
    rpc("Heartbeat", pb.HeartbeatRequest(info=info))
    rpc("Rename", pb.RenameRequest(old_parent=ROOT, old_name=names[0], new_parent=ROOT,
                                   new_name="renamed"))
    rpc("Unlink", pb.UnlinkRequest(parent=ROOT, name="renamed"))
    for name in names[1:3]:
        rpc("Unlink", pb.UnlinkRequest(parent=ROOT, name=name))
    create("after-unlink")  # creates resume in the same process
    rpc("Mkdir", pb.MkdirRequest(parent=ROOT, name="dir", mode=0o755))
    assert proc.alive() and proc.ready["pid"] == pid

    log = proc.log()
    assert re.search(r"metadata map of .* grown from 1048576 to 2097152 bytes", log), log
    assert "has room again" in log
    data = tmp_path / "data" / "metadata.lmdb" / "data.mdb"
    assert data.stat().st_size > MiB  # the file went past the initial map: it did grow

    done = subprocess.run([sys.executable, "-m", "mosafs", "fsck", "--manager", proc.address,
                           "--insecure", "--json"], capture_output=True, text=True,
                          timeout=120, env={**os.environ})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["findings"] == [] and report["inodes"] >= 3, report
