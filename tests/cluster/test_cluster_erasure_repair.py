"""Repair, drain and conversion of erasure-coded pools with real processes
(docs/erasure_pools.md, "Repair", "Drain", "Conversion"): a manager, benefactors and
mounts, each its own process; failures are SIGKILLs, damage is done to the files on disk,
and every check of redundancy reads the benefactors' disks, never the manager's word alone.

- The fault target (issue 19): an ec:4+2 pool over seven benefactors, two SIGKILLed while
  a series of versions of a multi-chunk file is written through a mount: every closed
  version reads back byte-identical; after the first death the survivors rebuild the dead
  one's fragments by themselves; with five left (fewer than K+M: no layout of six
  distinct fragments exists) the writes leave holes; the second daemon restarted on its
  disk, as its supervisor does (deploy/systemd: Restart=on-failure), and full redundancy
  comes back without an operator.
- Holes of optimistic writes filled when benefactors return; a corrupted fragment file
  found by `mosafs scrub` and rebuilt; a drain that moves fragments off and completes,
  and `benefactor remove` without --force.
- Conversion replicas:2 -> ec:4+2 -> replicas:3: every file byte-identical throughout,
  `mosafs status` shows the progress to completion, the old layout's blobs are collected.
- TLS with chunk access tokens: a conversion (whole copies read from peers) and a rebuild
  (fragments read from peers) with the read tokens the manager signs for the benefactor.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest

from mosafs._proto import manager_pb2 as mpb
from mosafs._proto import manager_pb2_grpc as mgrpc
from mosafs.admin.cluster import status_report
from mosafs.certs import load
from mosafs.rpc.channels import channel
from tests import harness
from tests.cluster.conftest import LEASE_S, Cluster, start_cluster, stop_cluster
from tests.conftest import fuse_available
from tests.harness import cli, cli_json

KiB = 1 << 10
MiB = 1 << 20
EC_CHUNKER = "cdc:65536:262144:1048576"
MIN_CODED = 64 * KiB
GRACE_S = 1.0


def _data(seed: str, size: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=size)


def _step(step: int, size: int = 2 * MiB) -> bytes:
    """Version STEP of a checkpoint: the same base with one region rewritten per step."""
    data = bytearray(_data("base", size))
    start = (step * 397 * KiB) % (size - 256 * KiB)
    data[start:start + 256 * KiB] = _data(f"step {step}", 256 * KiB)
    return bytes(data)


def _ec_cluster(cluster_factory: list[Cluster], base: Path, *, benefactors: int = 7,
                redundancy: str = "ec:4+2") -> Cluster:
    # No background scrub and rare inventories: the tests decide when those run.
    cluster = start_cluster(base, "--gc-grace", str(GRACE_S), benefactors=benefactors,
                            benefactor_args=("--inventory-interval", "3600",
                                             "--scrub-rate", "0"))
    cluster_factory.append(cluster)
    cli_json("pool", "set", "default", "--redundancy", redundancy, "--ec-min-chunk", "64K",
             "--stripe-width", str(benefactors), "--chunker", EC_CHUNKER,
             "--manager", cluster.manager.address)
    return cluster


def _ids(cluster: Cluster) -> dict[str, int]:
    return {p.ready["id"]: i for i, p in enumerate(cluster.benefactors)}


def _blob(cluster: Cluster, index: int, blob_id: bytes) -> Path:
    name = blob_id.hex()
    return cluster.base / f"b{index}" / "chunks" / name[:2] / name[2:4] / name


def _locations(cluster: Cluster, path: Path,
               identity: Any = None) -> list[mpb.ChunkLocation]:
    """The chunk locations of every version of the file at PATH (IDENTITY: the TLS
    identity to ask the manager with; None: plaintext)."""
    ino = os.stat(path).st_ino
    out: dict[bytes, mpb.ChunkLocation] = {}
    with channel(cluster.manager.address, identity) as ch:
        stub = mgrpc.ManagerStub(ch)
        for v in stub.ListVersions(mpb.ListVersionsRequest(inode=ino), timeout=30).versions:
            bm = stub.GetBlockMap(mpb.GetBlockMapRequest(inode=ino, version=v.version),
                                  timeout=30)
            lengths = {c.id: c.length for c in bm.chunks}
            for loc in bm.locations:
                loc.length = lengths[loc.id]
                out[loc.id] = loc
    return list(out.values())


def _check_redundant(cluster: Cluster, locations: list[mpb.ChunkLocation], *,
                     k: int = 4, m: int = 2, copies: int = 3) -> None:
    """On the disks: every coded chunk has K+M fragments on K+M distinct live
    benefactors, each file hashing to its id; every other chunk COPIES whole copies."""
    ids = _ids(cluster)
    alive = {bid for bid, i in ids.items() if cluster.benefactors[i].alive()}
    coded = 0
    for loc in locations:
        if loc.length >= MIN_CODED and k:
            assert (loc.ec_k, loc.ec_m) == (k, m), loc
            holders = list(loc.fragment_holders)
            assert all(holders) and len(set(holders)) == k + m, holders
            assert set(holders) <= alive, f"a dead holder is still named: {holders}"
            for fid, holder in zip(loc.fragment_ids, holders, strict=True):
                blob = _blob(cluster, ids[holder], fid)
                assert blake3.blake3(blob.read_bytes()).digest() == fid, blob
            coded += 1
        else:
            assert not loc.ec_k, loc
            holders = [b for b in loc.benefactor_ids if b in alive]
            assert len(set(holders)) >= copies, loc
            for holder in holders:
                blob = _blob(cluster, ids[holder], loc.id)
                assert blake3.blake3(blob.read_bytes()).digest() == loc.id, blob
    assert coded or not k


def _versions(mnt: Path, name: str) -> list[bytes]:
    """Every version of MNT/NAME, oldest first (the .versions view)."""
    where = mnt / ".versions" / name
    return [(where / v).read_bytes() for v in sorted(os.listdir(where), key=int)]


def _status(cluster: Cluster, identity: Any = None) -> dict[str, Any]:
    """What `mosafs status --json` prints (the same function makes it), asked over one
    RPC: polling with the command would start a Python process every time."""
    with channel(cluster.manager.address, identity) as ch:
        stub = mgrpc.ManagerStub(ch)
        status = stub.GetClusterStatus(mpb.ClusterStatusRequest(), timeout=30)
        pools = stub.ListPools(mpb.ListPoolsRequest(), timeout=30).pools
    return status_report(status, pools)


def _wait(cluster: Cluster, done: Callable[[dict[str, Any]], bool], what: str, *,
          timeout: float = 60, identity: Any = None) -> dict[str, Any]:
    """Poll the status until DONE says so, with figures made after the wait began."""
    started = time.monotonic()
    while True:
        asked = time.monotonic()
        status = _status(cluster, identity)
        fresh = 0 <= status["figures_age_ms"] < 1000 * (asked - started)
        if fresh and done(status):
            return status
        assert time.monotonic() < started + timeout, f"{what}: {status}"
        time.sleep(0.1)


def _redundant(status: dict[str, Any]) -> bool:
    ec = status["erasure_coding"]
    return (status["chunks"] > 0 and status["under_replicated_chunks"] == 0
            and ec["short_chunks"] == 0 and ec["lost_chunks"] == 0)


def _wait_ec_redundant(cluster: Cluster, timeout: float = 60,
                       identity: Any = None) -> dict[str, Any]:
    return _wait(cluster, _redundant, "still short of fragments or copies", timeout=timeout,
                 identity=identity)


def _wait_dead(cluster: Cluster, bid: str, identity: Any = None) -> None:
    _wait(cluster, lambda s: not next(b["alive"] for b in s["benefactors"] if b["id"] == bid),
          f"{bid} is still alive", timeout=LEASE_S + 30, identity=identity)


def test_ec_two_benefactors_killed_during_a_series_then_redundancy_restored(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    """The fault target of issue 19."""
    cluster = _ec_cluster(cluster_factory, tmp_path)
    # Optimistic: with five benefactors left a close stores K of K+M at least (holes)
    # where a pessimistic one would fail; every close still waits for its puts.
    mnt = cluster.mount("mnt", "--write-semantics", "optimistic")
    first, second = cluster.benefactors[2], cluster.benefactors[5]
    for victim in (first, second):
        victim.expected_noise = [".*"]  # killed: whatever it was saying is cut off
    closed: list[bytes] = []
    errors: list[str] = []
    phase = threading.Event()  # set by the test: the writer may go on

    def write_series() -> None:
        for step in range(1, 11):
            if step == 5:
                phase.wait(120)  # the test checks the repair after the first death
            data = _step(step)
            try:
                with open(mnt / "ckpt", "wb") as f:
                    for off in range(0, len(data), 256 * KiB):
                        f.write(data[off:off + 256 * KiB])
            except OSError as exc:
                errors.append(f"step {step}: {exc}")
                continue
            closed.append(data)

    writer = threading.Thread(target=write_series)
    writer.start()
    try:
        while len(closed) < 2 and writer.is_alive():
            time.sleep(0.01)
        first.kill(signal.SIGKILL)  # while version 3 is being written
        while len(closed) < 4 and writer.is_alive():
            time.sleep(0.05)
        # Six left: the survivors rebuild the dead one's fragments, no operator involved.
        _wait_dead(cluster, first.ready["id"])
        status = _wait_ec_redundant(cluster)
        assert status["erasure_coding"]["rebuilt_fragments"] > 0
        _check_redundant(cluster, _locations(cluster, mnt / "ckpt"))
        phase.set()
        while len(closed) < 6 and writer.is_alive():
            time.sleep(0.01)
        second.kill(signal.SIGKILL)  # while version 7 is being written
    finally:
        phase.set()
        writer.join(timeout=300)
    assert not writer.is_alive()
    assert not errors, errors
    assert len(closed) == 10

    # Every closed version reads back byte-identical through a fresh mount (degraded:
    # two benefactors are gone).
    fresh = cluster.mount("fresh")
    assert _versions(fresh, "ckpt") == closed
    _wait_dead(cluster, second.ready["id"])
    status = _status(cluster)
    assert status["erasure_coding"]["short_chunks"] > 0  # five cannot hold six fragments
    assert status["erasure_coding"]["lost_chunks"] == 0

    # The killed daemon is started again on its own disk, as its supervisor does
    # (deploy/systemd: Restart=on-failure): its fragments count again, the holes the
    # optimistic writes left meanwhile are filled, and the pool is whole again by itself.
    cluster.start_benefactor(5)
    status = _wait_ec_redundant(cluster, timeout=90)
    assert status["lost_chunks"] == 0
    _check_redundant(cluster, _locations(cluster, mnt / "ckpt"))
    last = cluster.mount("last")
    assert _versions(last, "ckpt") == closed


def test_ec_holes_filled_corrupt_fragment_rebuilt_and_drain_completes(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    cluster = _ec_cluster(cluster_factory, tmp_path)
    manager = ("--manager", cluster.manager.address)
    mnt = cluster.mount("mnt", "--write-semantics", "optimistic")

    # Two benefactors down: an optimistic write stores five of six fragments of each
    # chunk, a hole in each record.
    for proc in cluster.benefactors[:2]:
        proc.expected_noise = [".*"]
        proc.kill(signal.SIGKILL)
    for proc in cluster.benefactors[:2]:
        _wait_dead(cluster, proc.ready["id"])
    data = _data("holes", 4 * MiB)
    (mnt / "holes").write_bytes(data)
    coded = [loc for loc in _locations(cluster, mnt / "holes") if loc.length >= MIN_CODED]
    assert coded and all(sum(not h for h in loc.fragment_holders) == 1 for loc in coded)
    assert _status(cluster)["erasure_coding"]["missing_fragments"] >= len(coded)
    # They come back: the holes are filled on them (they hold no fragment of these).
    for i in (0, 1):
        cluster.start_benefactor(i)
    _wait_ec_redundant(cluster)
    _check_redundant(cluster, _locations(cluster, mnt / "holes"))

    # A fragment file corrupted on disk: `mosafs scrub` finds it and it is rebuilt.
    ids = _ids(cluster)
    loc = _locations(cluster, mnt / "holes")[0]
    holder = loc.fragment_holders[1]
    broken = _blob(cluster, ids[holder], loc.fragment_ids[1])
    raw = bytearray(broken.read_bytes())
    raw[1000] ^= 0xFF
    broken.write_bytes(bytes(raw))
    cluster.benefactors[ids[holder]].expected_noise.append(r"corrupt chunk")
    report = cli_json("scrub", *manager)
    assert (report["corrupt_chunks"], report["repaired_chunks"],
            report["unrepaired_chunks"]) == (1, 1, 0), report
    _check_redundant(cluster, _locations(cluster, mnt / "holes"))

    # Drain: every fragment moves off to a benefactor holding none of its chunk; the drain
    # completes, and once stopped the benefactor is removed without --force.
    drained = cluster.benefactors[3]
    bid = drained.ready["id"]
    before = _status(cluster)["erasure_coding"]["rebuilt_fragments"]
    done = cli_json("benefactor", "drain", bid, "--timeout", "60", *manager)
    assert done["done"] and done["pending_chunks"] == 0, done
    locations = _locations(cluster, mnt / "holes")
    assert all(bid not in loc.fragment_holders for loc in locations)
    assert _status(cluster)["erasure_coding"]["rebuilt_fragments"] > before
    drained.stop()
    _wait_dead(cluster, bid)
    removed = cli_json("benefactor", "remove", bid, *manager)
    assert removed == {"removed": bid}
    _check_redundant(cluster, locations)
    fresh = cluster.mount("fresh")
    assert (fresh / "holes").read_bytes() == data


def test_ec_conversion_replicas_to_ec_and_back(cluster_factory: list[Cluster],
                                               tmp_path: Path) -> None:
    cluster = _ec_cluster(cluster_factory, tmp_path, redundancy="replicas:2", benefactors=6)
    manager = ("--manager", cluster.manager.address)
    mnt = cluster.mount("mnt")
    files = {"a": _data("a", 3 * MiB), "b": _data("b", 2 * MiB + 5), "c": _data("c", 10 * KiB)}
    for name, content in files.items():
        (mnt / name).write_bytes(content)
    total = sum(len(c) for c in files.values())

    def locations() -> list[mpb.ChunkLocation]:
        return [loc for name in files for loc in _locations(cluster, mnt / name)]

    def stored() -> int:
        return harness.sizes(p for i in range(len(cluster.benefactors))
                             for p in harness.chunk_files(cluster.base / f"b{i}"))

    def converted(redundancy: str) -> list[dict[str, Any]]:
        """Status until the default pool's conversion is complete; what it showed."""
        seen = []

        def complete(status: dict[str, Any]) -> bool:
            (conv,) = [c for c in status["conversions"] if c["pool"] == "default"] or [None]
            if conv is None:
                return False
            assert conv["redundancy"] == redundancy
            seen.append(conv)
            return bool(conv["complete"]) and _redundant(status)

        _wait(cluster, complete, "conversion not done", timeout=90)
        return seen

    _check_redundant(cluster, locations(), k=0, copies=2)
    cli_json("pool", "set", "default", "--redundancy", "ec:4+2", *manager)
    seen = converted("ec:4+2")
    coded = [loc for loc in locations() if loc.length >= MIN_CODED]
    assert seen[-1]["done_chunks"] == len(coded)
    assert seen[-1]["done_bytes"] == sum(loc.length for loc in coded)
    assert seen[-1]["remaining_chunks"] == 0
    _check_redundant(cluster, locations())  # the small chunk: M+1 = 3 copies
    reader = cluster.mount("reader")
    for name, content in files.items():
        assert (reader / name).read_bytes() == content
    # The old whole copies go at the next collection: about 1.5x the bytes stay.
    cli_json("gc", *manager)
    time.sleep(GRACE_S + 0.2)
    cli_json("gc", *manager)
    assert stored() < 1.6 * total + 3 * 10 * KiB

    cli_json("pool", "set", "default", "--redundancy", "replicas:3", *manager)
    seen = converted("replicas:3")
    assert seen[-1]["done_chunks"] == len(coded) and seen[-1]["remaining_chunks"] == 0
    _check_redundant(cluster, locations(), k=0, copies=3)
    cli_json("gc", *manager)
    time.sleep(GRACE_S + 0.2)
    cli_json("gc", *manager)
    assert stored() == 3 * total, "old fragments collected, three copies of everything"
    fresh = cluster.mount("fresh")
    for name, content in files.items():
        assert (fresh / name).read_bytes() == content
    text = cli("status", *manager).stdout
    assert "pool default converting to replicas:3: " in text and ", done" in text, text


