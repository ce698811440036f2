"""torch.distributed.checkpoint with mosafs.checkpoint.torch against a real `mosafs up`
cluster: two rank processes (gloo on 127.0.0.1) save a state dict with replicated
tensors, a tensor of each rank's own, a DTensor sharded over both and values that are
not tensors, each rank through its own safetensors file; two new rank processes load it
into zeroed state dicts, save it again and load that. Checked from here:

- the folder holds `.metadata` and one file per rank, each a safetensors file the stock
  library reads through the mount, each rank's file holding its own tensors and shard,
  every replicated item saved once;
- each save is a version of each rank file; saving the same state again sends almost
  nothing (deduplicated against the last version);
- a load reads the versions `.metadata` names: a rank file saved over afterwards (a later
  save that died before its `.metadata`) changes nothing that loads; and a single process
  loads the sharded tensor whole (resharding, reading both files).
"""

from __future__ import annotations

import json
import os
import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import UpCluster
from tests.harness import cli

torch = pytest.importorskip("torch", reason="torch (CPU) is a test dependency")
safetensors = pytest.importorskip("safetensors", reason="safetensors is a test dependency")

import torch.distributed.checkpoint as dcp  # noqa: E402

from mosafs import checkpoint  # noqa: E402
from mosafs.checkpoint.cluster import close_all  # noqa: E402
from mosafs.checkpoint.torch import (  # noqa: E402
    MosafsStorageInfo,
    MosafsStorageReader,
    MosafsStorageWriter,
)
from tests.dcp_ranks import EXTRA, full_tensors, run_ranks  # noqa: E402

UP_ARGS = ("--benefactors", "3", "--chunker", "cdc:16384:65536:262144")
WORLD = 2
FILES = [f"__{rank}_0.safetensors" for rank in range(WORLD)]


@pytest.fixture
def cluster(start_cluster: Any) -> Iterator[UpCluster]:
    up = start_cluster(*UP_ARGS)
    try:
        yield up
    finally:
        close_all()  # this process's client, before the cluster stops


def stats(path: Path) -> dict[str, Any]:
    done = cli("stats", str(path), "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def check_reports(reports: list[dict[str, Any]], loads: int) -> None:
    """Every rank checked every leaf of its state dict, LOADS times, and none differed."""
    assert [r["rank"] for r in reports] == list(range(WORLD))
    for report in reports:
        assert len(report["checks"]) == loads, report
        for check in report["checks"]:
            assert check["bad"] == [], report
            assert {f"rank{report['rank']}.weight", f"rank{report['rank']}.tied"} <= set(
                check["checked"])
            assert {"model.sharded", "extra.step", "extra.lrs"} <= set(check["checked"])


def two_rank_scenario(mount: Path, workdir: Path, device: str) -> None:
    """Save with two ranks on DEVICE into a folder of MOUNT, check the folder, load and
    save again in two new ranks, check the versions; then the version pinning."""
    folder = mount / "runs" / "dcp"  # made by the ranks
    assert MosafsStorageWriter.validate_checkpoint_id(folder)
    assert not MosafsStorageReader.validate_checkpoint_id(workdir)  # not in a mount
    full = full_tensors(WORLD)
    check_reports(run_ranks("save", folder, workdir / "save", device=device), loads=0)

    assert sorted(os.listdir(folder)) == [".metadata", *FILES]  # no temporary left
    keys: list[set[str]] = []
    for rank, name in enumerate(FILES):
        with safetensors.safe_open(str(folder / name), framework="pt") as f:  # stock reader
            keys.append(set(f.keys()))
            for leaf in ("weight", "tied"):  # tied: one tensor under two names, stored twice
                assert torch.equal(f.get_tensor(f"rank{rank}.{leaf}"), full[f"rank{rank}.weight"])
            shard = f"model.sharded@{rank * 256},0"
            assert torch.equal(f.get_tensor(shard), full["model.sharded"].chunk(WORLD)[rank])
            assert f"rank{1 - rank}.weight" not in keys[rank]
        assert stats(folder / name)["version"] == 1
    # Replicated items (and the values) are saved by one rank each, not by both.
    replicated = {"model.replicated", "model.scale", "model.ids", "model.half",
                  "extra.step", "extra.name", "extra.lrs", "extra.betas"}
    assert not keys[0] & keys[1]
    assert replicated <= keys[0] | keys[1]
    with open(folder / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    infos = list(metadata.storage_data.values())
    assert all(isinstance(i, MosafsStorageInfo) and i.version == 1 for i in infos)
    assert {i.file for i in infos} == set(FILES)

    check_reports(run_ranks("reload", folder, workdir / "reload", device=device), loads=2)
    for name in FILES:
        again = stats(folder / name)
        assert again["version"] == 2, again
        assert again["new_bytes"] < again["size"] // 10, again  # the same bytes: deduped

    # A later save that died after rank 1 committed its file: the newest version of
    # __1_0 is junk, .metadata still names version 2, and a load reads version 2.
    junk = checkpoint.save({"junk": torch.ones(1000)}, folder / FILES[1])
    assert isinstance(junk, checkpoint.SaveResult) and junk.version == 3
    whole = {"model": {"sharded": torch.zeros(256 * WORLD, 512), "half": torch.zeros(300,
             dtype=torch.bfloat16)}, "rank1": {"weight": torch.zeros(256, 512)},
             "extra": {"lrs": [], "betas": ()}}
    with warnings.catch_warnings():  # dcp.load's notice that no process group is set up
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(whole, storage_reader=MosafsStorageReader(folder))
    assert torch.equal(whole["model"]["sharded"], full["model.sharded"])
    assert torch.equal(whole["model"]["half"], full["model.half"])
    assert torch.equal(whole["rank1"]["weight"], full["rank1.weight"])
    assert whole["extra"] == {"lrs": EXTRA["lrs"], "betas": EXTRA["betas"]}
    with safetensors.safe_open(str(folder / FILES[1]), framework="pt") as f:
        assert list(f.keys()) == ["junk"]  # what the pin stepped around


def test_fuse_checkpoint_dcp_two_gloo_ranks(cluster: UpCluster, tmp_path: Path) -> None:
    two_rank_scenario(cluster.mountpoint, tmp_path / "ranks", "cpu")
