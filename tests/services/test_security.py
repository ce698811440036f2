"""Mutual TLS, roles and metrics on real manager and benefactor processes: certificates
made by `mosafs certs`; a caller without a valid certificate is refused by both; an
ordinary client certificate cannot run admin RPCs; every process's /metrics parses."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mosafs import certs
from mosafs._proto import benefactor_pb2 as bpb
from mosafs._proto import benefactor_pb2_grpc as bgrpc
from mosafs._proto import manager_pb2 as mpb
from mosafs._proto import manager_pb2_grpc as mgrpc
from mosafs.ids import chunk_id
from mosafs.rpc.channels import channel
from mosafs.rpc.chunkwire import TOKEN_KEY
from tests import harness
from tests.harness import cli, scrape

Code = grpc.StatusCode


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cluster CA and a certificate of every role, made by the CLI."""
    directory = tmp_path_factory.mktemp("tls")
    assert cli("certs", "init", "--dir", str(directory)).returncode == 0
    for name in ("manager", "benefactor", "client", "admin"):
        done = cli("certs", "issue", name, "--role", name, "--dir", str(directory))
        assert done.returncode == 0, done.stderr
    return directory


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> certs.Identity:
    """A client certificate of another CA."""
    other = tmp_path_factory.mktemp("other-ca")
    certs.init_ca(other)
    certs.issue(other, "client", "client")
    return certs.load(other, "client")


