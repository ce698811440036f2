"""`mosafs up --managers 2` (docs/standby.md): what `close()` acknowledged survives the
loss of the active manager's process and disk, because a standby had it on its own disk
before the close returned."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Callable

import blake3

from tests import harness
from tests.conftest import UpCluster

MiB = 1 << 20
# What the active manager's SIGKILL makes the others say; both `up`s share the log files.
KILLED = [r"manager exited with status -9; stopping the cluster",
          r"WARNING mosafs\.benefactor\[\d+\]: manager 127\.0\.0\.1:\d+ unreachable",
          r"WARNING mosafs\.rpc\.follow\[\d+\]: following 127\.0\.0\.1:\d+: failed to connect"]


def _data(seed: str, size: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=size)


def test_fuse_closed_files_survive_the_active_managers_disk_through_its_standby(
        start_cluster: Callable[..., UpCluster]) -> None:
    cluster = start_cluster("--managers", "2", expected_noise=KILLED)
    files = {f"ckpt.{i}": _data(f"standby {i}", 3 * MiB + i) for i in range(6)}
    for name, data in files.items():
        with open(cluster.mountpoint / name, "wb") as f:
            for off in range(0, len(data), MiB):
                f.write(data[off:off + MiB])
    (cluster.mountpoint / "ckpt.0").write_bytes(b"second version")
    files["ckpt.0"] = b"second version"
    ready = json.loads((cluster.data_dir / "run" / "manager.ready.json").read_text())
    assert cluster.info["managers"][0].endswith(ready["address"])  # the active one
    os.kill(ready["pid"], signal.SIGKILL)
    assert cluster.proc.popen.wait(timeout=120) == 1  # up stops when its manager dies
    # The active manager's disk is lost; its standby's copy takes its place.
    shutil.rmtree(cluster.data_dir / "manager")
    os.rename(cluster.data_dir / "manager-1", cluster.data_dir / "manager")
    again = start_cluster(data_dir=cluster.data_dir, expected_noise=KILLED)
    for name, data in files.items():
        assert (again.mountpoint / name).read_bytes() == data, name
    versions = harness.cli_json("versions", str(again.mountpoint / "ckpt.0"))
    assert len(versions["versions"]) == 2
    assert harness.cli("fsck", str(again.mountpoint)).returncode == 0
