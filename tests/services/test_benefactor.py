"""The benefactor as a real process (`python -m mosafs benefactor`), spoken to over a real
gRPC channel with the generated stub. Every process is stopped at the end of its test and
its log must hold no noise (WARNING/ERROR/Traceback) beyond what a test declares.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import blake3
import grpc
import pytest

from mosafs._proto import benefactor_pb2 as pb
from mosafs._proto import benefactor_pb2_grpc as pb_grpc
from mosafs.ids import chunk_id
from mosafs.procutil import free_port
from mosafs.rpc.channels import MAX_MESSAGE_BYTES, channel
from tests.harness import Proc, start

Stub = pb_grpc.BenefactorStub
TIMEOUT = 30.0
# Standalone unless a test names a manager, whatever the caller's environment says.
STANDALONE_ENV = {"MOSAFS_MANAGER": ""}


def blob(seed: str, size: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=size)


def code_of(method: Callable[..., Any], request: Any) -> tuple[grpc.StatusCode, str]:
    """The status code and details a call fails with (it must fail)."""
    with pytest.raises(grpc.RpcError) as info:
        method(request, timeout=TIMEOUT)
    err: Any = info.value
    return err.code(), err.details() or ""


def chunk_path(data_dir: Path, raw: bytes) -> Path:
    name = raw.hex()
    return data_dir / "chunks" / name[:2] / name[2:4] / name


def start_benefactor(workdir: Path, *extra: str, name: str = "benefactor",
                     env: dict[str, str] | None = None) -> Proc:
    data_dir = workdir / f"{name}-data"
    return start(name, ["benefactor", "--data-dir", str(data_dir), *extra], workdir,
                 env=env if env is not None else STANDALONE_ENV)


def stop_clean(proc: Proc) -> None:
    """Stop with SIGTERM, assert no noise and exit code 0."""
    proc.stop()
    assert proc.popen.returncode == 0, proc.log()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Processes a test starts; each still running at the end is stopped and checked."""
    started: list[Proc] = []
    try:
        yield started
    finally:
        failures: list[AssertionError] = []
        for proc in reversed(started):
            if proc.alive():
                try:
                    stop_clean(proc)
                except AssertionError as exc:  # stop the others before reporting
                    failures.append(exc)
                finally:
                    proc.kill()
        if failures:
            raise failures[0]


@pytest.fixture
def benefactor(tmp_path: Path, procs: list[Proc]) -> Proc:
    proc = start_benefactor(tmp_path)
    procs.append(proc)
    return proc


@pytest.fixture
def stub(benefactor: Proc) -> Iterator[Stub]:
    ch = channel(benefactor.address)
    try:
        yield Stub(ch)
    finally:
        ch.close()


def put(stub: Stub, data: bytes) -> bool:
    reply = stub.PutChunk(pb.PutChunkRequest(id=chunk_id(data), data=data), timeout=TIMEOUT)
    return bool(reply.already_present)


def assert_serving(stub: Stub, seed: str = "still-serving") -> None:
    data = blob(seed, 2048)
    put(stub, data)
    reply = stub.GetChunk(pb.GetChunkRequest(id=chunk_id(data)), timeout=TIMEOUT)
    assert reply.data == data


# -- chunks -----------------------------------------------------------------------------


def test_services_benefactor_put_get_has_round_trip(benefactor: Proc, stub: Stub) -> None:
    data = blob("round-trip", 1 << 20)
    raw = chunk_id(data)
    assert put(stub, data) is False
    assert put(stub, data) is True
    assert stub.GetChunk(pb.GetChunkRequest(id=raw), timeout=TIMEOUT).data == data
    absent = chunk_id(b"absent")
    has = stub.HasChunks(pb.HasChunksRequest(ids=[raw, absent, raw]), timeout=TIMEOUT)
    assert list(has.present) == [True, False, True]
    stored = chunk_path(Path(benefactor.ready["data_dir"]), raw)
    assert stored.read_bytes() == data  # exactly the chunk's bytes, named by its id


