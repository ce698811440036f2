"""`mosafs up` from a directory that holds a folder named `mosafs` (issue 16): the directory
a user cloned into, say. `up` starts its children so that the current directory cannot
stand in for the package (python -P), so the cluster comes up there and serves files; and
`mosafs versions FILE | head` ends quietly."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from mosafs.cli import EXIT_BROKEN_PIPE
from tests.conftest import UpCluster


def _mosafs_command() -> list[str]:
    """The console script a user types, where the tests' interpreter has one."""
    script = Path(sys.executable).with_name("mosafs")
    return [str(script)] if script.exists() else [sys.executable, "-P", "-m", "mosafs"]


def _clone_parent(tmp_path: Path) -> Path:
    """A directory holding a checkout named mosafs: a folder without __init__.py."""
    where = tmp_path / "src"
    (where / "mosafs" / "docs").mkdir(parents=True)
    (where / "mosafs" / "README.md").write_text("# mosafs\n")
    return where


def test_fuse_up_from_a_directory_holding_a_mosafs_folder(
        tmp_path: Path, start_cluster: Callable[..., UpCluster]) -> None:
    cwd = _clone_parent(tmp_path)
    # The trap is real: there, `python -m mosafs` would import the folder, not the package.
    shadowed = subprocess.run([sys.executable, "-c", "import mosafs; print(mosafs.__file__)"],
                              cwd=cwd, capture_output=True, text=True, timeout=60)
    assert shadowed.stdout.strip() == "None", shadowed.stdout + shadowed.stderr

    up = start_cluster("--benefactors", "2", cwd=cwd)
    path = up.mountpoint / "app.n0.ckpt"
    contents = [os.urandom(300_000) for _ in range(3)]
    for data in contents:  # three versions of one file
        path.write_bytes(data)
    assert path.read_bytes() == contents[-1]

    versions = subprocess.run([*_mosafs_command(), "versions", str(path)], cwd=cwd,
                              capture_output=True, text=True, timeout=60)
    assert versions.returncode == 0, versions.stderr
    rows = [line.split()[0] for line in versions.stdout.splitlines()[1:]]
    assert rows == ["1", "2", "3"], versions.stdout

    # `mosafs versions FILE | head`, the reader gone before the first line: no message.
    proc = subprocess.Popen([*_mosafs_command(), "versions", str(path)], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    with proc.stderr:
        stderr = proc.stderr.read().decode()
    assert (proc.wait(timeout=60), stderr) == (EXIT_BROKEN_PIPE, "")
