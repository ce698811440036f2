"""Acceptance tests of the core path: `mosafs up`, a real mount, real manager and
benefactor processes, real LMDB and chunk files."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import blake3
import pytest

from mosafs import certs
from mosafs._proto import benefactor_pb2 as bpb
from mosafs._proto import benefactor_pb2_grpc as bgrpc
from mosafs._proto import manager_pb2 as mpb
from mosafs._proto import manager_pb2_grpc as mgrpc
from mosafs.rpc.channels import channel

MiB = 1 << 20


def incompressible(seed: str, n: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=n)


def edited(v1: bytes) -> bytes:
    """The second checkpoint: 1 MiB changed in the middle, 4 KiB inserted near the start."""
    mid = len(v1) // 2
    changed = v1[:mid] + incompressible("changed", MiB) + v1[mid + MiB:]
    at = 100 * 1024
    return changed[:at] + incompressible("inserted", 4096) + changed[at:]


def write_file(path: Path, data: bytes, piece: int = MiB) -> None:
    with open(path, "wb") as f:
        for off in range(0, len(data), piece):
            f.write(data[off:off + piece])


def mosafs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mosafs", *args], capture_output=True,
                          text=True, timeout=120)


def stats(path: Path) -> dict:  # type: ignore[type-arg]
    done = mosafs("stats", str(path), "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def read_version_directly(cluster, inode: int, version: int) -> bytes:  # type: ignore[no-untyped-def]
    """Reassemble an old version from its block-map and the benefactors, verifying ids
    (with the certificate `mosafs up` made for clients)."""
    client = certs.load(cluster.data_dir / "tls", "client")
    with channel(cluster.manager, client) as ch:
        bm = mgrpc.ManagerStub(ch).GetBlockMap(mpb.GetBlockMapRequest(inode=inode,
                                                                      version=version))
    addresses = {b.id: b.address for b in bm.benefactors}
    where = {loc.id: addresses[loc.benefactor_ids[0]] for loc in bm.locations}
    tokens = {loc.id: loc.token for loc in bm.locations}  # benefactors want them
    parts = []
    for ref in bm.chunks:
        with channel(where[ref.id], client) as ch:
            data = bgrpc.BenefactorStub(ch).GetChunk(
                bpb.GetChunkRequest(id=ref.id),
                metadata=(("mosafs-token-bin", tokens[ref.id]),)).data
        assert blake3.blake3(data).digest() == ref.id
        parts.append(data)
    return b"".join(parts)


def test_fuse_cdc_second_version_stores_little(start_cluster):
    cluster = start_cluster()
    path = cluster.mountpoint / "app.n0.ckpt"
    v1 = incompressible("checkpoint-1", 64 * MiB)
    write_file(path, v1)
    assert path.read_bytes() == v1
    cluster.wait_redundant()  # optimistic writes: the second copies come in the background
    stored_v1 = cluster.stored_bytes()
    assert stored_v1 >= len(v1)

    v2 = edited(v1)
    write_file(path, v2)
    assert path.read_bytes() == v2
    # Compare whole replicated states: right after the close, background replication may
    # already have copied some of the new chunks, or not.
    cluster.wait_redundant()
    added = cluster.stored_bytes() - stored_v1
    replication = 2  # `mosafs up`'s default R
    assert added <= replication * 0.15 * len(v1), \
        f"second version stored {added / replication / len(v1):.1%} of a copy"

    report = stats(path)
    assert report["version"] == 2
    assert report["size"] == len(v2)
    assert report["deduped_against"] == {"inode": report["inode"], "version": 1}
    assert report["shared_chunks"] >= report["chunks"] - 8
    assert report["new_bytes"] * replication == added
    # The first version is still there, byte-identical.
    assert read_version_directly(cluster, report["inode"], 1) == v1


def test_fuse_fixed_chunking_is_defeated_by_an_insertion(start_cluster):
    """With fixed-size chunks the 4 KiB insertion shifts every later chunk boundary, so
    nearly the whole second version is new: the expected ratio is about 1.0 (the only
    shared chunk is the one before the insertion point: chunk 0 starts at 0 and the
    insertion is at 100 KiB, inside it, so in practice nothing is shared)."""
    cluster = start_cluster("--chunker", "fixed:1048576")
    path = cluster.mountpoint / "app.n0.ckpt"
    v1 = incompressible("checkpoint-1", 64 * MiB)
    write_file(path, v1)
    stored_v1 = cluster.stored_bytes()
    v2 = edited(v1)
    write_file(path, v2)
    assert path.read_bytes() == v2
    ratio = (cluster.stored_bytes() - stored_v1) / len(v1)
    assert ratio >= 0.95, f"fixed-size chunking stored only {ratio:.1%} of a copy"
    assert stats(path)["shared_chunks"] == 0


def test_fuse_files_survive_restart(start_cluster, tmp_path):
    cluster = start_cluster()
    mnt = cluster.mountpoint
    (mnt / "ckpt").mkdir()
    (mnt / "ckpt" / "deep").mkdir()
    files = {
        "ckpt/a.bin": incompressible("a", 3 * MiB + 17),
        "ckpt/deep/b.bin": incompressible("b", 5000),
        "empty": b"",
        "top.txt": b"hello mosafs\n",
    }
    for name, data in files.items():
        write_file(mnt / name, data)
    cluster.stop()
    assert not any(Path(cluster.mountpoint).iterdir())

    again = start_cluster(data_dir=cluster.data_dir, name="up-again")
    for name, data in files.items():
        assert (again.mountpoint / name).read_bytes() == data, name
    assert sorted(os.listdir(again.mountpoint / "ckpt")) == ["a.bin", "deep"]


def test_fuse_corrupt_chunk_gives_eio_never_wrong_bytes(start_cluster):
    cluster = start_cluster(expected_noise=[r"WARNING .*corrupt", r"WARNING .*does not verify"])
    path = cluster.mountpoint / "victim"
    data = incompressible("victim", 2 * MiB)
    write_file(path, data)
    chunks = cluster.chunk_files()
    assert chunks, "no chunk file on any benefactor"
    for chunk in chunks:  # one copy of each chunk exists (R=1): corrupt them all
        raw = bytearray(chunk.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        chunk.write_bytes(bytes(raw))
    with pytest.raises(OSError) as info, open(path, "rb") as f:
        f.read()
    assert info.value.errno == errno.EIO


def test_fuse_stats_outside_a_mount_is_a_clear_error(tmp_path):
    outside = tmp_path / "plain"
    outside.write_bytes(b"x")
    done = mosafs("stats", str(outside))
    assert done.returncode != 0
    assert "not inside a mosafs mount" in done.stderr
    assert "Traceback" not in done.stderr
