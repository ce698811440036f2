"""mosafs.checkpoint on CPU tensors against a real `mosafs up` cluster (mutual TLS, the
library finding the cluster and certificates from the mount, as the admin commands do):

- the file a save makes is, read through the mount, byte for byte what safetensors writes
  for the same tensors (numpy and torch), stock `safetensors.safe_open` reads it there,
  and `load` / `load_numpy` give the tensors back;
- saves are versions of the path, deduplicated against the previous one (a save that
  changes one tensor sends a fraction of the file), and against files written through the
  mount: the same bytes written by `cp` after a save send nothing (the same chunk ids);
- a non-blocking save returns a handle at once; the tensors changed right after do not
  reach the file; the handle reports the figures; a save that fails in the background
  (its folder's pool has no benefactor) reports the error through the handle and leaves
  the previous version as it was, and one that failed to make a new file leaves none;
- pruning policies prune saved series like any file;
- bad input (non-contiguous or shared tensors, a path outside every mount, a folder)
  is refused with a clear error and writes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mosafs import checkpoint
from mosafs.checkpoint.cluster import close_all
from mosafs.errors import ConfigError, InvalidArgument, IsADirectory, NoSpace
from tests.conftest import UpCluster, fuse_available, launch_up, stop_all
from tests.harness import cli, scrape

MiB = 1 << 20
UP_ARGS = ("--benefactors", "3", "--chunker", "cdc:16384:65536:262144")

safetensors_numpy = pytest.importorskip("safetensors.numpy",
                                        reason="safetensors is a test dependency")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpCluster]:
    """One cluster for the module (each test works in a folder of its own)."""
    reason = fuse_available()
    if reason:
        pytest.skip(reason)
    up = launch_up(tmp_path_factory.mktemp("checkpoint"), *UP_ARGS)
    try:
        yield up
    finally:
        close_all()  # the library's client threads, before the cluster stops
        stop_all([up])


@pytest.fixture
def folder(cluster: UpCluster, request: pytest.FixtureRequest) -> Path:
    path = cluster.mountpoint / request.node.name.removeprefix("test_fuse_checkpoint_")[:60]
    path.mkdir()
    return path


def state(seed: int, tensors: int = 8, size: int = 256 * 1024) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {
        f"layer{i}.weight": rng.standard_normal(size // 4, dtype=np.float32).reshape(-1, 64)
        for i in range(tensors)}
    out["step"] = np.array([seed], dtype=np.int64)
    out["mask"] = rng.integers(0, 2, size=100).astype(bool)
    out["half"] = rng.standard_normal(33).astype(np.float16)
    return out


def stats(path: Path) -> dict[str, Any]:
    done = cli("stats", str(path), "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_fuse_checkpoint_numpy_files_are_safetensors_versions_deduplicated(
        cluster: UpCluster, folder: Path, tmp_path: Path) -> None:
    from mosafs.rpc import security

    path = folder / "model.safetensors"
    first = state(1)
    identity = security.current()
    result = checkpoint.save(first, path, metadata={"step": "1"})
    # The library's certificate went to its own channels: the process keeps its identity.
    assert security.current() is identity
    assert isinstance(result, checkpoint.SaveResult)
    expected = safetensors_numpy.save(first, metadata={"step": "1"})
    assert path.read_bytes() == expected
    assert result.version == 1 and result.size == len(expected)
    assert result.bytes_hashed == len(expected) and result.bytes_sent == len(expected)
    with safetensors_numpy.safe_open(str(path), framework="np") as f:  # stock reader
        assert f.metadata() == {"step": "1"}
        assert np.array_equal(f.get_tensor("layer3.weight"), first["layer3.weight"])

    # One tensor of eight changes: a new version that sends a fraction of the file.
    second = dict(first)
    second["layer5.weight"] = first["layer5.weight"] + 1
    again = checkpoint.save(second, path, metadata={"step": "1"})
    assert isinstance(again, checkpoint.SaveResult)
    assert again.version == 2
    assert 0 < again.bytes_sent < len(expected) // 2, again
    assert path.read_bytes() == safetensors_numpy.save(second, metadata={"step": "1"})
    back = checkpoint.load_numpy(path)
    assert back.keys() == second.keys()
    # The benefactors are on this host: every byte came from their files (local reads),
    # and the new chunks went to them as memory files (local puts), none through gRPC.
    came: dict[str, Any] = {}
    checkpoint.load(path, figures=came)
    assert came["local_bytes"] == len(expected) and came["network_bytes"] == 0, came
    calls: dict[str, float] = {}
    for url in cluster.info["metrics"]["benefactors"].values():
        for key, value in scrape(url).items():
            if key.startswith("mosafs_benefactor_put_calls_total"):
                calls[key] = calls.get(key, 0.0) + value
    assert calls.get("mosafs_benefactor_put_calls_total{method=local}", 0) > 0, calls
    assert not calls.get("mosafs_benefactor_put_calls_total{method=PutChunks}"), calls
    assert all(np.array_equal(back[k], second[k]) and back[k].dtype == second[k].dtype
               for k in second)
    versions = json.loads(cli("versions", str(path), "--json").stdout)
    assert [v["version"] for v in versions["versions"]] == [1, 2]

    # The same bytes written through the mount: every chunk deduplicated (same ids).
    local = tmp_path / "copy.safetensors"
    local.write_bytes(safetensors_numpy.save(second, metadata={"step": "1"}))
    shutil.copyfile(local, path)
    copied = stats(path)
    assert copied["version"] == 3 and copied["new_bytes"] == 0, copied
    # ... and the other way round: a file written through the mount, saved again.
    other = folder / "other.safetensors"
    other.write_bytes(safetensors_numpy.save(first))
    resaved = checkpoint.save(first, other)
    assert isinstance(resaved, checkpoint.SaveResult)
    assert resaved.version == 2 and resaved.bytes_sent == 0


def test_fuse_checkpoint_torch_cpu_blocking_and_not(folder: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch (CPU) is a test dependency")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    gen = torch.Generator().manual_seed(3)
    tensors = {
        "w": torch.randn(300, 257, generator=gen),
        "b16": torch.randn(1000, generator=gen).to(torch.bfloat16),
        "flags": torch.rand(77, generator=gen) > 0.5,
        "scalar": torch.tensor(7, dtype=torch.int32),
        "empty": torch.zeros(0, 4),
    }
    path = folder / "torch.safetensors"
    checkpoint.save(tensors, path)
    assert path.read_bytes() == safetensors_torch.save(tensors)
    back = checkpoint.load(path)
    assert back.keys() == tensors.keys()
    assert all(torch.equal(back[k], tensors[k]) and back[k].dtype == tensors[k].dtype
               for k in tensors)

    # Non-blocking: the handle comes back before the save is done; the tensors changed
    # at once do not reach the file.
    expected = safetensors_torch.save(tensors)
    handle = checkpoint.save(tensors, path, blocking=False)
    assert isinstance(handle, checkpoint.SaveHandle)
    tensors["w"].add_(1.0)
    done = handle.wait(timeout=120)
    assert handle.done() and done.version == 2
    assert done.blocked_s <= done.total_s
    assert path.read_bytes() == expected


def test_fuse_checkpoint_loads_another_writer_s_unaligned_tensors(folder: Path) -> None:
    """The format does not ask a tensor to start at a multiple of its element size: a
    file written through the mount by another writer, an F32 right after 3 bytes of U8,
    loads as the library reads it."""
    torch = pytest.importorskip("torch", reason="torch (CPU) is a test dependency")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    header = {"a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
              "b": {"dtype": "F32", "shape": [2, 2], "data_offsets": [3, 19]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    data = (struct.pack("<Q", len(text)) + text + bytes([1, 2, 3])
            + np.array([1.5, -2.5, 3.25, 1e30], dtype="<f4").tobytes())
    path = folder / "other.safetensors"
    path.write_bytes(data)
    expected = safetensors_torch.load(data)
    back = checkpoint.load(path)
    assert back.keys() == expected.keys()
    assert all(torch.equal(back[k], expected[k]) for k in expected)
    back_np = checkpoint.load_numpy(path)
    assert all(np.array_equal(back_np[k], expected[k].numpy()) for k in expected)


def test_fuse_checkpoint_non_blocking_failure_reaches_the_handle(cluster: UpCluster,
                                                                 folder: Path) -> None:
    path = folder / "model.safetensors"
    first = state(1, tensors=2)
    checkpoint.save(first, path)
    # The folder moves to a pool without benefactors: the next write cannot be placed,
    # which the save finds only in the background, after it returned its handle.
    cluster.proc.expected_noise.append(r"opens for writing fail with ENOSPC: pool 'nowhere'")
    assert cli("pool", "create", "nowhere", "--replication", "1").returncode == 0
    assert cli("pool", "assign", str(folder), "nowhere").returncode == 0
    handle = checkpoint.save(state(2, tensors=2), path, blocking=False)
    assert isinstance(handle, checkpoint.SaveHandle)
    with pytest.raises(NoSpace, match="nowhere"):
        handle.wait(timeout=120)
    assert handle.done() and isinstance(handle.exception(), NoSpace)
    assert path.read_bytes() == safetensors_numpy.save(first)
    assert np.array_equal(checkpoint.load_numpy(path)["step"], [1])
    # A save that would have made a new file leaves none behind.
    with pytest.raises(NoSpace, match="nowhere"):
        checkpoint.save(first, folder / "new.safetensors")
    assert sorted(os.listdir(folder)) == ["model.safetensors"]


def test_fuse_checkpoint_series_are_pruned_by_policy(folder: Path) -> None:
    assert cli("policy", "set", str(folder), "--keep-last", "2").returncode == 0
    for step in range(1, 5):
        checkpoint.save(state(step, tensors=2), folder / f"model.rank0.{step}")
    assert sorted(os.listdir(folder)) == ["model.rank0.3", "model.rank0.4"]
    assert np.array_equal(checkpoint.load_numpy(folder / "model.rank0.4")["step"], [4])


def test_fuse_checkpoint_refuses_bad_input_and_writes_nothing(folder: Path,
                                                             tmp_path: Path) -> None:
    mnt = folder
    base = np.arange(64, dtype=np.float32).reshape(8, 8)
    with pytest.raises(InvalidArgument, match="not C-contiguous"):
        checkpoint.save({"t": base.T}, mnt / "a.safetensors")
    with pytest.raises(InvalidArgument, match="share memory"):
        checkpoint.save({"a": base[:4], "b": base[2:]}, mnt / "a.safetensors")
    with pytest.raises(InvalidArgument, match="cannot be stored"):
        checkpoint.save({"o": np.array(["x"], dtype=object)}, mnt / "a.safetensors")
    with pytest.raises(InvalidArgument, match="strings"):
        checkpoint.save({"a": base}, mnt / "a.safetensors", metadata={"n": 1})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="not inside a mosafs mount"):
        checkpoint.save({"a": base}, tmp_path / "local.safetensors")
    (mnt / "dir").mkdir()
    with pytest.raises(IsADirectory):
        checkpoint.save({"a": base}, mnt / "dir")
    assert sorted(os.listdir(mnt)) == ["dir"]
    assert not (tmp_path / "local.safetensors").exists()