# --- TLS with chunk access tokens ---------------------------------------------------------

@pytest.fixture
def tls_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    reason = fuse_available()
    if reason:
        pytest.skip(reason)
    monkeypatch.delenv("MOSAFS_INSECURE", raising=False)
    tls = tmp_path / "tls"
    assert cli("certs", "init", "--dir", str(tls)).returncode == 0
    for name, extra in (("manager", []), ("benefactor", []), ("admin", []),
                        ("client", ["--allow-root"])):
        done = cli("certs", "issue", name, "--role", name, "--dir", str(tls), *extra)
        assert done.returncode == 0, done.stderr
    procs = tmp_path / "procs"
    manager = harness.start("manager", [
        "manager", "--data-dir", str(tmp_path / "manager"), "--tls-dir", str(tls),
        "--chunker", EC_CHUNKER, "--replication", "2", "--heartbeat-interval", "0.5",
        "--benefactor-lease", str(LEASE_S), "--scan-interval", "0.5",
        "--gc-grace", str(GRACE_S)], procs)
    cluster = Cluster(tmp_path, manager, benefactor_args=(
        "--tls-dir", str(tls), "--inventory-interval", "3600", "--scrub-rate", "0"))
    try:
        for i in range(4):
            cluster.start_benefactor(i)
        admin = load(tls, "admin")
        _wait(cluster, lambda s: sum(b["alive"] for b in s["benefactors"]) == 4,
              "the benefactors did not register", timeout=30, identity=admin)
        yield cluster
    finally:
        failures = stop_cluster(cluster)
        assert not failures, "\n".join(failures)


