"""Standby managers as processes (docs/standby.md): an active manager with `--standbys 1`
and a standby (`--standby-of`) following it over the Follow stream; faults by SIGKILL
and malformed requests. The log's rules are tested in tests/unit/test_replog.py."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from mosafs._proto import manager_pb2 as pb
from mosafs._proto import replication_pb2 as rpb
from mosafs._proto import replication_pb2_grpc
from mosafs.errors import Unavailable
from mosafs.rpc.channels import channel
from tests import harness
from tests.services.test_manager import ROOT, Mgr, cid, register, write

Code = grpc.StatusCode
# The standby reports the stream's end when its active manager dies or stops.
FOLLOW_NOISE = [r"following 127\.0\.0\.1:\d+: "]
# The active manager reports a standby that stops.
LEFT = [r"standby \w+ left the in-sync set: it disconnected"]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Mgr]]:
    """start(name, *flags, noise=[...]) -> Mgr: a manager on TMP/NAME; each is stopped at
    the end (exit 0, no unexpected noise)."""
    started: list[Mgr] = []

    def run(name: str, *flags: str, noise: list[str] | None = None) -> Mgr:
        proc = harness.start(name, ["manager", "--data-dir", str(tmp_path / name), *flags],
                             tmp_path / "procs")
        proc.expected_noise = list(noise or [])
        started.append(Mgr(proc))
        return started[-1]

    try:
        yield run
    finally:
        for mgr in started:
            mgr.close()
        harness.stop_every(m.proc for m in started)


def wait_until(check: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_what_the_active_acknowledged_survives_its_sigkill_on_the_standby(
        start: Callable[..., Mgr], tmp_path: Path) -> None:
    active = start("active", "--standbys", "1", "--standby-wait", "20", noise=LEFT)
    standby = start("standby", "--standby-of", active.proc.address, noise=FOLLOW_NOISE)
    # Acknowledged once the standby, from a snapshot, has it on disk.
    before = active("Mkdir", pb.MkdirRequest(parent=ROOT, name="before", mode=0o755))
    register(active, "b1", 7001)
    made = {}
    for i in range(30):  # each acknowledged only once the standby has it on disk
        f = active("Create", pb.CreateRequest(parent=before.inode, name=f"ckpt{i}",
                                              mode=0o644))
        made[f"ckpt{i}"] = (f.inode, write(active, f.inode, [(cid(i), 1000 + i)]).version)
    active("Rename", pb.RenameRequest(old_parent=before.inode, old_name="ckpt0",
                                      new_parent=ROOT, new_name="moved"))
    # Clients get FAILED_PRECONDITION from the standby, naming the active manager.
    with pytest.raises(grpc.RpcError) as info:
        standby.stub.GetAttr(pb.GetAttrRequest(inode=ROOT), timeout=10)
    assert info.value.code() == Code.FAILED_PRECONDITION
    assert active.proc.address in (info.value.details() or "")
    active.proc.kill(signal.SIGKILL)
    standby.proc.stop()
    # The standby's data directory, started as a manager, holds every acknowledged change.
    promoted = start("standby")
    d = promoted("Lookup", pb.LookupRequest(parent=ROOT, name="before"))
    assert d.inode == before.inode
    assert promoted("Lookup", pb.LookupRequest(parent=ROOT, name="moved")).inode == \
        made["ckpt0"][0]
    for name, (inode, version) in list(made.items())[1:]:
        assert promoted("Lookup", pb.LookupRequest(parent=d.inode, name=name)).inode == inode
        listed = promoted("ListVersions", pb.ListVersionsRequest(inode=inode))
        assert [v.version for v in listed.versions] == [version]
    fsck = promoted("Fsck", pb.FsckRequest())
    assert not fsck.findings, fsck


def test_without_an_in_sync_standby_a_change_fails_cleanly_and_a_late_one_catches_up(
        start: Callable[..., Mgr]) -> None:
    active = start("active", "--standbys", "1", "--standby-wait", "1", noise=LEFT)
    with pytest.raises(Unavailable, match="stored on the active manager"):
        active("Mkdir", pb.MkdirRequest(parent=ROOT, name="unconfirmed", mode=0o755))
    assert active("Lookup", pb.LookupRequest(parent=ROOT, name="unconfirmed")).inode
    start("standby", "--standby-of", active.proc.address, noise=FOLLOW_NOISE)
    # Once in sync (from a snapshot), changes are confirmed again.
    wait_until(lambda: _confirmed(active, "late"))
    assert active("Lookup", pb.LookupRequest(parent=ROOT, name="late")).inode


def _confirmed(active: Mgr, name: str) -> bool:
    try:
        active("Mkdir", pb.MkdirRequest(parent=ROOT, name=name, mode=0o755))
        return True
    except Unavailable:
        return False


def test_follow_refuses_bad_streams_and_the_manager_keeps_serving(
        start: Callable[..., Mgr]) -> None:
    plain = start("plain")
    active = start("active", "--standbys", "0")
    for mgr, requests, code in (
            (plain, [rpb.FollowRequest(hello=rpb.FollowHello(member="x"))],
             Code.FAILED_PRECONDITION),
            (active, [rpb.FollowRequest(acked_seq=3)], Code.INVALID_ARGUMENT),
            (active, [rpb.FollowRequest(hello=rpb.FollowHello())], Code.INVALID_ARGUMENT)):
        stub = replication_pb2_grpc.ManagerReplicationStub(mgr.channel)
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Follow(iter(requests), timeout=10))
        assert info.value.code() == code
    # Bytes that are no FollowRequest at all.
    raw = channel(active.proc.address).stream_stream(
        "/mosafs.v1.ManagerReplication/Follow", request_serializer=None,
        response_deserializer=None)
    with pytest.raises(grpc.RpcError) as info:
        list(raw(iter([b"\xff\xff\xff"]), timeout=10))
    assert info.value.code() == Code.INVALID_ARGUMENT
    assert active.serving() and plain.serving()
