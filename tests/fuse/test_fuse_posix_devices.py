"""Device nodes are kept in the manager's metadata (issue 16, point 11): block and
character nodes made through a real mount keep their type, numbers, mode and owner across
a restart of the whole cluster (`mosafs up` stopped and started again on the same data
directory), `mosafs fsck` finds nothing wrong with them, and `rm` removes them."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.conftest import UpCluster
from tests.harness import cli_json

NODES = {  # name: (file type bits, major, minor, permissions)
    "dev/null": (stat.S_IFCHR, 1, 3, 0o644),
    "dev/sda1": (stat.S_IFBLK, 8, 1, 0o640),
    "dev/ttyS0": (stat.S_IFCHR, 4, 64, 0o600),
}


def seen(mnt: Path) -> dict[str, tuple[int, int, int, int, int]]:
    """What lstat shows of every node: type bits, major, minor, permissions, uid."""
    out = {}
    for name in NODES:
        st = os.lstat(mnt / name)
        out[name] = (stat.S_IFMT(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev),
                     stat.S_IMODE(st.st_mode), st.st_uid)
    return out


def test_fuse_device_nodes_survive_a_cluster_restart(
        start_cluster: Callable[..., UpCluster]) -> None:
    cluster = start_cluster()
    mnt = cluster.mountpoint
    (mnt / "dev").mkdir()
    for name, (kind, major, minor, mode) in NODES.items():
        os.mknod(mnt / name, kind | mode, os.makedev(major, minor))
    os.chown(mnt / "dev/ttyS0", 0, 5)
    expected = {name: (kind, major, minor, mode, 0)
                for name, (kind, major, minor, mode) in NODES.items()}
    assert seen(mnt) == expected
    cluster.stop()

    again = start_cluster(data_dir=cluster.data_dir, name="up-again")
    assert seen(again.mountpoint) == expected
    assert os.lstat(again.mountpoint / "dev/ttyS0").st_gid == 5
    assert cli_json("fsck", str(again.mountpoint))["findings"] == []
    done = subprocess.run(["rm", *(str(again.mountpoint / n) for n in NODES)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert os.listdir(again.mountpoint / "dev") == []
    assert cli_json("fsck", str(again.mountpoint))["findings"] == []
