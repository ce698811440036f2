"""Fixtures shared by every test level."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import harness

# The test vectors of the design contract (docs/design.md), kept in the repository so that
# a clone tests itself; scripts/check_shared.sh checks them against a shared/ folder beside.
VECTORS_DIR = Path(__file__).resolve().parent / "vectors"
VECTORS = VECTORS_DIR / "chunking-v1.json"
ERASURE_VECTORS = VECTORS_DIR / "erasure-v1.json"


def fuse_available() -> str | None:
    """Why FUSE mounts cannot run here, or None when they can."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (apt-get install fuse3)"
    return None


@dataclass
class UpCluster:
    """A cluster started with `mosafs up` (the main job), as tests see it."""

    proc: harness.Proc
    mountpoint: Path
    data_dir: Path

    @property
    def manager(self) -> str:
        return str(self.proc.ready["manager"])

    @property
    def info(self) -> dict:  # type: ignore[type-arg]
        return self.proc.ready

    def chunk_files(self) -> list[Path]:
        return sorted(p for store in (self.data_dir / "benefactors").iterdir()
                      for p in harness.chunk_files(store))

    def stored_bytes(self) -> int:
        return harness.sizes(self.chunk_files())

    def wait_redundant(self) -> None:
        """Until background replication has given every chunk its R copies."""
        harness.wait_redundant("--data-dir", str(self.data_dir))

    def stop(self, check: bool = True) -> None:
        self.proc.stop(check=check, timeout=60)
        assert not os.path.ismount(self.mountpoint), "mosafs up left its mount behind"


def launch_up(tmp: Path, *args: str, data_dir: Path | None = None, name: str = "up",
              expected_noise: list[str] | None = None, cwd: Path | None = None) -> UpCluster:
    """`mosafs up TMP/mnt --data-dir DATA ARGS` (DATA: TMP/data), ready to use; run in CWD
    (default the tests' current directory)."""
    data = data_dir or tmp / "data"
    mnt = tmp / "mnt"
    proc = harness.start(name, ["up", str(mnt), "--data-dir", str(data), *args],
                         tmp / "procs", timeout=180, cwd=cwd)
    proc.expected_noise = list(expected_noise or [])
    logs = Path(args[args.index("--log-dir") + 1]) if "--log-dir" in args else data / "logs"
    proc.extra_logs = lambda: sorted(logs.glob("*.log"))
    return UpCluster(proc, mnt, data)


def stop_all(clusters: list[UpCluster]) -> None:
    """Stop every cluster (checking its logs for noise), unmount what is left, and fail
    with every noise found. The last started first: a cluster started again on an earlier
    one's data and mountpoint (a restart test) is stopped before the earlier one's
    mountpoint is looked at, or the leftover unmount would take the live cluster's mount
    from under it."""
    failures = []
    for cluster in reversed(clusters):
        if cluster.proc.alive() or cluster.proc.popen.returncode is None:
            try:
                cluster.stop()
            except AssertionError as exc:
                failures.append(str(exc))
        if os.path.ismount(cluster.mountpoint):
            os.system(f"fusermount3 -u -z {cluster.mountpoint}")
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="session", autouse=True)
def private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every process the tests start keeps its per-user state (the records of running
    `mosafs up`s) in a directory of the test session, never in the real user's."""
    state = tmp_path_factory.mktemp("xdg-state")
    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(state)
    yield state
    if before is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = before


@pytest.fixture
def start_cluster(tmp_path: Path) -> Iterator[Callable[..., UpCluster]]:
    """start_cluster(*up_args, data_dir=..., expected_noise=[...], cwd=...) -> UpCluster.

    Every cluster started is stopped at the end of the test; the test fails if `mosafs up`
    or any of its children logged a warning, an error or a traceback it did not expect.
    """
    reason = fuse_available()
    if reason:
        pytest.skip(reason)
    started: list[UpCluster] = []

    def start(*args: str, **kwargs: Any) -> UpCluster:
        started.append(launch_up(tmp_path, *args, **kwargs))
        return started[-1]

    try:
        yield start
    finally:
        stop_all(started)