def _tls_json(cluster: Cluster, *args: str) -> dict:  # type: ignore[type-arg]
    return dict(cli_json(*args, "--manager", cluster.manager.address, "--tls-dir",
                         str(cluster.base / "tls")))


def test_ec_conversion_and_rebuild_under_tls_with_tokens(tls_cluster: Cluster) -> None:
    cluster = tls_cluster
    tls = ("--tls-dir", str(cluster.base / "tls"))
    mnt = cluster.base / "mnt"
    mnt.mkdir()
    cluster.mounts.append(harness.start("mnt", [
        "mount", str(mnt), "--manager", cluster.manager.address, *tls],
        cluster.base / "procs"))
    data = _data("tls", 3 * MiB)
    (mnt / "f").write_bytes(data)
    # replicas:2 -> ec:2+1: the converters read whole copies from peers with read tokens.
    _tls_json(cluster, "pool", "set", "default", "--redundancy", "ec:2+1", "--ec-min-chunk",
              "64K")
    admin = load(cluster.base / "tls", "admin")
    status = _wait(cluster, lambda s: bool(s["conversions"]) and s["conversions"][0][
        "complete"] and _redundant(s), "conversion not done", identity=admin)
    assert status["conversions"][0]["done_chunks"] > 0
    coded = [loc for loc in _locations(cluster, mnt / "f", admin) if loc.length >= MIN_CODED]
    assert coded and all(loc.ec_k == 2 for loc in coded)
    # A holder dies: its fragments are rebuilt from fragments read from peers (tokens).
    victim_id = coded[0].fragment_holders[0]
    victim = cluster.benefactors[_ids(cluster)[victim_id]]
    victim.expected_noise = [".*"]
    victim.kill(signal.SIGKILL)
    _wait_dead(cluster, victim_id, identity=admin)
    status = _wait_ec_redundant(cluster, identity=admin)
    assert status["erasure_coding"]["rebuilt_fragments"] > 0
    for loc in [loc for loc in _locations(cluster, mnt / "f", admin)
                if loc.length >= MIN_CODED]:
        holders = list(loc.fragment_holders)
        assert victim_id not in holders and all(holders) and len(set(holders)) == 3
        ids = _ids(cluster)
        for fid, holder in zip(loc.fragment_ids, holders, strict=True):
            blob = _blob(cluster, ids[holder], fid)
            assert blake3.blake3(blob.read_bytes()).digest() == fid
    assert (mnt / "f").read_bytes() == data
    # Tokens were checked all along: the peers' reads carried the manager's read tokens.
    assert all("chunk access tokens checked" in p.log() for p in cluster.benefactors)
