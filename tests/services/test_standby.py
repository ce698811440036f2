"""Standby managers as processes (docs/standby.md): an active manager with `--standbys 1`
and a standby (`--standby-of`) following it over its feed (a framed TLS connection); faults
by SIGKILL, malformed frames and certificates of the wrong role. The log's rules are
tested in tests/unit/test_replog.py, the transport's in tests/unit/test_framed.py."""

from __future__ import annotations

import contextlib
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from mosafs import certs
from mosafs._proto import manager_pb2 as pb
from mosafs._proto import manager_pb2_grpc as pb_grpc
from mosafs._proto import replication_pb2 as rpb
from mosafs._proto import replication_pb2_grpc
from mosafs.errors import Unavailable
from mosafs.rpc import framed
from mosafs.rpc.channels import channel
from tests import harness
from tests.harness import cli
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


def _feed(mgr: Mgr, identity: certs.Identity | None = None,
          tls: Path | None = None) -> framed.Connection:
    """A connection with IDENTITY to MGR's feed, at the port its FeedAddress names (asked
    with the admin certificate of TLS)."""
    return framed.connect("127.0.0.1", _port(mgr, tls), role="manager", identity=identity)


def _raw(port: int, data: bytes) -> bytes:
    """Send DATA on a plaintext connection to the feed at PORT, end the sending side, and
    return the frame it answers (b"": none)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    return got[4:4 + int.from_bytes(got[:4], "big")] if got else b""


def _answer(conn: framed.Connection, *frames: bytes) -> rpb.FollowMessage:
    """The message the feed answers FRAMES with; the connection is closed after it."""
    for frame in frames:
        conn.send(frame)
    try:
        answer = conn.receive()
        assert answer is not None, "the feed ended without saying why"
        return rpb.FollowMessage.FromString(answer)
    finally:
        conn.close()


def test_the_feed_refuses_bad_input_and_the_manager_keeps_serving(
        start: Callable[..., Mgr]) -> None:
    plain = start("plain")
    active = start("active", "--standbys", "0")
    # A manager that keeps no log has no feed.
    with pytest.raises(grpc.RpcError) as info:
        replication_pb2_grpc.ManagerReplicationStub(plain.channel).FeedAddress(
            rpb.FeedAddressRequest(), timeout=10)
    assert info.value.code() == Code.FAILED_PRECONDITION
    assert "keeps no replication log" in (info.value.details() or "")
    hello = rpb.FollowRequest(hello=rpb.FollowHello(member="x")).SerializeToString()
    for frames, says in (
            ([rpb.FollowRequest(acked_seq=3).SerializeToString()], "starts with a hello"),
            ([rpb.FollowRequest(hello=rpb.FollowHello()).SerializeToString()],
             "starts with a hello"),
            ([b"\xff\xff\xff"], "malformed Follow request"),  # no FollowRequest at all
            # Confirmations that are no requests (the snapshot may come before the word).
            ([hello, b"\xff\xff\xff"], "malformed Follow request")):
        conn = _feed(active)
        for frame in frames:
            conn.send(frame)
        answers = []
        while (got := conn.receive()) is not None:
            answers.append(rpb.FollowMessage.FromString(got))
        conn.close()
        assert answers and answers[-1].WhichOneof("msg") == "error", answers
        error = answers[-1].error
        assert error.kind == "invalid-argument" and says in error.message, error
    # A frame announcing more than any message may be, half a frame, and nothing at all
    # (bytes on a socket of our own: a Connection frames what it sends).
    port = _port(active)
    error = rpb.FollowMessage.FromString(_raw(port, (framed.MAX_FRAME + 1).to_bytes(4,
                                                                                "big")))
    assert error.error.kind == "invalid-argument" and "a frame of" in error.error.message
    assert _raw(port, b"\x00\x00\x01\x00half") == b""  # it broke off: nobody to tell
    error = rpb.FollowMessage.FromString(_raw(port, b""))
    assert "starts with a hello" in error.error.message
    assert active.serving() and plain.serving()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tls")
    assert cli("certs", "init", "--dir", str(directory)).returncode == 0
    for name, role in (("manager", "manager"), ("client", "client"), ("admin", "admin"),
                       ("doomed", "manager")):
        done = cli("certs", "issue", name, "--role", role, "--dir", str(directory))
        assert done.returncode == 0, done.stderr
    return directory


def test_the_feed_over_tls_serves_only_managers_certificates(
        start: Callable[..., Mgr], tls: Path) -> None:
    active = start("active", "--standbys", "0", "--tls-dir", str(tls))
    hello = rpb.FollowRequest(hello=rpb.FollowHello(member="m")).SerializeToString()
    # A manager's certificate is fed (a snapshot first: it stands nowhere yet).
    assert _answer(_feed(active, certs.load(tls, "manager"), tls), hello).HasField("snapshot")
    # A client's is refused, and told why.
    error = _answer(_feed(active, certs.load(tls, "client"), tls), hello).error
    assert error.kind == "access-denied", error
    assert "Follow needs a certificate of role admin or manager; this one is client" in \
        error.message
    # A revoked one is refused on its next connection.
    doomed = certs.load(tls, "doomed")
    assert _answer(_feed(active, doomed, tls), hello).HasField("snapshot")
    assert cli("certs", "revoke", "doomed", "--dir", str(tls)).returncode == 0
    deadline = time.monotonic() + 10
    while not (error := _answer(_feed(active, doomed, tls), hello).error).message:
        assert time.monotonic() < deadline, "the revoked certificate is still fed"
        time.sleep(0.2)
    assert "has been revoked" in error.message
    # Not TLS at all: the connection is dropped; the manager serves on.
    plain = framed.connect("127.0.0.1", _port(active, tls), role="manager", identity=None)
    plain.send(hello)
    with contextlib.suppress(framed.Closed):
        assert plain.receive() is None
    plain.close()
    assert "refused Follow from client (role)" in active.proc.log()
    with channel(active.proc.address, certs.load(tls, "admin")) as ch:
        assert pb_grpc.ManagerStub(ch).GetAttr(pb.GetAttrRequest(inode=ROOT),
                                               timeout=10).inode == ROOT


def _port(mgr: Mgr, tls: Path | None = None) -> int:
    with channel(mgr.proc.address, certs.load(tls, "admin") if tls else None) as ch:
        return int(replication_pb2_grpc.ManagerReplicationStub(ch).FeedAddress(
            rpb.FeedAddressRequest(), timeout=10).port)
