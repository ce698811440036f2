"""A real `mosafs manager` process over a real gRPC channel: the namespace, a write session
with a benefactor identity registered by the test, malformed requests (each answered with a
status code while the server keeps serving), and durability across SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from mosafs._proto import benefactor_pb2, common_pb2
from mosafs._proto import manager_pb2 as pb
from mosafs._proto import manager_pb2_grpc as pb_grpc
from mosafs.errors import (
    AlreadyExists,
    InvalidArgument,
    NameTooLong,
    NoAttribute,
    NoSpace,
    NotFound,
    NotPermitted,
    NotSupported,
    Unavailable,
    ValueTooLarge,
)
from mosafs.ids import chunk_id
from mosafs.rpc.channels import channel
from mosafs.rpc.errors import call, error_of
from tests import harness

ROOT = 1
MiB = 1 << 20
Code = grpc.StatusCode


class Mgr:
    """A manager process and a stub on a channel to it."""

    def __init__(self, proc: harness.Proc) -> None:
        self.proc = proc
        self.channel = channel(proc.address)
        self.stub = pb_grpc.ManagerStub(self.channel)

    def __call__(self, method: str, request: Any) -> Any:
        return call(getattr(self.stub, method), request, timeout=10)

    def code_of(self, method: str, request: Any, stub: Any = None) -> grpc.StatusCode:
        """The status code a call fails with (the test fails if it succeeds)."""
        with pytest.raises(grpc.RpcError) as info:
            getattr(stub or self.stub, method)(request, timeout=30)
        return info.value.code()  # type: ignore[no-any-return]

    def serving(self) -> bool:
        return bool(self("GetAttr", pb.GetAttrRequest(inode=ROOT)).inode == ROOT)

    def close(self) -> None:
        self.channel.close()


@pytest.fixture
def start_manager(tmp_path: Path) -> Iterator[Callable[..., Mgr]]:
    """start_manager(*flags, data_dir=...) -> Mgr; every manager is stopped at the end and
    must have stopped with exit code 0 and a log free of warnings and tracebacks."""
    started: list[Mgr] = []

    def start(*flags: str, data_dir: Path | None = None, name: str = "manager") -> Mgr:
        data = data_dir or tmp_path / "data"
        proc = harness.start(f"{name}{len(started)}", ["manager", "--data-dir", str(data),
                                                       *flags], tmp_path / "procs")
        mgr = Mgr(proc)
        started.append(mgr)
        return mgr

    try:
        yield start
    finally:
        for mgr in started:
            mgr.close()
            was_alive = mgr.proc.alive()
            mgr.proc.stop()
            if was_alive:
                assert mgr.proc.popen.returncode == 0, mgr.proc.log()


@pytest.fixture
def mgr(start_manager: Callable[..., Mgr]) -> Mgr:
    return start_manager()


def register(mgr: Mgr, bid: str, port: int) -> pb.RegisterBenefactorResponse:
    info = benefactor_pb2.BenefactorInfo(id=bid, address=f"127.0.0.1:{port}",
                                         capacity_bytes=10**12, free_bytes=10**11)
    return mgr("RegisterBenefactor", pb.RegisterBenefactorRequest(info=info))


def cid(n: int) -> bytes:
    return chunk_id(f"service chunk {n}".encode())


def write(mgr: Mgr, inode: int, chunks: list[tuple[bytes, int]]) -> pb.CommitVersionResponse:
    """A write session: OpenWrite, then commit CHUNKS placed on the first target."""
    opened = mgr("OpenWrite", pb.OpenWriteRequest(inode=inode, client_id="test"))
    target = opened.targets[0].id
    return mgr("CommitVersion", pb.CommitVersionRequest(
        lease_id=opened.lease_id, inode=inode, mtime_ns=7, new_bytes=sum(n for _, n in chunks),
        chunks=[common_pb2.ChunkRef(id=c, length=n) for c, n in chunks],
        placements=[pb.ChunkPlacement(id=c, benefactor_ids=[target]) for c, _ in chunks]))


def test_namespace_over_grpc(mgr: Mgr) -> None:
    d = mgr("Mkdir", pb.MkdirRequest(parent=ROOT, name="run", mode=0o755))
    f = mgr("Create", pb.CreateRequest(parent=d.inode, name="app.0.1", mode=0o644, uid=5))
    assert f.kind == pb.FILE_KIND_REGULAR and f.uid == 5 and f.nlink == 1
    assert mgr("Lookup", pb.LookupRequest(parent=d.inode, name="app.0.1")) == f
    with pytest.raises(AlreadyExists):
        mgr("Create", pb.CreateRequest(parent=d.inode, name="app.0.1", exclusive=True))
    for i in range(5):
        mgr("Create", pb.CreateRequest(parent=d.inode, name=f"z{i}", mode=0o600))
    page = mgr("ReadDir", pb.ReadDirRequest(inode=d.inode, limit=4))
    assert [e.name for e in page.entries] == ["app.0.1", "z0", "z1", "z2"] and page.more
    assert page.entries[0].attr == f
    page = mgr("ReadDir", pb.ReadDirRequest(inode=d.inode, start_after="z2", limit=4))
    assert [e.name for e in page.entries] == ["z3", "z4"] and not page.more
    mgr("Rename", pb.RenameRequest(old_parent=d.inode, old_name="app.0.1", new_parent=ROOT,
                                   new_name="moved"))
    assert mgr("Lookup", pb.LookupRequest(parent=ROOT, name="moved")).inode == f.inode
    with pytest.raises(NotFound):
        mgr("Lookup", pb.LookupRequest(parent=d.inode, name="app.0.1"))
    out = mgr("SetAttr", pb.SetAttrRequest(inode=f.inode, mode=0o600))
    assert out.mode == 0o600 and out.uid == 5
    mgr("Unlink", pb.UnlinkRequest(parent=ROOT, name="moved"))
    assert mgr("StatFs", pb.StatFsRequest()).files == 7
    assert mgr("GetAttr", pb.GetAttrRequest(inode=ROOT)).nlink == 3


def _outcome_error(outcome: Any) -> Any:
    return error_of(outcome.code, outcome.kind, outcome.error) if outcome.code else None


def test_batch_answers_each_operation_on_its_own(mgr: Mgr) -> None:
    d = mgr("Mkdir", pb.MkdirRequest(parent=ROOT, name="batch", mode=0o755)).inode
    ops = [pb.BatchOp(create=pb.CreateRequest(parent=d, name=f"f{i}", mode=0o644, uid=7,
                                              exclusive=True)) for i in range(40)]
    ops += [pb.BatchOp(lookup=pb.LookupRequest(parent=d, name="missing")),
            pb.BatchOp(getattr=pb.GetAttrRequest(inode=d)),
            pb.BatchOp(),  # names no operation
            pb.BatchOp(create=pb.CreateRequest(parent=d, name="bad/name", mode=0o644))]
    out = mgr("Batch", pb.BatchRequest(ops=ops)).outcomes
    assert len(out) == len(ops)
    made = [o.attr for o in out[:40]]
    assert all(o.code == 0 for o in out[:40])
    assert len({a.inode for a in made}) == 40 and {a.uid for a in made} == {7}
    assert isinstance(_outcome_error(out[40]), NotFound)
    assert out[41].code == 0 and out[41].attr.inode == d and out[41].attr.nlink == 2
    assert isinstance(_outcome_error(out[42]), InvalidArgument)
    assert isinstance(_outcome_error(out[43]), InvalidArgument)
    # What a batch created is there, and an exclusive create of it again is refused alone.
    for i, attr in enumerate(made):
        assert mgr("Lookup", pb.LookupRequest(parent=d, name=f"f{i}")) == attr
    again = mgr("Batch", pb.BatchRequest(ops=[
        pb.BatchOp(create=pb.CreateRequest(parent=d, name="f0", exclusive=True)),
        pb.BatchOp(lookup=pb.LookupRequest(parent=d, name="f1"))])).outcomes
    assert isinstance(_outcome_error(again[0]), AlreadyExists)
    assert again[1].attr == made[1]


def test_batch_read_refuses_writes_alone(mgr: Mgr) -> None:
    """BatchRead is retried by the channel like Lookup: a create in it is refused, alone,
    and creates nothing."""
    d = mgr("Mkdir", pb.MkdirRequest(parent=ROOT, name="reads", mode=0o755)).inode
    out = mgr("BatchRead", pb.BatchRequest(ops=[
        pb.BatchOp(create=pb.CreateRequest(parent=d, name="no", mode=0o644)),
        pb.BatchOp(getattr=pb.GetAttrRequest(inode=d)),
        pb.BatchOp(lookup=pb.LookupRequest(parent=ROOT, name="reads"))])).outcomes
    assert isinstance(_outcome_error(out[0]), InvalidArgument)
    assert out[1].attr.inode == out[2].attr.inode == d
    with pytest.raises(NotFound):
        mgr("Lookup", pb.LookupRequest(parent=d, name="no"))


def test_batch_limits_are_invalid_argument_and_the_server_keeps_serving(mgr: Mgr) -> None:
    assert mgr.code_of("Batch", pb.BatchRequest()) == Code.INVALID_ARGUMENT
    assert mgr.code_of("BatchRead", pb.BatchRequest()) == Code.INVALID_ARGUMENT
    many = [pb.BatchOp(getattr=pb.GetAttrRequest(inode=ROOT))] * 257
    assert mgr.code_of("Batch", pb.BatchRequest(ops=many)) == Code.INVALID_ARGUMENT
    assert len(mgr("Batch", pb.BatchRequest(ops=many[:256])).outcomes) == 256
    assert mgr.serving()


def test_batches_of_refused_lookups_in_parallel_leave_the_store_serving(mgr: Mgr) -> None:
    """Every refused operation of a batch is answered while the others run: what it raised
    must not keep its read transaction (an LMDB reader slot) alive meanwhile. 16 batches of
    256 lookups of missing names at once are far more than the reader table holds."""
    d = mgr("Mkdir", pb.MkdirRequest(parent=ROOT, name="absent", mode=0o755)).inode
    ops = [pb.BatchOp(lookup=pb.LookupRequest(parent=d, name=f"none{i}")) for i in range(256)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: mgr("BatchRead", pb.BatchRequest(ops=ops)),
                                range(16)))
    for answer in answers:
        assert len(answer.outcomes) == 256
        assert all(isinstance(_outcome_error(o), NotFound) for o in answer.outcomes)
    assert mgr("Lookup", pb.LookupRequest(parent=ROOT, name="absent")).inode == d


def test_symlinks_special_files_links_and_xattrs_over_grpc(mgr: Mgr) -> None:
    d = mgr("Mkdir", pb.MkdirRequest(parent=ROOT, name="run", mode=0o755))
    link = mgr("Symlink", pb.SymlinkRequest(parent=ROOT, name="latest", target=b"run/\xffx",
                                            uid=4, gid=5))
    assert (link.kind, link.mode, link.nlink, link.size, link.uid) == (
        pb.FILE_KIND_SYMLINK, 0o777, 1, 6, 4)
    assert mgr("Readlink", pb.ReadlinkRequest(inode=link.inode)).target == b"run/\xffx"
    fifo = mgr("Mknod", pb.MknodRequest(parent=d.inode, name="pipe", kind=pb.FILE_KIND_FIFO,
                                        mode=0o620))
    sock = mgr("Mknod", pb.MknodRequest(parent=d.inode, name="sock",
                                        kind=pb.FILE_KIND_SOCKET, mode=0o600))
    assert (fifo.kind, fifo.mode, sock.kind, sock.size) == (
        pb.FILE_KIND_FIFO, 0o620, pb.FILE_KIND_SOCKET, 0)
    f = mgr("Create", pb.CreateRequest(parent=ROOT, name="ckpt", mode=0o644))
    linked = mgr("Link", pb.LinkRequest(inode=f.inode, new_parent=d.inode, new_name="ckpt"))
    assert (linked.inode, linked.nlink) == (f.inode, 2)
    entries = mgr("ReadDir", pb.ReadDirRequest(inode=d.inode)).entries
    assert [(e.name, e.attr.kind) for e in entries] == [
        ("ckpt", pb.FILE_KIND_REGULAR), ("pipe", pb.FILE_KIND_FIFO),
        ("sock", pb.FILE_KIND_SOCKET)]
    assert mgr("Lookup", pb.LookupRequest(parent=ROOT, name="ckpt")).nlink == 2
    # Extended attributes, on a symlink as on anything else.
    mgr("SetXattr", pb.SetXattrRequest(inode=link.inode, name="user.b", value=b"\0\1"))
    mgr("SetXattr", pb.SetXattrRequest(inode=link.inode, name="user.a", value=b"x",
                                       create=True))
    mgr("SetXattr", pb.SetXattrRequest(inode=link.inode, name="user.a", value=b"y",
                                       replace=True))
    assert mgr("GetXattr", pb.GetXattrRequest(inode=link.inode, name="user.a")).value == b"y"
    assert mgr("GetXattr", pb.GetXattrRequest(inode=link.inode, name="user.b")).value == b"\0\1"
    assert list(mgr("ListXattr", pb.ListXattrRequest(inode=link.inode)).names) == [
        "user.a", "user.b"]
    mgr("RemoveXattr", pb.RemoveXattrRequest(inode=link.inode, name="user.a"))
    assert list(mgr("ListXattr", pb.ListXattrRequest(inode=link.inode)).names) == ["user.b"]
    assert list(mgr("ListXattr", pb.ListXattrRequest(inode=ROOT)).names) == []
    # SetAttr takes the client's ctime when it sends one.
    out = mgr("SetAttr", pb.SetAttrRequest(inode=f.inode, mtime_ns=10, ctime_ns=20))
    assert (out.mtime_ns, out.ctime_ns) == (10, 20)
    out = mgr("SetAttr", pb.SetAttrRequest(inode=f.inode, atime_ns=30))
    assert (out.atime_ns, out.mtime_ns) == (30, 10) and out.ctime_ns > 20
    # Names go one at a time; the file goes with its last one.
    assert mgr("StatFs", pb.StatFsRequest()).files == 6
    mgr("Unlink", pb.UnlinkRequest(parent=ROOT, name="ckpt"))
    assert mgr("GetAttr", pb.GetAttrRequest(inode=f.inode)).nlink == 1
    mgr("Rename", pb.RenameRequest(old_parent=d.inode, old_name="pipe", new_parent=d.inode,
                                   new_name="ckpt"))
    with pytest.raises(NotFound):
        mgr("GetAttr", pb.GetAttrRequest(inode=f.inode))
    mgr("Unlink", pb.UnlinkRequest(parent=ROOT, name="latest"))
    with pytest.raises(NotFound):
        mgr("ListXattr", pb.ListXattrRequest(inode=link.inode))
    assert mgr("StatFs", pb.StatFsRequest()).files == 4  # root, run, ckpt (the FIFO), sock


def test_new_rpcs_refuse_bad_input_and_the_server_keeps_serving(mgr: Mgr) -> None:
    register(mgr, "bf-1", 7501)
    d = mgr("Mkdir", pb.MkdirRequest(parent=ROOT, name="d", mode=0o755))
    f = mgr("Create", pb.CreateRequest(parent=ROOT, name="f", mode=0o644))
    link = mgr("Symlink", pb.SymlinkRequest(parent=ROOT, name="l", target=b"f"))
    fifo = mgr("Mknod", pb.MknodRequest(parent=ROOT, name="p", kind=pb.FILE_KIND_FIFO))
    mgr("SetXattr", pb.SetXattrRequest(inode=f.inode, name="user.k", value=b"v"))
    unknown = 10**9

    def xattr(name: str, value: bytes = b"v", **flags: bool) -> pb.SetXattrRequest:
        return pb.SetXattrRequest(inode=f.inode, name=name, value=value, **flags)

    cases: list[tuple[str, Any, grpc.StatusCode]] = [
        ("Symlink", pb.SymlinkRequest(parent=ROOT, name="s", target=b"a\0b"),
         Code.INVALID_ARGUMENT),
        ("Symlink", pb.SymlinkRequest(parent=ROOT, name="s", target=b""), Code.INVALID_ARGUMENT),
        ("Symlink", pb.SymlinkRequest(parent=ROOT, name="s", target=b"t" * 4096),
         Code.INVALID_ARGUMENT),
        ("Symlink", pb.SymlinkRequest(parent=ROOT, name="f", target=b"t"), Code.ALREADY_EXISTS),
        ("Symlink", pb.SymlinkRequest(parent=unknown, name="s", target=b"t"), Code.NOT_FOUND),
        ("Symlink", pb.SymlinkRequest(parent=ROOT, name="a/b", target=b"t"),
         Code.INVALID_ARGUMENT),
        ("Readlink", pb.ReadlinkRequest(inode=f.inode), Code.INVALID_ARGUMENT),
        ("Readlink", pb.ReadlinkRequest(inode=unknown), Code.NOT_FOUND),
        ("Mknod", pb.MknodRequest(parent=ROOT, name="dev"), Code.PERMISSION_DENIED),
        ("Mknod", pb.MknodRequest(parent=ROOT, name="dev", kind=pb.FILE_KIND_REGULAR),
         Code.PERMISSION_DENIED),
        ("Mknod", pb.MknodRequest(parent=ROOT, name="dev", kind=77),  # type: ignore[arg-type]
         Code.PERMISSION_DENIED),
        ("Mknod", pb.MknodRequest(parent=ROOT, name="p", kind=pb.FILE_KIND_FIFO),
         Code.ALREADY_EXISTS),
        ("Mknod", pb.MknodRequest(parent=ROOT, name="q", kind=pb.FILE_KIND_FIFO,
                                  mode=0o100644), Code.INVALID_ARGUMENT),
        ("Link", pb.LinkRequest(inode=d.inode, new_parent=ROOT, new_name="d2"),
         Code.PERMISSION_DENIED),
        ("Link", pb.LinkRequest(inode=f.inode, new_parent=ROOT, new_name="l"),
         Code.ALREADY_EXISTS),
        ("Link", pb.LinkRequest(inode=unknown, new_parent=ROOT, new_name="x"), Code.NOT_FOUND),
        ("Link", pb.LinkRequest(inode=f.inode, new_parent=f.inode, new_name="x"),
         Code.FAILED_PRECONDITION),
        ("SetXattr", xattr("user.big", b"v" * 65537), Code.INVALID_ARGUMENT),
        ("SetXattr", xattr("trusted.k"), Code.UNIMPLEMENTED),
        ("SetXattr", xattr("user.mosafs.version"), Code.PERMISSION_DENIED),
        ("SetXattr", xattr("user." + "n" * 251), Code.INVALID_ARGUMENT),
        ("SetXattr", xattr(""), Code.INVALID_ARGUMENT),
        ("SetXattr", xattr("user.k", create=True), Code.ALREADY_EXISTS),
        ("SetXattr", xattr("user.absent", replace=True), Code.NOT_FOUND),
        ("SetXattr", pb.SetXattrRequest(inode=unknown, name="user.k"), Code.NOT_FOUND),
        ("GetXattr", pb.GetXattrRequest(inode=f.inode, name="user.absent"), Code.NOT_FOUND),
        ("GetXattr", pb.GetXattrRequest(inode=unknown, name="user.k"), Code.NOT_FOUND),
        ("GetXattr", pb.GetXattrRequest(inode=f.inode, name="security.x"), Code.UNIMPLEMENTED),
        ("ListXattr", pb.ListXattrRequest(inode=unknown), Code.NOT_FOUND),
        ("RemoveXattr", pb.RemoveXattrRequest(inode=f.inode, name="user.absent"),
         Code.NOT_FOUND),
        ("RemoveXattr", pb.RemoveXattrRequest(inode=f.inode, name="user.mosafs.x"),
         Code.PERMISSION_DENIED),
        ("OpenWrite", pb.OpenWriteRequest(inode=link.inode), Code.INVALID_ARGUMENT),
        ("GetBlockMap", pb.GetBlockMapRequest(inode=fifo.inode), Code.INVALID_ARGUMENT),
        ("GetVersionStats", pb.GetVersionStatsRequest(inode=link.inode),
         Code.INVALID_ARGUMENT),
        ("SetAttr", pb.SetAttrRequest(inode=unknown, ctime_ns=1), Code.NOT_FOUND),
    ]
    for method, request, expected in cases:
        assert mgr.code_of(method, request) == expected, (method, request)
        assert mgr.serving()
    # The domain error arrives as its own class, message included.
    with pytest.raises(NoAttribute, match=r"user\.absent"):
        mgr("GetXattr", pb.GetXattrRequest(inode=f.inode, name="user.absent"))
    with pytest.raises(NotPermitted, match="device nodes"):
        mgr("Mknod", pb.MknodRequest(parent=ROOT, name="dev"))
    with pytest.raises(ValueTooLarge):
        mgr("SetXattr", xattr("user.big", b"v" * 65537))
    with pytest.raises(NotSupported):
        mgr("SetXattr", xattr("trusted.k"))
    with pytest.raises(NameTooLong):
        mgr("Symlink", pb.SymlinkRequest(parent=ROOT, name="s", target=b"t" * 4096))
    with pytest.raises(InvalidArgument, match="not a symbolic link"):
        mgr("Readlink", pb.ReadlinkRequest(inode=f.inode))
    # The per-inode limit: 1 MiB of attributes.
    for i in range(15):
        mgr("SetXattr", xattr(f"user.v{i:02d}", b"v" * 65536))
    assert mgr.code_of("SetXattr", xattr("user.v99", b"v" * 65536)) == Code.RESOURCE_EXHAUSTED
    with pytest.raises(NoSpace):
        mgr("SetXattr", xattr("user.v99", b"v" * 65536))
    # Nothing the refusals touched changed.
    assert [e.name for e in mgr("ReadDir", pb.ReadDirRequest(inode=ROOT)).entries] == [
        "d", "f", "l", "p"]
    assert mgr("GetAttr", pb.GetAttrRequest(inode=f.inode)).nlink == 1
    assert mgr("GetXattr", pb.GetXattrRequest(inode=f.inode, name="user.k")).value == b"v"
    assert len(mgr("ListXattr", pb.ListXattrRequest(inode=f.inode)).names) == 16


def test_undecodable_xattr_and_link_requests_are_invalid_argument(mgr: Mgr) -> None:
    undecodable = [
        ("SetXattr", b"\x08\x01\x12\x02\xff\xfe"),  # inode=1, name not UTF-8
        ("Symlink", b"\x08\x01\x12\x02\xc3("),  # parent=1, name not UTF-8
        ("Link", b"\x08"),  # a varint cut short
    ]
    for method, raw in undecodable:
        rpc = mgr.channel.unary_unary(f"/mosafs.v1.Manager/{method}")
        with pytest.raises(grpc.RpcError) as info:
            rpc(raw, timeout=10)
        assert info.value.code() == Code.INVALID_ARGUMENT, method
        assert mgr.serving()


def test_links_symlinks_and_xattrs_survive_sigkill(start_manager: Callable[..., Mgr],
                                                   tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = start_manager(data_dir=data)
    f = first("Create", pb.CreateRequest(parent=ROOT, name="f", mode=0o644))
    first("Link", pb.LinkRequest(inode=f.inode, new_parent=ROOT, new_name="g"))
    link = first("Symlink", pb.SymlinkRequest(parent=ROOT, name="l", target=b"g"))
    first("SetXattr", pb.SetXattrRequest(inode=f.inode, name="user.k", value=b"v"))
    first.proc.kill(signal.SIGKILL)
    second = start_manager(data_dir=data)
    assert second("Lookup", pb.LookupRequest(parent=ROOT, name="g")).nlink == 2
    assert second("Readlink", pb.ReadlinkRequest(inode=link.inode)).target == b"g"
    assert second("GetXattr", pb.GetXattrRequest(inode=f.inode, name="user.k")).value == b"v"


def test_open_write_without_benefactors_is_unavailable(mgr: Mgr) -> None:
    f = mgr("Create", pb.CreateRequest(parent=ROOT, name="f", mode=0o644))
    request = pb.OpenWriteRequest(inode=f.inode, client_id="c")
    assert mgr.code_of("OpenWrite", request) == Code.UNAVAILABLE
    with pytest.raises(Unavailable, match="no live benefactor"):
        mgr("OpenWrite", request)


def test_write_session_round_trip(mgr: Mgr) -> None:
    reply = register(mgr, "bf-1", 7101)
    assert (reply.heartbeat_interval_ms, reply.lease_ms) == (1000, 5000)
    register(mgr, "bf-2", 7102)
    f = mgr("Create", pb.CreateRequest(parent=ROOT, name="ckpt", mode=0o644))
    opened = mgr("OpenWrite", pb.OpenWriteRequest(inode=f.inode, client_id="c"))
    assert [(t.id, t.address) for t in opened.targets] == [
        ("bf-1", "127.0.0.1:7101"), ("bf-2", "127.0.0.1:7102")]
    assert opened.pool.chunker == "cdc:262144:1048576:4194304" and opened.pool.stripe_width == 3
    assert opened.base_version == 0 and opened.lease_ttl_ms == 60_000
    assert mgr("RenewLease", pb.RenewLeaseRequest(lease_id=opened.lease_id)).lease_ttl_ms
    chunks = [common_pb2.ChunkRef(id=cid(1), length=MiB), common_pb2.ChunkRef(id=cid(2), length=5)]
    committed = mgr("CommitVersion", pb.CommitVersionRequest(
        lease_id=opened.lease_id, inode=f.inode, chunks=chunks, mtime_ns=99, new_bytes=MiB + 5,
        placements=[pb.ChunkPlacement(id=cid(1), benefactor_ids=["bf-1"]),
                    pb.ChunkPlacement(id=cid(2), benefactor_ids=["bf-2"])]))
    assert committed.version == 1 and committed.attr.size == MiB + 5
    bm = mgr("GetBlockMap", pb.GetBlockMapRequest(inode=f.inode))
    assert (bm.version, bm.size, list(bm.chunks)) == (1, MiB + 5, chunks)
    assert {loc.id: list(loc.benefactor_ids) for loc in bm.locations} == {
        cid(1): ["bf-1"], cid(2): ["bf-2"]}
    assert {(b.id, b.address) for b in bm.benefactors} == {
        ("bf-1", "127.0.0.1:7101"), ("bf-2", "127.0.0.1:7102")}
    present = mgr("FindChunks", pb.FindChunksRequest(ids=[cid(2), cid(3)])).present
    assert list(present) == [True, False]
    # The next write dedupes against version 1.
    opened = mgr("OpenWrite", pb.OpenWriteRequest(inode=f.inode, client_id="c"))
    assert opened.targets[0].id == "bf-2"  # round-robin moved on
    assert (opened.base_version, opened.base_size, list(opened.base_chunks)) == (
        1, MiB + 5, chunks)
    mgr("CommitVersion", pb.CommitVersionRequest(
        lease_id=opened.lease_id, inode=f.inode, chunks=chunks[:1], new_bytes=0))
    stats = mgr("GetVersionStats", pb.GetVersionStatsRequest(inode=f.inode))
    assert (stats.version, stats.chunks, stats.shared_chunks, stats.base_version) == (2, 1, 1, 1)
    listed = mgr("ListBenefactors", pb.ListBenefactorsRequest()).benefactors
    assert [(s.info.id, s.alive) for s in listed] == [("bf-1", True), ("bf-2", True)]
    mgr("Heartbeat", pb.HeartbeatRequest(info=listed[0].info))
    with pytest.raises(NotFound):
        mgr("Heartbeat", pb.HeartbeatRequest(
            info=benefactor_pb2.BenefactorInfo(id="stranger", address="h:1")))


def test_malformed_requests_get_status_codes_and_the_server_keeps_serving(mgr: Mgr) -> None:
    register(mgr, "bf-1", 7201)
    f = mgr("Create", pb.CreateRequest(parent=ROOT, name="f", mode=0o644))
    lease = mgr("OpenWrite", pb.OpenWriteRequest(inode=f.inode, client_id="c")).lease_id

    def commit(ids: list[bytes], length: int = 10) -> pb.CommitVersionRequest:
        return pb.CommitVersionRequest(
            lease_id=lease, inode=f.inode,
            chunks=[common_pb2.ChunkRef(id=i, length=length) for i in ids],
            placements=[pb.ChunkPlacement(id=i, benefactor_ids=["bf-1"]) for i in ids])

    cases: list[tuple[str, Any, grpc.StatusCode]] = [
        ("CommitVersion", commit([b"../x"]), Code.INVALID_ARGUMENT),
        ("CommitVersion", commit([cid(1) + b"\0"]), Code.INVALID_ARGUMENT),
        ("CommitVersion", commit([cid(1)], length=0), Code.INVALID_ARGUMENT),
        ("CommitVersion", pb.CommitVersionRequest(
            lease_id=lease, inode=f.inode, chunks=[common_pb2.ChunkRef(id=cid(9), length=1)]),
         Code.FAILED_PRECONDITION),
        ("CommitVersion", pb.CommitVersionRequest(lease_id=lease + 10**6, inode=f.inode),
         Code.FAILED_PRECONDITION),
        ("FindChunks", pb.FindChunksRequest(ids=[b"../x"]), Code.INVALID_ARGUMENT),
        ("FindChunks", pb.FindChunksRequest(ids=[b"\0" * 33]), Code.INVALID_ARGUMENT),
        ("LocateChunks", pb.LocateChunksRequest(ids=[b"x"]), Code.INVALID_ARGUMENT),
        ("Lookup", pb.LookupRequest(parent=ROOT, name="a/b"), Code.INVALID_ARGUMENT),
        ("Create", pb.CreateRequest(parent=ROOT, name="../etc"), Code.INVALID_ARGUMENT),
        ("Mkdir", pb.MkdirRequest(parent=ROOT, name=".."), Code.INVALID_ARGUMENT),
        ("Mkdir", pb.MkdirRequest(parent=ROOT, name="x" * 256), Code.INVALID_ARGUMENT),
        ("Rename", pb.RenameRequest(old_parent=ROOT, old_name="f", new_parent=ROOT,
                                    new_name="a/b"), Code.INVALID_ARGUMENT),
        ("GetAttr", pb.GetAttrRequest(inode=0), Code.NOT_FOUND),
        ("GetAttr", pb.GetAttrRequest(inode=2**64 - 1), Code.NOT_FOUND),
        ("ReadDir", pb.ReadDirRequest(inode=f.inode), Code.FAILED_PRECONDITION),
        ("GetBlockMap", pb.GetBlockMapRequest(inode=123456), Code.NOT_FOUND),
        ("GetBlockMap", pb.GetBlockMapRequest(inode=f.inode, version=5), Code.NOT_FOUND),
        ("GetVersionStats", pb.GetVersionStatsRequest(inode=f.inode), Code.NOT_FOUND),
        ("OpenWrite", pb.OpenWriteRequest(inode=ROOT), Code.FAILED_PRECONDITION),
        ("SetAttr", pb.SetAttrRequest(inode=f.inode, mode=0o777777), Code.INVALID_ARGUMENT),
        ("RenewLease", pb.RenewLeaseRequest(lease_id=1), Code.FAILED_PRECONDITION),
        ("RegisterBenefactor", pb.RegisterBenefactorRequest(
            info=benefactor_pb2.BenefactorInfo(id="../evil", address="h:1")),
         Code.INVALID_ARGUMENT),
        ("RegisterBenefactor", pb.RegisterBenefactorRequest(
            info=benefactor_pb2.BenefactorInfo(id="ok", address="h:99999")),
         Code.INVALID_ARGUMENT),
    ]
    for method, request, expected in cases:
        assert mgr.code_of(method, request) == expected, (method, request)
        assert mgr.serving()
    # The lease survived the refused commits: a correct one succeeds.
    assert mgr("CommitVersion", commit([cid(1)])).version == 1
    with pytest.raises(InvalidArgument):
        call(mgr.stub.FindChunks, pb.FindChunksRequest(ids=[b"../x"]))


def test_undecodable_requests_are_invalid_argument(mgr: Mgr) -> None:
    undecodable = [
        ("Lookup", b"\x08\x01\x12\x02\xff\xfe"),  # parent=1, name: 2 bytes, not UTF-8
        ("CommitVersion", b"\xff\xff\xff"),  # not the protobuf wire format
        ("Mkdir", b"\x12\x05ab"),  # a string field cut short
    ]
    for method, raw in undecodable:
        rpc = mgr.channel.unary_unary(f"/mosafs.v1.Manager/{method}")
        with pytest.raises(grpc.RpcError) as info:
            rpc(raw, timeout=10)
        assert info.value.code() == Code.INVALID_ARGUMENT, method
        assert "malformed request" in (info.value.details() or "")
        assert mgr.serving()
    # Well-formed raw bytes still reach the servicer.
    rpc = mgr.channel.unary_unary("/mosafs.v1.Manager/GetAttr")
    assert pb.Attr.FromString(rpc(pb.GetAttrRequest(inode=ROOT).SerializeToString())).inode == 1


def test_oversized_message_is_resource_exhausted(mgr: Mgr) -> None:
    # The test's channel sends what the standard channel would refuse to send.
    big = grpc.insecure_channel(mgr.proc.address, options=[
        ("grpc.max_send_message_length", 128 * MiB)])
    try:
        stub = pb_grpc.ManagerStub(big)
        request = pb.FindChunksRequest(ids=[b"\0" * (65 * MiB)])
        assert mgr.code_of("FindChunks", request, stub) == Code.RESOURCE_EXHAUSTED
    finally:
        big.close()
    assert mgr.serving()


def test_committed_version_survives_sigkill(start_manager: Callable[..., Mgr],
                                            tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = start_manager(data_dir=data)
    register(first, "bf-1", 7301)
    f = first("Create", pb.CreateRequest(parent=ROOT, name="ckpt", mode=0o644))
    chunks = [(cid(i), 1000 + i) for i in range(50)]
    committed = write(first, f.inode, chunks)
    first.proc.kill(signal.SIGKILL)  # right after CommitVersion returned
    assert first.proc.popen.returncode == -signal.SIGKILL

    second = start_manager(data_dir=data)
    bm = second("GetBlockMap", pb.GetBlockMapRequest(inode=f.inode))
    assert bm.version == committed.version == 1
    assert [(c.id, c.length) for c in bm.chunks] == chunks
    assert {b.id for b in bm.benefactors} == {"bf-1"}
    assert second("Lookup", pb.LookupRequest(parent=ROOT, name="ckpt")) == committed.attr
    # The registration persisted, the liveness did not: re-registration brings it back.
    listed = second("ListBenefactors", pb.ListBenefactorsRequest()).benefactors
    assert [(s.info.id, s.alive, s.last_heartbeat_age_ms) for s in listed] == [
        ("bf-1", False, -1)]
    register(second, "bf-1", 7301)
    assert write(second, f.inode, chunks[:10]).version == 2


def test_pool_flags_update_the_default_pool(start_manager: Callable[..., Mgr],
                                            tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = start_manager("--stripe-width", "2", "--chunker", "fixed:65536",
                          "--replication", "2", "--write-semantics", "pessimistic",
                          data_dir=data)
    for i in range(3):
        register(first, f"bf-{i}", 7400 + i)
    f = first("Create", pb.CreateRequest(parent=ROOT, name="f", mode=0o644))
    opened = first("OpenWrite", pb.OpenWriteRequest(inode=f.inode))
    assert len(opened.targets) == 2
    assert (opened.pool.name, opened.pool.chunker, opened.pool.replication,
            opened.pool.write_semantics) == ("default", "fixed:65536", 2, "pessimistic")
    first.close()
    first.proc.stop()
    # Flags left out keep the stored settings; given ones replace them.
    second = start_manager("--replication", "1", data_dir=data)
    for i in range(3):
        register(second, f"bf-{i}", 7400 + i)
    pool = second("OpenWrite", pb.OpenWriteRequest(inode=f.inode)).pool
    assert (pool.stripe_width, pool.chunker, pool.replication) == (2, "fixed:65536", 1)


def run_manager(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mosafs", "manager", *args, "--insecure"],
                          capture_output=True, text=True, timeout=60)


def test_bad_flags_exit_with_one_line_reason(tmp_path: Path) -> None:
    done = run_manager("--data-dir", str(tmp_path / "d"), "--chunker", "cdc:1:3:2")
    assert done.returncode == 2
    assert "chunker 'cdc:1:3:2'" in done.stderr and "Traceback" not in done.stderr
    done = run_manager("--data-dir", str(tmp_path / "d"), "--listen", "nonsense")
    assert done.returncode == 2 and "HOST:PORT" in done.stderr


def test_second_manager_on_the_same_data_dir_is_refused(mgr: Mgr, tmp_path: Path) -> None:
    done = run_manager("--data-dir", str(tmp_path / "data"))
    assert done.returncode == 2
    assert "another manager is running" in done.stderr and "Traceback" not in done.stderr
    assert mgr.serving()


def test_inventory_reports_are_checked_and_the_server_keeps_serving(mgr: Mgr) -> None:
    register(mgr, "bf-1", 7101)
    entry = pb.InventoryEntry(id=cid(1), touched_ns=1, length=5)
    stranger = pb.InventoryReport(benefactor_id="stranger", entries=[entry])
    assert mgr.code_of("ReportInventory", stranger) == grpc.StatusCode.NOT_FOUND
    for bad_id in (b"", b"../x", b"\x00" * 31, b"\x00" * 33):
        bad = pb.InventoryReport(benefactor_id="bf-1", entries=[
            pb.InventoryEntry(id=bad_id, touched_ns=1)])
        assert mgr.code_of("ReportInventory", bad) == grpc.StatusCode.INVALID_ARGUMENT
    too_many = pb.InventoryReport(benefactor_id="bf-1", entries=[entry] * 16_385)
    assert mgr.code_of("ReportInventory", too_many) == grpc.StatusCode.INVALID_ARGUMENT
    bad_bid = pb.InventoryReport(benefactor_id="../bf", entries=[entry])
    assert mgr.code_of("ReportInventory", bad_bid) == grpc.StatusCode.INVALID_ARGUMENT
    # A chunk the index does not know waits for the grace period (600 s by default).
    reply = mgr("ReportInventory", pb.InventoryReport(benefactor_id="bf-1", entries=[entry]))
    assert (list(reply.release), reply.waiting) == ([], 1)
    # A referenced chunk reported by a benefactor the record does not name counts again.
    register(mgr, "bf-2", 7102)
    f = mgr("Create", pb.CreateRequest(parent=ROOT, name="inv", mode=0o644))
    write(mgr, f.inode, [(cid(2), 7)])
    located = mgr("LocateChunks", pb.LocateChunksRequest(ids=[cid(2)])).locations[0]
    other = ({"bf-1", "bf-2"} - set(located.benefactor_ids)).pop()
    reply = mgr("ReportInventory", pb.InventoryReport(benefactor_id=other, entries=[
        pb.InventoryEntry(id=cid(2), touched_ns=1, length=7)]))
    assert (list(reply.release), reply.waiting) == ([], 0)
    located = mgr("LocateChunks", pb.LocateChunksRequest(ids=[cid(2)])).locations[0]
    assert set(located.benefactor_ids) == {"bf-1", "bf-2"}
    assert mgr.serving()


def test_integrity_rpcs_over_grpc(mgr: Mgr) -> None:
    register(mgr, "b1", 7001)
    f = mgr("Create", pb.CreateRequest(parent=ROOT, name="f", mode=0o644)).inode
    write(mgr, f, [(cid(1), 10), (cid(2), 20)])
    report = mgr("Fsck", pb.FsckRequest())
    assert list(report.findings) == [] and not report.repaired and report.chunks == 2
    # A corrupt copy reported: the only holder goes, the referenced record stays (lost).
    mgr("ReportCorruptChunks", pb.CorruptChunksReport(benefactor_id="b1", ids=[cid(1)]))
    located = mgr("LocateChunks", pb.LocateChunksRequest(ids=[cid(1), cid(2)]))
    holders = {loc.id: list(loc.benefactor_ids) for loc in located.locations}
    assert holders == {cid(1): [], cid(2): ["b1"]}
    assert list(mgr("Fsck", pb.FsckRequest(repair=True)).findings) == []
    bad = [
        ("ReportCorruptChunks", pb.CorruptChunksReport(benefactor_id="b1", ids=[b"short"]),
         grpc.StatusCode.INVALID_ARGUMENT),
        ("ReportCorruptChunks", pb.CorruptChunksReport(benefactor_id="../x", ids=[]),
         grpc.StatusCode.INVALID_ARGUMENT),
        ("ReportCorruptChunks", pb.CorruptChunksReport(benefactor_id="nobody", ids=[]),
         grpc.StatusCode.NOT_FOUND),
    ]
    for method, request, code in bad:
        assert mgr.code_of(method, request) == code, method
    # b1 is registered (alive) but nothing listens there: the scrub reports it, and ends.
    events = list(mgr.stub.Scrub(pb.ClusterScrubRequest(), timeout=30))
    assert events[-1].done and [r.id for r in events[-1].results] == ["b1"]
    assert events[-1].results[0].error and events[-1].results[0].checked_chunks == 0
    assert mgr.serving()


def test_lifecycle_rpcs_refuse_bad_input_and_the_server_keeps_serving(mgr: Mgr) -> None:
    """Versions, folder settings, pruning, pools and benefactor administration: every bad
    request gets a status code a person can act on; nothing changes; the server serves."""
    d = mgr("Mkdir", pb.MkdirRequest(parent=ROOT, name="d", mode=0o755)).inode
    f = mgr("Create", pb.CreateRequest(parent=d, name="f", mode=0o644)).inode
    bad = [
        ("ListVersions", pb.ListVersionsRequest(inode=d), Code.FAILED_PRECONDITION),
        ("ListVersions", pb.ListVersionsRequest(inode=999), Code.NOT_FOUND),
        ("RestoreVersion", pb.RestoreVersionRequest(inode=f, version=1), Code.NOT_FOUND),
        ("RestoreVersion", pb.RestoreVersionRequest(inode=f), Code.INVALID_ARGUMENT),
        ("SetFolderSettings", pb.SetFolderSettingsRequest(
            inode=f, policy=pb.PrunePolicy(keep_last=1)), Code.FAILED_PRECONDITION),
        ("SetFolderSettings", pb.SetFolderSettingsRequest(inode=d, pool="nope"),
         Code.NOT_FOUND),
        ("SetFolderSettings", pb.SetFolderSettingsRequest(inode=d, series_pattern="{a"),
         Code.INVALID_ARGUMENT),
        ("SetFolderSettings", pb.SetFolderSettingsRequest(
            inode=d, policy=pb.PrunePolicy(keep_every=2)), Code.INVALID_ARGUMENT),
        ("SetFolderSettings", pb.SetFolderSettingsRequest(
            inode=d, policy=pb.PrunePolicy(purge_after_ms=1 << 62)), Code.INVALID_ARGUMENT),
        ("GetFolderSettings", pb.GetFolderSettingsRequest(inode=0), Code.NOT_FOUND),
        ("Prune", pb.PruneRequest(inode=f), Code.FAILED_PRECONDITION),
        ("Prune", pb.PruneRequest(inode=d, policy=pb.PrunePolicy(keep_last=1)),
         Code.INVALID_ARGUMENT),
        ("CreatePool", pb.PoolRequest(name="../x"), Code.INVALID_ARGUMENT),
        ("CreatePool", pb.PoolRequest(name="default"), Code.ALREADY_EXISTS),
        ("CreatePool", pb.PoolRequest(name="p", chunker="cdc:1:2"), Code.INVALID_ARGUMENT),
        ("CreatePool", pb.PoolRequest(name="p", stripe_width=0), Code.INVALID_ARGUMENT),
        ("UpdatePool", pb.PoolRequest(name="nope", replication=2), Code.NOT_FOUND),
        ("UpdatePool", pb.PoolRequest(name="default", write_semantics="maybe"),
         Code.INVALID_ARGUMENT),
        ("GetPool", pb.GetPoolRequest(name=""), Code.NOT_FOUND),
        ("SetFolderSettings", pb.SetFolderSettingsRequest(inode=d, pool="p" * 600),
         Code.NOT_FOUND),
        ("DeletePool", pb.DeletePoolRequest(name="default"), Code.PERMISSION_DENIED),
        ("MoveBenefactor", pb.MoveBenefactorRequest(id="nope", pool="default"),
         Code.NOT_FOUND),
        ("MoveBenefactor", pb.MoveBenefactorRequest(id="bad id!", pool="default"),
         Code.INVALID_ARGUMENT),
        ("DrainBenefactor", pb.DrainBenefactorRequest(id="nope"), Code.NOT_FOUND),
        ("GetDrainStatus", pb.DrainStatusRequest(id=""), Code.INVALID_ARGUMENT),
        ("RemoveBenefactor", pb.RemoveBenefactorRequest(id="nope"), Code.NOT_FOUND),
    ]
    for method, request, code in bad:
        assert mgr.code_of(method, request) == code, (method, request)
        assert mgr.serving()
    assert [p.settings.name for p in mgr("ListPools", pb.ListPoolsRequest()).pools] == \
        ["default"]
    assert list(mgr("ListFolderSettings", pb.ListFolderSettingsRequest()).folders) == []
    assert mgr("Prune", pb.PruneRequest(dry_run=True)).pruned == []