def test_services_benefactor_grouped_put_answers_each_blob(benefactor: Proc,
                                                           stub: Stub) -> None:
    good = [blob(f"group-{i}", 1000 * (i + 1)) for i in range(3)]
    forged = blob("forged", 2048)
    entries = [pb.PutChunkRequest(id=chunk_id(b), data=b) for b in good]
    entries.insert(1, pb.PutChunkRequest(id=chunk_id(forged), data=forged[:-1] + b"!"))
    entries.append(pb.PutChunkRequest(id=b"../x", data=b"x"))
    reply = stub.PutChunks(pb.PutChunksRequest(chunks=entries), timeout=TIMEOUT)
    codes = [grpc.StatusCode.INVALID_ARGUMENT.value[0]]
    assert [o.code for o in reply.outcomes] == [0, *codes, 0, 0, *codes]
    assert "does not match its id" in reply.outcomes[1].error
    assert reply.outcomes[1].kind == "invalid-argument"
    assert "32 bytes" in reply.outcomes[4].error
    assert not any(o.already_present for o in reply.outcomes)
    # The good ones are stored whatever happened to the others; the forged one is not.
    for b in good:
        assert stub.GetChunk(pb.GetChunkRequest(id=chunk_id(b)), timeout=TIMEOUT).data == b
    has = stub.HasChunks(pb.HasChunksRequest(ids=[chunk_id(forged)]), timeout=TIMEOUT)
    assert list(has.present) == [False]
    again = stub.PutChunks(pb.PutChunksRequest(chunks=[entries[0], entries[2]]),
                           timeout=TIMEOUT)
    assert [(o.code, o.already_present) for o in again.outcomes] == [(0, True), (0, True)]
    empty = stub.PutChunks(pb.PutChunksRequest(), timeout=TIMEOUT)
    assert list(empty.outcomes) == []
    assert_serving(stub)


def test_services_benefactor_get_missing_is_not_found(benefactor: Proc, stub: Stub) -> None:
    raw = chunk_id(b"never stored")
    code, details = code_of(stub.GetChunk, pb.GetChunkRequest(id=raw))
    assert code == grpc.StatusCode.NOT_FOUND
    assert raw.hex() in details