@pytest.fixture(scope="module")
def cluster(tls: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:  # type: ignore[type-arg]
    """A TLS manager and a TLS benefactor registered with it."""
    work = tmp_path_factory.mktemp("secure")
    manager = harness.start("manager", ["manager", "--data-dir", str(work / "m"),
                                        "--tls-dir", str(tls)], work)
    benefactor = harness.start("benefactor", [
        "benefactor", "--data-dir", str(work / "b"), "--manager", manager.address,
        "--tls-dir", str(tls)], work)
    try:
        with channel(manager.address, certs.load(tls, "admin")) as ch:
            stub = mgrpc.ManagerStub(ch)
            deadline = time.monotonic() + 30
            while not any(b.alive for b in stub.ListBenefactors(
                    mpb.ListBenefactorsRequest(), timeout=10).benefactors):
                assert time.monotonic() < deadline, "the TLS benefactor did not register"
                time.sleep(0.1)
        yield {"manager": manager, "benefactor": benefactor}
    finally:
        harness.stop_every([manager, benefactor])


def identity(tls: Path, name: str, directory: Path | None = None) -> certs.Identity:
    return certs.load(directory or tls, name)


def code_of(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()  # type: ignore[no-any-return]


def test_services_callers_without_a_valid_certificate_are_refused(
        cluster, stranger: certs.Identity) -> None:  # type: ignore[no-untyped-def]
    for who in (None, stranger):  # no certificate at all; one of another CA
        with channel(cluster["manager"].address, who) as ch:
            assert code_of(lambda ch=ch: mgrpc.ManagerStub(ch).GetAttr(
                mpb.GetAttrRequest(inode=1), timeout=5)) == Code.UNAVAILABLE  # handshake
        with channel(cluster["benefactor"].address, who) as ch:
            assert code_of(lambda ch=ch: bgrpc.BenefactorStub(ch).GetChunk(
                bpb.GetChunkRequest(id=bytes(32)), timeout=5)) == Code.UNAVAILABLE
    # The CLI says why in one line.
    done = cli("status", "--manager", cluster["manager"].address, "--insecure")
    assert done.returncode == 7 and len(done.stderr.strip().splitlines()) == 1


def test_services_roles_decide_what_a_certificate_may_call(cluster, tls: Path) -> None:
    manager, benefactor = cluster["manager"].address, cluster["benefactor"].address
    client, admin = identity(tls, "client"), identity(tls, "admin")
    with channel(manager, client) as ch:
        stub = mgrpc.ManagerStub(ch)
        assert stub.GetAttr(mpb.GetAttrRequest(inode=1), timeout=10).inode == 1
        for method, request in [("CollectGarbage", mpb.CollectGarbageRequest()),
                                ("CreatePool", mpb.PoolRequest(name="p")),
                                ("SetFolderSettings", mpb.SetFolderSettingsRequest(inode=1)),
                                ("Fsck", mpb.FsckRequest()),
                                ("DrainBenefactor", mpb.DrainBenefactorRequest(id="x")),
                                ("RegisterBenefactor", mpb.RegisterBenefactorRequest())]:
            with pytest.raises(grpc.RpcError) as info:
                getattr(stub, method)(request, timeout=10)
            assert info.value.code() == Code.PERMISSION_DENIED, method
            assert "needs a certificate of role" in (info.value.details() or "")
    with channel(manager, admin) as ch:
        stub = mgrpc.ManagerStub(ch)
        assert stub.Fsck(mpb.FsckRequest(), timeout=30).findings == []
        assert stub.CreatePool(mpb.PoolRequest(name="p"), timeout=10).settings.name == "p"
    with channel(manager, identity(tls, "benefactor")) as ch:
        assert code_of(lambda: mgrpc.ManagerStub(ch).Lookup(
            mpb.LookupRequest(parent=1, name="x"), timeout=10)) == Code.PERMISSION_DENIED
    data = b"a chunk stored over mutual TLS"
    # Chunk bytes move against tokens the manager signs (tests/services/test_chunk_tokens.py).
    with channel(manager, admin) as ch:
        shared = mgrpc.ManagerStub(ch).Create(mpb.CreateRequest(
            parent=1, name="shared", mode=0o666), timeout=10).inode
    with channel(manager, client) as ch:
        stub = mgrpc.ManagerStub(ch)
        lease = stub.OpenWrite(mpb.OpenWriteRequest(inode=shared, client_id="t"), timeout=10)
        located = stub.LocateChunks(mpb.LocateChunksRequest(ids=[chunk_id(data)]), timeout=10)
    write = ((TOKEN_KEY, lease.write_token),)
    read = ((TOKEN_KEY, located.unindexed[0].token),)
    with channel(benefactor, client) as ch:
        stub = bgrpc.BenefactorStub(ch)
        stub.PutChunk(bpb.PutChunkRequest(id=chunk_id(data), data=data), timeout=10,
                      metadata=write)
        assert stub.GetChunk(bpb.GetChunkRequest(id=chunk_id(data)), timeout=10,
                             metadata=read).data == data
        assert code_of(lambda: stub.RunGarbageRound(bpb.GarbageRoundRequest(), timeout=10)) \
            == Code.PERMISSION_DENIED
        assert code_of(lambda: stub.DeleteChunks(bpb.DeleteChunksRequest(
            ids=[chunk_id(data)], put_before_ns=time.time_ns()), timeout=10)) \
            == Code.PERMISSION_DENIED
    # The admin commands: an ordinary client certificate is refused with exit code 77.
    done = cli("gc", "--manager", manager, "--tls-dir", str(tls), "--tls-name", "client")
    assert done.returncode == 77 and "needs a certificate of role admin" in done.stderr
    assert cli("gc", "--manager", manager, "--tls-dir", str(tls)).returncode == 0


def test_services_metrics_endpoints_parse(cluster) -> None:
    manager = scrape(cluster["manager"].ready["metrics"])
    benefactor = scrape(cluster["benefactor"].ready["metrics"])
    assert manager["mosafs_manager_benefactors{state=alive}"] == 1
    assert "mosafs_manager_under_replicated_chunks{}" in manager
    assert any(k.startswith("mosafs_rpc_server_seconds_count{method=RegisterBenefactor")
               for k in manager)
    assert any(k.startswith("mosafs_rpc_server_errors_total{code=PERMISSION_DENIED")
               for k in manager)  # the refusals of the test before
    assert "mosafs_benefactor_free_bytes{}" in benefactor
    assert benefactor["mosafs_benefactor_put_chunks_total{outcome=stored}"] >= 1
    assert any(k.startswith("mosafs_rpc_client_seconds_count{method=Heartbeat")
               for k in benefactor)
