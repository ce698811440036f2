"""mosafs.checkpoint with tensors on a GPU (the device path: chunked and hashed on the GPU
where the tensors are, only new chunks copied to the host), against a real `mosafs up`:

- the file is byte for byte what safetensors writes for the same tensors, and its chunks
  are the mount's: the same bytes written through the mount afterwards send nothing;
- a save that changes a tenth of the tensors copies to the host exactly the new chunks'
  bytes, and sends them;
- a non-blocking save returns after its device-to-device snapshot: tensors changed at
  once do not reach the file; one that fails in the background (no benefactor in its
  folder's pool) reports the error through its handle and leaves the file as it was;
- an erasure-coded pool gets the parity computed on the GPU; the file reads back;
- `load(..., device="cuda")` gives the tensors back on the GPU;
- `prepare("cuda")` pays a process's one-time costs: a save after it pins nothing.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import UpCluster
from tests.gpu.conftest import GPU
from tests.harness import cli

pytestmark = GPU
MiB = 1 << 20
UP = ("--benefactors", "3", "--hash-backend", "gpu", "--chunker", "cdc:65536:262144:1048576")


@pytest.fixture
def torch() -> Any:
    return pytest.importorskip("torch", reason="torch is needed for GPU tensors")


@pytest.fixture
def up(start_cluster: Any) -> Iterator[UpCluster]:
    from mosafs.checkpoint.cluster import close_all

    cluster = start_cluster(*UP)
    try:
        yield cluster
    finally:
        close_all()


def state(torch: Any, seed: int) -> dict[str, Any]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = {f"layer{i}.w": torch.randn(512, 1024, device="cuda", generator=gen)
           for i in range(20)}
    out["emb"] = torch.randn(4096, 512, device="cuda", generator=gen).to(torch.bfloat16)
    out["step"] = torch.tensor([seed], device="cuda")
    return out


def host_bytes(torch: Any, tensors: dict[str, Any]) -> bytes:
    from safetensors.torch import save

    return save({k: v.cpu() for k, v in tensors.items()})


def test_gpu_checkpoint_file_chunks_and_dedupe(up: UpCluster, torch: Any,
                                               tmp_path: Path) -> None:
    from mosafs import checkpoint

    path = up.mountpoint / "gpu.safetensors"
    tensors = state(torch, 1)
    first = checkpoint.save(tensors, path)
    assert isinstance(first, checkpoint.SaveResult) and first.backend == "gpu"
    expected = host_bytes(torch, tensors)
    assert path.read_bytes() == expected
    assert first.bytes_hashed == len(expected)
    assert first.bytes_to_host == first.bytes_sent == len(expected)

    # A tenth of the tensors change: only their chunks leave the GPU.
    for i in (3, 11):
        tensors[f"layer{i}.w"].add_(1.0)
    second = checkpoint.save(tensors, path)
    assert isinstance(second, checkpoint.SaveResult)
    assert second.bytes_to_host == second.bytes_sent
    assert 0 < second.bytes_sent < len(expected) // 4, second
    assert path.read_bytes() == host_bytes(torch, tensors)

    # The mount makes the same chunks of the same bytes: nothing new to send.
    local = tmp_path / "copy.safetensors"
    local.write_bytes(host_bytes(torch, tensors))
    shutil.copyfile(local, path)
    stats = json.loads(cli("stats", str(path), "--json").stdout)
    assert stats["version"] == 3 and stats["new_bytes"] == 0, stats

    back = checkpoint.load(path, device="cuda")
    assert all(back[k].is_cuda and torch.equal(back[k], tensors[k]) for k in tensors)


def test_gpu_checkpoint_prepare_pays_the_first_saves_costs(up: UpCluster, torch: Any) -> None:
    """prepare() hashes scratch bytes on the GPU and pins the staging buffers; a save
    afterwards pins nothing more and writes the library's bytes."""
    from mosafs import checkpoint
    from mosafs.checkpoint.cluster import UPLOADS_PER_FILE
    from mosafs.checkpoint.device import GROUP_BYTES, STAGING

    figures = checkpoint.prepare("cuda")
    assert set(figures) == {"hash_s", "pin_s"} and figures["hash_s"] > 0, figures
    assert sum(len(b) >= GROUP_BYTES for b in STAGING._free) >= UPLOADS_PER_FILE
    path = up.mountpoint / "prepared.safetensors"
    tensors = state(torch, 5)
    result = checkpoint.save(tensors, path)
    assert isinstance(result, checkpoint.SaveResult)
    assert result.phases["pin_s"] == 0.0, result.phases
    assert path.read_bytes() == host_bytes(torch, tensors)


def test_gpu_checkpoint_non_blocking_snapshot(up: UpCluster, torch: Any) -> None:
    from mosafs import checkpoint

    path = up.mountpoint / "async.safetensors"
    tensors = state(torch, 2)
    expected = host_bytes(torch, tensors)
    handle = checkpoint.save(tensors, path, blocking=False)
    assert isinstance(handle, checkpoint.SaveHandle)
    for t in tensors.values():
        t.zero_()  # training goes on at once
    done = handle.wait(timeout=120)
    assert done.blocked_s < done.total_s
    assert path.read_bytes() == expected

    from mosafs.errors import NoSpace

    up.proc.expected_noise.append(r"opens for writing fail with ENOSPC: pool 'nowhere'")
    folder = up.mountpoint / "nowhere"
    folder.mkdir()
    assert cli("pool", "create", "nowhere", "--replication", "1").returncode == 0
    assert cli("pool", "assign", str(folder), "nowhere").returncode == 0
    import cupy

    pool = cupy.get_default_memory_pool()  # where the snapshot's copy lives
    before = pool.used_bytes()
    handle = checkpoint.save(tensors, folder / "async.safetensors", blocking=False)
    assert isinstance(handle, checkpoint.SaveHandle)
    with pytest.raises(NoSpace, match="nowhere"):
        handle.wait(timeout=120)
    assert isinstance(handle.exception(), NoSpace)
    # The failed handle does not hold the snapshot's device memory.
    assert pool.used_bytes() <= before, (pool.used_bytes(), before)
    assert not (folder / "async.safetensors").exists()
    assert path.read_bytes() == expected


def test_gpu_checkpoint_erasure_coded_pool(start_cluster: Any, torch: Any) -> None:
    from mosafs import checkpoint
    from mosafs.checkpoint.cluster import close_all

    up = start_cluster("--benefactors", "3", "--hash-backend", "gpu", "--redundancy",
                       "ec:2+1", "--ec-min-chunk", "16K", "--chunker",
                       "cdc:65536:262144:1048576")
    try:
        path = up.mountpoint / "coded.safetensors"
        tensors = state(torch, 3)
        result = checkpoint.save(tensors, path)
        assert isinstance(result, checkpoint.SaveResult)
        stats = json.loads(cli("stats", str(path), "--json").stdout)
        assert {r["redundancy"] for r in stats["redundancy"]} >= {"ec:2+1"}
        assert stats["fully_redundant"]
        assert (up.mountpoint / ".versions" / "coded.safetensors" / "1").read_bytes() == \
            host_bytes(torch, tensors)
    finally:
        close_all()