def test_services_benefactor_mismatching_bytes_refused(benefactor: Proc, stub: Stub) -> None:
    data = blob("claimed", 4096)
    raw = chunk_id(data)
    code, details = code_of(stub.PutChunk, pb.PutChunkRequest(id=raw, data=data[:-1] + b"!"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not match its id" in details
    has = stub.HasChunks(pb.HasChunksRequest(ids=[raw]), timeout=TIMEOUT)
    assert list(has.present) == [False]
    assert stub.GetInfo(pb.GetInfoRequest(), timeout=TIMEOUT).chunks == 0


@pytest.mark.parametrize("bad_id", [b"../x", b"", b"\x01" * 31, b"\x01" * 33,
                                    b"../../../../../etc/passwd"],
                         ids=["dotdot", "empty", "31-bytes", "33-bytes", "traversal"])
def test_services_benefactor_invalid_ids_refused_and_still_serving(
    benefactor: Proc, stub: Stub, bad_id: bytes
) -> None:
    calls = [
        (stub.PutChunk, pb.PutChunkRequest(id=bad_id, data=b"x")),
        (stub.GetChunk, pb.GetChunkRequest(id=bad_id)),
        (stub.HasChunks, pb.HasChunksRequest(ids=[chunk_id(b"ok"), bad_id])),
        (stub.DeleteChunks, pb.DeleteChunksRequest(ids=[chunk_id(b"ok"), bad_id],
                                                   put_before_ns=time.time_ns())),
    ]
    for method, request in calls:
        code, details = code_of(method, request)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "32 bytes" in details
    assert_serving(stub)
    assert benefactor.alive()


def test_services_benefactor_deletes_what_was_not_put_since(benefactor: Proc,
                                                              stub: Stub) -> None:
    """DeleteChunks (the manager's collector): a chunk put at or after put_before_ns
    stays (a writer may be about to reference it), the others go; a malformed request
    deletes nothing."""
    old, fresh = blob("old", 4096), blob("fresh", 8192)
    put(stub, old)
    put(stub, fresh)
    cutoff = time.time_ns()
    time.sleep(0.02)
    put(stub, fresh)  # put again: its mtime moves past the cutoff
    ids = [chunk_id(old), chunk_id(fresh), chunk_id(b"never stored")]
    code, details = code_of(stub.DeleteChunks, pb.DeleteChunksRequest(ids=[ids[0], b"x"]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "32 bytes" in details
    assert stub.GetInfo(pb.GetInfoRequest(), timeout=TIMEOUT).chunks == 2
    reply = stub.DeleteChunks(pb.DeleteChunksRequest(ids=ids, put_before_ns=cutoff),
                              timeout=TIMEOUT)
    assert (reply.deleted_chunks, reply.freed_bytes) == (1, 4096)
    has = stub.HasChunks(pb.HasChunksRequest(ids=ids[:2]), timeout=TIMEOUT)
    assert list(has.present) == [False, True]
    too_many = pb.DeleteChunksRequest(ids=[chunk_id(b"x")] * 16_385, put_before_ns=cutoff)
    assert code_of(stub.DeleteChunks, too_many)[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert_serving(stub)


def test_services_benefactor_oversized_batch_refused(benefactor: Proc, stub: Stub) -> None:
    ids = [chunk_id(b"x")] * 100_001
    code, details = code_of(stub.HasChunks, pb.HasChunksRequest(ids=ids))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "too many ids" in details
    assert_serving(stub)


def test_services_benefactor_oversized_message_exhausted_and_still_serving(
    benefactor: Proc, stub: Stub
) -> None:
    # The client's own limit would refuse to send it: lift it so the server must answer.
    big = grpc.insecure_channel(benefactor.address,
                                options=[("grpc.max_send_message_length", -1)])
    try:
        data = bytes(MAX_MESSAGE_BYTES + (1 << 20))
        request = pb.PutChunkRequest(id=chunk_id(data), data=data)
        code, _ = code_of(Stub(big).PutChunk, request)
    finally:
        big.close()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_serving(stub)
    assert stub.GetInfo(pb.GetInfoRequest(), timeout=TIMEOUT).chunks == 1
    assert benefactor.alive()


def test_services_benefactor_corrupt_chunk_is_data_loss_never_bytes(
    benefactor: Proc, stub: Stub
) -> None:
    data = blob("to-corrupt", 100_000)
    raw = chunk_id(data)
    put(stub, data)
    path = chunk_path(Path(benefactor.ready["data_dir"]), raw)
    damaged = bytearray(path.read_bytes())
    damaged[50_000] ^= 0x40
    path.write_bytes(bytes(damaged))
    benefactor.expected_noise.append(rf"WARNING .*corrupt chunk {raw.hex()}")

    # Served without re-hashing (DESIGN §3): the reader's own check finds the damage ...
    served = stub.GetChunk(pb.GetChunkRequest(id=raw), timeout=TIMEOUT).data
    assert served == bytes(damaged) and chunk_id(served) != raw
    # ... and asks again with verify: the benefactor hashes its copy itself, deletes it
    code, details = code_of(stub.GetChunk, pb.GetChunkRequest(id=raw, verify=True))
    assert code == grpc.StatusCode.DATA_LOSS
    assert raw.hex() in details
    assert not path.exists()
    has = stub.HasChunks(pb.HasChunksRequest(ids=[raw]), timeout=TIMEOUT)
    assert list(has.present) == [False]  # not offered, so a good copy gets sent again
    assert put(stub, data) is False  # ... and repairs it
    assert stub.GetChunk(pb.GetChunkRequest(id=raw, verify=True), timeout=TIMEOUT).data == data
    assert f"corrupt chunk {raw.hex()}" in benefactor.log()


# -- info, identity, flags --------------------------------------------------------------


def test_services_benefactor_get_info_figures(benefactor: Proc, stub: Stub) -> None:
    sizes = [1000, 20_000, 300_000]
    for i, size in enumerate(sizes):
        put(stub, blob(f"info-{i}", size))
    info = stub.GetInfo(pb.GetInfoRequest(), timeout=TIMEOUT)
    data_dir = Path(benefactor.ready["data_dir"])
    identity = json.loads((data_dir / "benefactor.json").read_text())
    assert info.id == identity["id"] == benefactor.ready["id"]
    assert info.address == benefactor.address
    assert info.pool == ""  # no --pool: it stays in the pool it is registered in
    assert (info.chunks, info.stored_bytes) == (3, sum(sizes))
    assert 0 < info.free_bytes <= info.capacity_bytes
    assert benefactor.ready["pid"] == benefactor.popen.pid


def test_services_benefactor_capacity_pool_and_advertise_flags(
    tmp_path: Path, procs: list[Proc]
) -> None:
    port = free_port()
    proc = start_benefactor(tmp_path, "--capacity", "1M", "--pool", "fast",
                            "--listen", f"127.0.0.1:{port}",
                            "--advertise", f"storage-7.example:{port}")
    procs.append(proc)
    assert proc.address == f"storage-7.example:{port}"
    ch = channel(f"127.0.0.1:{port}")
    try:
        stub = Stub(ch)
        put(stub, blob("cap-a", 400_000))
        info = stub.GetInfo(pb.GetInfoRequest(), timeout=TIMEOUT)
        assert (info.capacity_bytes, info.free_bytes) == (1 << 20, (1 << 20) - 400_000)
        assert info.pool == "fast"
        assert info.address == f"storage-7.example:{port}"
        too_big = blob("cap-b", 700_000)
        code, details = code_of(stub.PutChunk,
                                pb.PutChunkRequest(id=chunk_id(too_big), data=too_big))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "capacity" in details
        # A grouped put past the capacity: what fits is stored, the rest refused as full.
        fits, over = blob("cap-c", 500_000), blob("cap-d", 700_000)  # either order
        reply = stub.PutChunks(pb.PutChunksRequest(chunks=[
            pb.PutChunkRequest(id=chunk_id(b), data=b) for b in (fits, over)]),
            timeout=TIMEOUT)
        assert [(o.code, o.kind) for o in reply.outcomes] == [
            (0, ""), (grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], "no-space")]
        assert "capacity" in reply.outcomes[1].error
        has = stub.HasChunks(pb.HasChunksRequest(ids=[chunk_id(fits), chunk_id(over)]),
                             timeout=TIMEOUT)
        assert list(has.present) == [True, False]
    finally:
        ch.close()


def test_services_benefactor_full_file_system_is_resource_exhausted(
    tmp_path: Path, procs: list[Proc]
) -> None:
    """The data directory's file system runs out while a put makes its fan-out directory
    (its temporary file took the last inode of a small tmpfs): RESOURCE_EXHAUSTED, which
    the writer answers by trying another benefactor; no INTERNAL, no traceback."""
    if os.geteuid() != 0:
        pytest.skip("mounts a tmpfs")
    fs = tmp_path / "fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,nr_inodes=600", "tmpfs",
                    str(fs)], check=True)
    try:
        proc = start("benefactor", ["benefactor", "--data-dir", str(fs / "data")], tmp_path,
                     env=STANDALONE_ENV)
        procs.append(proc)
        ch = channel(proc.address)
        try:
            stub = Stub(ch)
            stored = blob("full-before", 3000)
            put(stub, stored)
            filler = fs / "filler"
            filler.mkdir()
            while os.statvfs(fs).f_ffree > 1:
                (filler / os.urandom(8).hex()).touch()
            late, later = blob("full-late", 3000), blob("full-later", 3000)
            code, details = code_of(stub.PutChunk,
                                    pb.PutChunkRequest(id=chunk_id(late), data=late))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "file system is full" in details
            reply = stub.PutChunks(pb.PutChunksRequest(chunks=[
                pb.PutChunkRequest(id=chunk_id(b), data=b) for b in (stored, later)]),
                timeout=TIMEOUT)
            assert [(o.code, o.kind, o.already_present) for o in reply.outcomes] == [
                (0, "", True), (grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], "no-space", False)]
            has = stub.HasChunks(pb.HasChunksRequest(
                ids=[chunk_id(b) for b in (stored, late, later)]), timeout=TIMEOUT)
            assert list(has.present) == [True, False, False]
            assert os.listdir(fs / "data" / "tmp") == []
            shutil.rmtree(filler)  # room again: the same put stores it
            assert put(stub, late) is False
        finally:
            ch.close()
        stop_clean(proc)  # no traceback, no WARNING/ERROR in its log
    finally:
        for started in procs:  # a failed test's benefactor still holds the mount
            started.kill()
        subprocess.run(["umount", str(fs)], check=True)


def test_services_benefactor_restart_keeps_chunks_and_identity(
    tmp_path: Path, procs: list[Proc]
) -> None:
    first = start_benefactor(tmp_path)
    procs.append(first)
    data = blob("survives", 123_456)
    ch = channel(first.address)
    try:
        put(Stub(ch), data)
    finally:
        ch.close()
    stop_clean(first)

    second = start_benefactor(tmp_path)
    procs.append(second)
    assert second.ready["id"] == first.ready["id"]
    ch = channel(second.address)
    try:
        stub = Stub(ch)
        assert stub.GetChunk(pb.GetChunkRequest(id=chunk_id(data)), timeout=TIMEOUT).data == data
        info = stub.GetInfo(pb.GetInfoRequest(), timeout=TIMEOUT)
        assert (info.chunks, info.stored_bytes) == (1, len(data))
    finally:
        ch.close()


def test_services_benefactor_sigint_stops_cleanly(benefactor: Proc, stub: Stub) -> None:
    assert_serving(stub)
    benefactor.popen.send_signal(signal.SIGINT)
    assert benefactor.popen.wait(timeout=TIMEOUT) == 0
    assert benefactor.noise() == []


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`mosafs ARGS` on its own, plaintext (as the benefactors of these tests)."""
    return subprocess.run([sys.executable, "-m", "mosafs", *args], capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, **STANDALONE_ENV, "MOSAFS_INSECURE": "1"})


def test_services_benefactor_bad_listen_address_is_one_line_error(tmp_path: Path) -> None:
    result = run_cli("benefactor", "--data-dir", str(tmp_path / "d"), "--listen", "nowhere")
    assert result.returncode == 2
    assert "--listen must be HOST:PORT" in result.stderr
    assert "Traceback" not in result.stderr


def test_services_benefactor_bad_capacity_is_usage_error(tmp_path: Path) -> None:
    result = run_cli("benefactor", "--data-dir", str(tmp_path / "d"), "--capacity", "lots")
    assert result.returncode == 2
    assert "not a size in bytes: 'lots'" in result.stderr
    assert "Traceback" not in result.stderr


def test_services_benefactor_data_dir_in_use_is_refused(
    benefactor: Proc, stub: Stub
) -> None:
    result = run_cli("benefactor", "--data-dir", benefactor.ready["data_dir"])
    assert result.returncode == 2
    assert "in use by another process" in result.stderr
    assert "Traceback" not in result.stderr
    assert_serving(stub)


# -- the manager ------------------------------------------------------------------------


def test_services_benefactor_unreachable_manager_keeps_serving_quietly(
    tmp_path: Path, procs: list[Proc]
) -> None:
    # Starting before the manager is normal: INFO lines, no WARNING, and chunks are served.
    proc = start_benefactor(tmp_path, "--manager", f"127.0.0.1:{free_port()}")
    procs.append(proc)
    ch = channel(proc.address)
    try:
        assert_serving(Stub(ch))
    finally:
        ch.close()
    time.sleep(1.0)  # several registration attempts
    assert "not reachable yet" in proc.log()
    assert proc.log().count("not reachable yet") == 1  # one line, not one per attempt
    stop_clean(proc)


def list_benefactors(manager: Proc) -> dict[str, Any]:
    from mosafs._proto import manager_pb2, manager_pb2_grpc

    ch = channel(manager.address)
    try:
        reply = manager_pb2_grpc.ManagerStub(ch).ListBenefactors(
            manager_pb2.ListBenefactorsRequest(), timeout=TIMEOUT)
    finally:
        ch.close()
    return {b.info.id: b for b in reply.benefactors}


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def start_manager(workdir: Path, port: int, data: str = "manager-data") -> Proc:
    return start("manager", ["manager", "--data-dir", str(workdir / data),
                             "--listen", f"127.0.0.1:{port}"], workdir)


def alive_at(manager: Proc, bid: str) -> bool:
    entry = list_benefactors(manager).get(bid)
    return entry is not None and bool(entry.alive)


def test_services_benefactor_registers_and_heartbeats(
    tmp_path: Path, procs: list[Proc]
) -> None:
    manager = start_manager(tmp_path, free_port())
    procs.append(manager)
    proc = start_benefactor(tmp_path, "--manager", manager.address)
    procs.append(proc)
    bid = proc.ready["id"]
    wait_for(lambda: alive_at(manager, bid), "the benefactor to register")
    entry = list_benefactors(manager)[bid]
    assert entry.info.address == proc.address
    assert entry.info.chunks == 0

    ch = channel(proc.address)
    try:
        put(Stub(ch), blob("heartbeat-figures", 10_000))
    finally:
        ch.close()
    # The next heartbeat carries the new figures.
    wait_for(lambda: list_benefactors(manager)[bid].info.chunks == 1, "a heartbeat")
    assert list_benefactors(manager)[bid].info.stored_bytes == 10_000
    stop_clean(proc)  # benefactor first: the manager must not be missed while it runs


def test_services_benefactor_survives_manager_outage(
    tmp_path: Path, procs: list[Proc]
) -> None:
    port = free_port()
    # The benefactor starts first: the manager not being up yet is normal.
    proc = start_benefactor(tmp_path, "--manager", f"127.0.0.1:{port}")
    procs.append(proc)
    manager = start_manager(tmp_path, port)
    procs.append(manager)
    bid = proc.ready["id"]
    wait_for(lambda: alive_at(manager, bid), "registration once the manager is up")

    stop_clean(manager)
    proc.expected_noise.append(r"WARNING .*manager 127\.0\.0\.1:\d+ unreachable for \d+s")
    wait_for(lambda: " unreachable: " in proc.log(), "the outage to be noticed")
    # A heartbeat or two missed is news (INFO); an outage past OUTAGE_WARN_S a WARNING.
    assert "WARNING" not in proc.log()
    wait_for(lambda: " unreachable for " in proc.log(), "the outage's warning", timeout=20)
    time.sleep(1.0)
    assert proc.log().count(" unreachable: ") == 1  # once per outage, not per attempt
    assert proc.log().count(" unreachable for ") == 1

    manager = start_manager(tmp_path, port)
    procs.append(manager)
    wait_for(lambda: alive_at(manager, bid),
             "the benefactor to be alive again after the manager restarted")
    wait_for(lambda: "reachable again" in proc.log(), "the end of the outage to be logged")
    stop_clean(proc)


def test_services_benefactor_registers_again_when_manager_forgets_it(
    tmp_path: Path, procs: list[Proc]
) -> None:
    port = free_port()
    manager = start_manager(tmp_path, port, "first-manager")
    procs.append(manager)
    proc = start_benefactor(tmp_path, "--manager", manager.address)
    procs.append(proc)
    bid = proc.ready["id"]
    wait_for(lambda: alive_at(manager, bid), "the first registration")

    # A manager with empty metadata answers heartbeats with NOT_FOUND: register again.
    stop_clean(manager)
    proc.expected_noise.append(r"WARNING .*manager 127\.0\.0\.1:\d+ unreachable")
    fresh = start_manager(tmp_path, port, "fresh-manager")
    procs.append(fresh)
    wait_for(lambda: alive_at(fresh, bid), "registration with the fresh manager")
    assert "registering again" in proc.log()
    # The manager records the registration before the benefactor logs its answer.
    wait_for(lambda: proc.log().count("registered with manager") == 2,
             "the second registration in the benefactor's log")
    assert proc.log().count("registered with manager") == 2
    stop_clean(proc)


def test_services_benefactor_replicates_to_a_peer(benefactor: Proc, stub: Stub,
                                                  tmp_path: Path) -> None:
    peer = start_benefactor(tmp_path, name="peer")
    try:
        data = blob("replicate", 300_000)
        raw = chunk_id(data)
        stub.PutChunk(pb.PutChunkRequest(id=raw, data=data), timeout=TIMEOUT)
        absent = chunk_id(b"never stored")
        reply = stub.ReplicateChunks(pb.ReplicateChunksRequest(
            ids=[raw, absent], target_address=peer.address), timeout=TIMEOUT)
        assert list(reply.copied) == [True, False]
        assert reply.errors[0] == "" and "not" in reply.errors[1].lower()
        with channel(peer.address) as ch:
            got = pb_grpc.BenefactorStub(ch).GetChunk(pb.GetChunkRequest(id=raw),
                                                     timeout=TIMEOUT)
        assert got.data == data
    finally:
        stop_clean(peer)


def test_services_benefactor_replication_refuses_bad_requests(benefactor: Proc,
                                                              stub: Stub) -> None:
    raw = chunk_id(b"x")
    for target in ("../x", "", "host:notaport", "a b:1"):
        code, details = code_of(stub.ReplicateChunks, pb.ReplicateChunksRequest(
            ids=[raw], target_address=target))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (target, details)
    code, _ = code_of(stub.ReplicateChunks, pb.ReplicateChunksRequest(
        ids=[b"../../etc"], target_address="127.0.0.1:1"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    # An unreachable target: nothing copied, a reason given, the server still serves.
    data = b"payload"
    stub.PutChunk(pb.PutChunkRequest(id=chunk_id(data), data=data), timeout=TIMEOUT)
    reply = stub.ReplicateChunks(pb.ReplicateChunksRequest(
        ids=[chunk_id(data)], target_address="127.0.0.1:1"), timeout=TIMEOUT)
    assert list(reply.copied) == [False] and reply.errors[0]
    assert stub.GetChunk(pb.GetChunkRequest(id=chunk_id(data)), timeout=TIMEOUT).data == data


def test_services_benefactor_scrub_streams_progress_and_deletes_corrupt_copies(
        benefactor: Proc, stub: Stub, tmp_path: Path) -> None:
    chunks = [blob(f"svc-scrub-{i}", 40_000 + i) for i in range(6)]
    for data in chunks:
        put(stub, data)
    bad = chunk_id(chunks[2])
    path = chunk_path(tmp_path / "benefactor-data", bad)
    path.write_bytes(b"\0" * len(chunks[2]))
    benefactor.expected_noise = [rf"corrupt chunk {bad.hex()}"]
    messages = list(stub.Scrub(pb.ScrubRequest(), timeout=TIMEOUT))
    last = messages[-1]
    assert last.done and all(not m.done for m in messages[:-1])
    assert (last.checked_chunks, last.total_chunks, last.corrupt_chunks) == (6, 6, 1)
    assert list(last.corrupt_ids) == [bad]
    assert last.checked_bytes == sum(len(c) for c in chunks)
    assert not path.exists()
    assert list(stub.HasChunks(pb.HasChunksRequest(ids=[bad]), timeout=TIMEOUT).present) \
        == [False]
    assert put(stub, chunks[2]) is False  # a good copy is stored again
    again = list(stub.Scrub(pb.ScrubRequest(), timeout=TIMEOUT))[-1]
    assert again.corrupt_chunks == 0 and again.checked_chunks == 6


def test_services_benefactor_limits_concurrent_rpcs(tmp_path: Path, procs: list[Proc]) -> None:
    """--max-concurrent-rpcs 1: while a put is being taken (slowly: --ingest-rate), another
    call is answered RESOURCE_EXHAUSTED at once; afterwards the benefactor serves again."""
    proc = start_benefactor(tmp_path, "--max-concurrent-rpcs", "1", "--ingest-rate", "1M")
    procs.append(proc)
    data = blob("slow put", 1 << 20)  # a second at 1 MiB/s
    with channel(proc.address) as ch:
        stub = pb_grpc.BenefactorStub(ch)
        slow = stub.PutChunk.future(pb.PutChunkRequest(id=chunk_id(data), data=data),
                                    timeout=30)
        time.sleep(0.3)
        # A plain channel: no retries, so the refusal itself is seen.
        with grpc.insecure_channel(proc.address) as raw:
            code, message = code_of(pb_grpc.BenefactorStub(raw).GetInfo, pb.GetInfoRequest())
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, message
        assert slow.result().already_present is False
        assert stub.GetChunk(pb.GetChunkRequest(id=chunk_id(data)), timeout=10).data == data
