"""Chunk access tokens on a real TLS manager and two benefactors (docs/operations.md,
"Chunk access tokens"): a benefactor serves a chunk only against an unexpired read token
the manager signed for that chunk and the caller's certificate, and takes one only
against a write token (or from a peer benefactor); tokens signed before a key rotation
still work until they expire. Attacked over raw RPCs with the generated stubs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from mosafs import certs
from mosafs._proto import benefactor_pb2 as bpb
from mosafs._proto import benefactor_pb2_grpc as bgrpc
from mosafs._proto import common_pb2 as cpb
from mosafs._proto import manager_pb2 as mpb
from mosafs._proto import manager_pb2_grpc as mgrpc
from mosafs.capability import GIDS_KEY, UID_KEY
from mosafs.ids import chunk_id
from mosafs.manager import tokens
from mosafs.rpc.channels import channel
from mosafs.rpc.chunkwire import TOKEN_KEY
from tests import harness
from tests.harness import cli, scrape

Code = grpc.StatusCode
ROOT = 1
TTL_S = 4.0      # short, so that a test sees a token expire
ROTATE_S = 2.0   # a new key every 2 s: 8 heartbeats of 0.25 s
SECRET = b"the bytes of /jobB/secret, which jobA may not read" * 100


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tls")
    assert cli("certs", "init", "--dir", str(directory)).returncode == 0
    for name in ("manager", "benefactor", "admin", "client"):
        assert cli("certs", "issue", name, "--role", name, "--dir", str(directory)).returncode == 0
    done = cli("certs", "issue", "jobA", "--role", "client", "--dir", str(directory),
               "--path", "/jobA", "--uid", "1000", "--gids", "1000")
    assert done.returncode == 0, done.stderr
    return directory


def manager_stub(address: str, tls: Path, name: str) -> mgrpc.ManagerStub:
    return mgrpc.ManagerStub(channel(address, certs.load(tls, name)))


def benefactor_stub(address: str, tls: Path, name: str) -> bgrpc.BenefactorStub:
    return bgrpc.BenefactorStub(channel(address, certs.load(tls, name)))


def with_token(token: bytes, uid: int | None = None) -> dict[str, Any]:
    metadata: list[tuple[str, str | bytes]] = [(TOKEN_KEY, token)] if token else []
    if uid is not None:
        metadata += [(UID_KEY, str(uid)), (GIDS_KEY, str(uid))]
    return {"metadata": tuple(metadata), "timeout": 10}


def refusal(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details() or ""


@pytest.fixture(scope="module")
def cluster(tls: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A TLS manager with short-lived tokens, two benefactors, and /jobB/secret (root's,
    0700 directory) stored on the first benefactor."""
    work = tmp_path_factory.mktemp("tokens")
    manager = harness.start("manager", [
        "manager", "--data-dir", str(work / "m"), "--tls-dir", str(tls),
        "--heartbeat-interval", "0.25", "--write-lease", str(TTL_S), "--token-ttl", str(TTL_S),
        "--token-rotate", str(ROTATE_S)], work)
    benefactors = [harness.start(f"benefactor-{i}", [
        "benefactor", "--data-dir", str(work / f"b{i}"), "--manager", manager.address,
        "--tls-dir", str(tls)], work) for i in range(2)]
    try:
        admin = manager_stub(manager.address, tls, "admin")
        deadline = time.monotonic() + 30
        while sum(b.alive for b in admin.ListBenefactors(
                mpb.ListBenefactorsRequest(), timeout=10).benefactors) < 2:
            assert time.monotonic() < deadline, "the benefactors did not register"
            time.sleep(0.1)
        job_b = admin.Mkdir(mpb.MkdirRequest(parent=ROOT, name="jobB", mode=0o700)).inode
        admin.Mkdir(mpb.MkdirRequest(parent=ROOT, name="jobA", mode=0o755, uid=1000,
                                     gid=1000))
        secret = admin.Create(mpb.CreateRequest(parent=job_b, name="secret", mode=0o600)).inode
        lease = admin.OpenWrite(mpb.OpenWriteRequest(inode=secret, client_id="test"))
        assert len(lease.write_token) == tokens.WRITE_TOKEN_BYTES
        by_id = {b.ready["id"]: b for b in benefactors}
        first = by_id[lease.targets[0].id]
        benefactor_stub(first.address, tls, "admin").PutChunk(
            bpb.PutChunkRequest(id=chunk_id(SECRET), data=SECRET),
            **with_token(lease.write_token))
        admin.CommitVersion(mpb.CommitVersionRequest(
            lease_id=lease.lease_id, inode=secret,
            chunks=[cpb.ChunkRef(id=chunk_id(SECRET), length=len(SECRET))],
            placements=[mpb.ChunkPlacement(id=chunk_id(SECRET),
                                           benefactor_ids=[lease.targets[0].id])]))
        second = next(b for b in benefactors if b is not first)
        yield {"manager": manager, "admin": admin, "secret": secret, "holder": first,
               "other": second, "benefactors": benefactors}
    finally:
        harness.stop_every([manager, *benefactors])


def read_token(cluster: dict[str, Any]) -> bytes:
    """A fresh read token of /jobB/secret's chunk, issued to the admin certificate."""
    bm = cluster["admin"].GetBlockMap(mpb.GetBlockMapRequest(inode=cluster["secret"]))
    (location,) = bm.locations
    assert location.id == chunk_id(SECRET) and len(location.token) == tokens.READ_TOKEN_BYTES
    return bytes(location.token)


def test_services_get_chunk_of_job_b_needs_a_valid_token(cluster: dict[str, Any],
                                                          tls: Path) -> None:
    address, cid = cluster["holder"].address, chunk_id(SECRET)
    admin = benefactor_stub(address, tls, "admin")
    job_a = benefactor_stub(address, tls, "jobA")
    token = read_token(cluster)
    assert admin.GetChunk(bpb.GetChunkRequest(id=cid), **with_token(token)).data == SECRET
    # jobA cannot have the block-map of /jobB, so it has no token of its own ...
    code, _ = refusal(lambda: manager_stub(cluster["manager"].address, tls, "jobA").GetBlockMap(
        mpb.GetBlockMapRequest(inode=cluster["secret"]), **with_token(b"", 1000)))
    assert code == Code.PERMISSION_DENIED
    forged = bytearray(token)
    forged[-1] ^= 0x01
    unknown_key = token[:5] + bytes([token[5] ^ 0xFF]) + token[6:]  # key id's last byte
    for sent, why in [(b"", "no chunk access token"),
                      (token, "issued to another certificate"),  # ... nor admin's
                      (bytes(forged), "forged"),
                      (token[:40], "malformed"),
                      (unknown_key, "does not know")]:
        code, details = refusal(lambda s=sent: job_a.GetChunk(
            bpb.GetChunkRequest(id=cid), **with_token(s, 1000)))
        assert code == Code.PERMISSION_DENIED and why in details, (why, details)
    # ... and the verify path of GetChunk (a reader reporting a bad copy) is no way round.
    code, _ = refusal(lambda: job_a.GetChunk(bpb.GetChunkRequest(id=cid, verify=True),
                                             **with_token(b"", 1000)))
    assert code == Code.PERMISSION_DENIED


def test_services_token_for_another_chunk_is_refused(cluster: dict[str, Any],
                                                     tls: Path) -> None:
    data = b"a chunk a writer stored and may read back before its commit"
    client = manager_stub(cluster["manager"].address, tls, "client")
    located = client.LocateChunks(mpb.LocateChunksRequest(ids=[chunk_id(data)]))
    assert not located.locations and located.unindexed[0].id == chunk_id(data)
    mine = located.unindexed[0].token
    stub = benefactor_stub(cluster["holder"].address, tls, "client")
    code, details = refusal(lambda: stub.GetChunk(bpb.GetChunkRequest(id=chunk_id(SECRET)),
                                                  **with_token(mine)))
    assert code == Code.PERMISSION_DENIED and "not for chunk" in details


def test_services_expired_token_is_refused(cluster: dict[str, Any], tls: Path) -> None:
    stub = benefactor_stub(cluster["holder"].address, tls, "admin")
    token = read_token(cluster)
    expiry = tokens.parse(token).expiry_ms / 1000
    time.sleep(max(0.0, expiry - time.time()) + 0.2)
    code, details = refusal(lambda: stub.GetChunk(bpb.GetChunkRequest(id=chunk_id(SECRET)),
                                                  **with_token(token)))
    assert code == Code.PERMISSION_DENIED and "expired" in details
    fresh = read_token(cluster)  # what a reader does next
    assert stub.GetChunk(bpb.GetChunkRequest(id=chunk_id(SECRET)),
                         **with_token(fresh)).data == SECRET


def test_services_put_chunk_needs_a_write_token_unless_from_a_benefactor(
        cluster: dict[str, Any], tls: Path) -> None:
    address = cluster["other"].address
    data = b"bytes a client tries to store without a write session"
    request = bpb.PutChunkRequest(id=chunk_id(data), data=data)
    client = benefactor_stub(address, tls, "client")
    lease = manager_stub(cluster["manager"].address, tls, "admin").OpenWrite(
        mpb.OpenWriteRequest(inode=cluster["secret"], client_id="puts"))
    for sent, why in [(b"", "PutChunk needs a write token"),
                      (read_token(cluster), "a read token was sent"),
                      (lease.write_token, "issued to another certificate")]:
        code, details = refusal(lambda s=sent: client.PutChunk(request, **with_token(s)))
        assert code == Code.PERMISSION_DENIED and why in details, (why, details)
        code, details = refusal(lambda s=sent: client.PutChunks(
            bpb.PutChunksRequest(chunks=[request]), **with_token(s)))
        assert code == Code.PERMISSION_DENIED and why in details, (why, details)
    cluster["admin"].AbortWrite(mpb.AbortWriteRequest(lease_id=lease.lease_id))
    # A peer copy: a benefactor certificate needs no token.
    peer = benefactor_stub(address, tls, "benefactor")
    assert not peer.PutChunk(request, timeout=10).already_present
    # Replication between the two benefactors (their own certificates) goes through.
    copy = benefactor_stub(cluster["holder"].address, tls, "admin").ReplicateChunks(
        bpb.ReplicateChunksRequest(ids=[chunk_id(SECRET)], target_address=address),
        timeout=30)
    assert list(copy.copied) == [True], copy.errors
    copied = benefactor_stub(address, tls, "admin").GetChunk(
        bpb.GetChunkRequest(id=chunk_id(SECRET)), **with_token(read_token(cluster)))
    assert copied.data == SECRET


def test_services_tokens_of_a_retired_key_work_until_they_expire(cluster: dict[str, Any],
                                                                 tls: Path) -> None:
    stub = benefactor_stub(cluster["holder"].address, tls, "admin")
    old = read_token(cluster)
    old_key = tokens.parse(old).key_id
    deadline = time.monotonic() + 3 * ROTATE_S
    while tokens.parse(new := read_token(cluster)).key_id == old_key:
        assert time.monotonic() < deadline, "the manager did not rotate its key"
        time.sleep(0.1)
    # Right after the rotation: the benefactor knew the new key before it signed, and
    # keeps the old one while its tokens are in date.
    for token in (new, old):
        assert stub.GetChunk(bpb.GetChunkRequest(id=chunk_id(SECRET)),
                             **with_token(token)).data == SECRET


def test_services_token_refusals_are_counted_and_audited(cluster: dict[str, Any],
                                                         tls: Path) -> None:
    holder = cluster["holder"]
    refusal(lambda: benefactor_stub(holder.address, tls, "client").GetChunk(
        bpb.GetChunkRequest(id=chunk_id(SECRET)), timeout=10))
    metrics = scrape(holder.ready["metrics"])
    assert metrics.get("mosafs_refusals_total{reason=token}", 0) >= 1
    assert "refused GetChunk from client (token)" in holder.log()


def test_services_local_reads_need_each_chunk_s_token_and_a_fresh_ticket(
        cluster: dict[str, Any], tls: Path) -> None:
    """Short-circuit local reads (OpenLocal, then the benefactor's Unix socket): the open
    chunk file comes only for a chunk whose read token is valid for the caller, once per
    ticket; a made-up ticket gets nothing."""
    import os

    from mosafs.localwire import host_id, receive

    address, cid = cluster["holder"].address, chunk_id(SECRET)
    admin = benefactor_stub(address, tls, "admin")
    job_a = benefactor_stub(address, tls, "jobA")
    token = read_token(cluster)
    for stub, sent, why in [(job_a, [b""], "no chunk access token"),
                            (job_a, [token], "issued to another certificate"),
                            (admin, [token[:40]], "malformed")]:
        code, details = refusal(lambda s=stub, t=sent: s.OpenLocal(
            bpb.OpenLocalRequest(ids=[cid], tokens=t), timeout=10))
        assert code == Code.PERMISSION_DENIED and why in details, (why, details)
    code, details = refusal(lambda: admin.OpenLocal(
        bpb.OpenLocalRequest(ids=[cid, cid], tokens=[token]), timeout=10))
    assert code == Code.INVALID_ARGUMENT and "each with its token" in details

    reply = admin.OpenLocal(bpb.OpenLocalRequest(ids=[cid], tokens=[token]), timeout=10)
    assert reply.host == host_id() and len(reply.ticket) == 32
    (fd,) = receive(reply.socket, reply.ticket, 1)
    assert fd is not None
    try:
        assert os.pread(fd, len(SECRET) + 1, 0) == SECRET
        with pytest.raises(OSError):  # read-only
            os.pwrite(fd, b"x", 0)
    finally:
        os.close(fd)
    with pytest.raises(OSError):  # used once
        receive(reply.socket, reply.ticket, 1)
    with pytest.raises(OSError):  # never granted
        receive(reply.socket, bytes(32), 1)


def test_services_local_puts_need_a_write_token_and_verify_every_blob(
        cluster: dict[str, Any], tls: Path) -> None:
    """Short-circuit local puts (OpenLocal(put), then a memory file over the benefactor's
    Unix socket): a ticket only against a write token of the caller's; each blob verified
    against its id (a mismatch refused, the rest stored); a ticket used once; a header
    that reaches outside the file refused whole."""
    import os

    from mosafs.localwire import put

    holder = cluster["other"]
    admin = benefactor_stub(holder.address, tls, "admin")
    lease = manager_stub(cluster["manager"].address, tls, "admin").OpenWrite(
        mpb.OpenWriteRequest(inode=cluster["secret"], client_id="local puts"))
    try:
        for sent, why in [(b"", "needs a write token"), (read_token(cluster), "read token")]:
            code, details = refusal(lambda s=sent: admin.OpenLocal(
                bpb.OpenLocalRequest(put=True), **with_token(s)))
            assert code == Code.PERMISSION_DENIED and why in details, (why, details)
        code, _ = refusal(lambda: admin.OpenLocal(
            bpb.OpenLocalRequest(put=True, ids=[chunk_id(SECRET)]),
            **with_token(lease.write_token)))
        assert code == Code.INVALID_ARGUMENT

        good, bad = b"a blob stored from a memory file" * 50, b"bytes that lie about their id"
        fd = os.memfd_create("test-put")
        try:
            os.write(fd, good + bad)
            spans = [(chunk_id(good), 0, len(good)), (chunk_id(b"other"), len(good), len(bad))]
            reply = admin.OpenLocal(bpb.OpenLocalRequest(put=True),
                                    **with_token(lease.write_token))
            answers = put(reply.socket, reply.ticket, fd, spans)
            assert answers[0] == {"present": False}
            assert answers[1]["kind"] == "invalid-argument", answers
            assert "does not match its id" in str(answers[1]["message"])
            with pytest.raises(OSError):  # used once
                put(reply.socket, reply.ticket, fd, spans[:1])
            again = admin.OpenLocal(bpb.OpenLocalRequest(put=True),
                                    **with_token(lease.write_token))
            with pytest.raises(OSError):  # a span past the end of the file
                put(again.socket, again.ticket, fd,
                    [(chunk_id(good), len(good) + len(bad) - 3, 10)])
        finally:
            os.close(fd)
        stored = admin.HasChunks(bpb.HasChunksRequest(ids=[chunk_id(good), chunk_id(b"other")]),
                                 timeout=10)
        assert list(stored.present) == [True, False]
    finally:
        cluster["admin"].AbortWrite(mpb.AbortWriteRequest(lease_id=lease.lease_id))


def test_services_a_local_put_stores_only_bytes_that_hash_to_their_ids_while_the_writer_changes_them(  # noqa: E501
        cluster: dict[str, Any], tls: Path) -> None:
    """A writer's memory file stays writable by the writer while the benefactor stores it
    (mosafs keeps its own for the next group; a hostile writer changes it on purpose):
    every blob is stored or refused, and what is stored under an id hashes to it, however
    the bytes change between the benefactor's check and its write. The benefactor copies
    each blob out of the file before checking it; without that copy about a quarter of
    these blobs would be stored with a byte that is not the one checked."""
    import mmap
    import os
    import threading

    import numpy as np

    from mosafs.localwire import put

    holder = cluster["other"]
    admin = benefactor_stub(holder.address, tls, "admin")
    lease = manager_stub(cluster["manager"].address, tls, "admin").OpenWrite(
        mpb.OpenWriteRequest(inode=cluster["secret"], client_id="changing writer"))
    size, count = 256 << 10, 32
    blobs = [os.urandom(size) for _ in range(count)]
    spans = [(chunk_id(b), i * size, size) for i, b in enumerate(blobs)]
    fd = os.memfd_create("test-changing-put")
    os.write(fd, b"".join(blobs))
    mem = mmap.mmap(fd, count * size)
    changing = np.frombuffer(mem, dtype=np.uint8)
    at = np.arange(count) * size + 4096  # one byte of each blob, flipped back and forth
    stop = threading.Event()

    def flip(changing: Any) -> None:
        while not stop.is_set():
            changing[at] ^= 0xFF

    flipper = threading.Thread(target=flip, args=(changing,))
    flipper.start()
    answers: list[dict[str, object]] = []
    try:
        for _ in range(12):
            reply = admin.OpenLocal(bpb.OpenLocalRequest(put=True),
                                    **with_token(lease.write_token))
            answers += put(reply.socket, reply.ticket, fd, spans)
    finally:
        stop.set()
        flipper.join()
        del changing
        mem.close()
        os.close(fd)
        cluster["admin"].AbortWrite(mpb.AbortWriteRequest(lease_id=lease.lease_id))
    for answer in answers:
        assert "present" in answer or (answer["kind"] == "invalid-argument"
                                       and "does not match its id" in str(answer["message"]))
    chunks = Path(holder.ready["data_dir"]) / "chunks"
    stored = 0
    for blob in blobs:
        name = chunk_id(blob).hex()
        path = chunks / name[:2] / name[2:4] / name
        if path.exists():
            stored += 1
            assert chunk_id(path.read_bytes()) == chunk_id(blob), f"{name} stored changed"
    assert stored >= count // 2, f"only {stored} of {count} blobs stored in 12 rounds"


def test_services_local_puts_reuse_a_memory_file_only_after_a_whole_answer(
        cluster: dict[str, Any], tls: Path) -> None:
    """The writer's side keeps a group's memory file for the next group to the same
    benefactor (a new file costs its pages: mosafs.client.files.localputs), and never one
    whose hand-over failed: the benefactor might still be reading it."""
    import os

    from mosafs.client.files.localputs import MemoryFiles, _hand_over

    holder = cluster["other"]
    admin = benefactor_stub(holder.address, tls, "admin")
    lease = manager_stub(cluster["manager"].address, tls, "admin").OpenWrite(
        mpb.OpenWriteRequest(inode=cluster["secret"], client_id="kept files"))
    files = MemoryFiles()
    try:
        for round_ in range(3):
            blobs = [(chunk_id(b), b) for b in (os.urandom(3000 + round_) for _ in range(4))]
            reply = admin.OpenLocal(bpb.OpenLocalRequest(put=True),
                                    **with_token(lease.write_token))
            answers = _hand_over(files, reply.socket, reply.ticket, blobs)
            assert answers == [{"present": False}] * 4
        assert files.made == 1
        with pytest.raises(OSError):  # a ticket never granted: the file is not kept
            _hand_over(files, reply.socket, bytes(32), blobs)
        reply = admin.OpenLocal(bpb.OpenLocalRequest(put=True), **with_token(lease.write_token))
        assert _hand_over(files, reply.socket, reply.ticket, blobs) == [{"present": True}] * 4
        assert files.made == 2
    finally:
        files.close()
        cluster["admin"].AbortWrite(mpb.AbortWriteRequest(lease_id=lease.lease_id))


def test_services_open_local_gives_several_put_tickets_each_used_once(
        cluster: dict[str, Any], tls: Path) -> None:
    """OpenLocal(put, put_tickets=N) gives N tickets (at most 16; none asked is one), each
    good for one group only."""
    import os

    from mosafs.localwire import put

    holder = cluster["other"]
    admin = benefactor_stub(holder.address, tls, "admin")
    lease = manager_stub(cluster["manager"].address, tls, "admin").OpenWrite(
        mpb.OpenWriteRequest(inode=cluster["secret"], client_id="several tickets"))
    fd = os.memfd_create("test-tickets")
    try:
        sizes = {}
        for asked in (0, 1, 5, 1000):
            reply = admin.OpenLocal(bpb.OpenLocalRequest(put=True, put_tickets=asked),
                                    **with_token(lease.write_token))
            sizes[asked] = 1 + len(reply.more_tickets)
        assert sizes == {0: 1, 1: 1, 5: 5, 1000: 16}
        tickets = [reply.ticket, *reply.more_tickets]
        assert len(set(tickets)) == 16
        for i, ticket in enumerate(tickets[:4]):
            blob = b"one group per ticket %d " % i * 40
            os.pwrite(fd, blob, 0)
            spans = [(chunk_id(blob), 0, len(blob))]
            assert put(reply.socket, ticket, fd, spans) == [{"present": False}]
            with pytest.raises(OSError):  # used once
                put(reply.socket, ticket, fd, spans)
    finally:
        os.close(fd)
        cluster["admin"].AbortWrite(mpb.AbortWriteRequest(lease_id=lease.lease_id))


def test_services_local_puts_keep_tickets_and_ask_again_for_one_refused(
        cluster: dict[str, Any], tls: Path) -> None:
    """The writer's side asks for tickets ahead as groups keep coming (1, 2, 4, 8: four
    OpenLocal calls for ten groups, where it made one per group), and uses them for any
    write of this client (another write's token); a kept ticket the benefactor no longer
    takes (as after its restart) costs one fresh OpenLocal: the group is still stored
    locally and the benefactor still takes local puts from this writer."""
    import os

    import trio

    from mosafs.client.files.localputs import LocalPuts
    from mosafs.client.rpc import Benefactors, Rpc

    holder = cluster["other"]
    lease = manager_stub(cluster["manager"].address, tls, "admin").OpenWrite(
        mpb.OpenWriteRequest(inode=cluster["secret"], client_id="kept tickets"))
    benefactors = Benefactors(Rpc(4), identity=certs.load(tls, "admin"))
    local = LocalPuts(benefactors)

    async def groups(count: int) -> list[Any]:
        out = []
        for _ in range(count):
            blobs = [(chunk_id(b), b) for b in (os.urandom(2000) for _ in range(2))]
            out.append(await local.put(holder.address, blobs, lease.write_token))
        return out

    try:
        assert trio.run(groups, 10) == [[False, False]] * 10
        assert (local.groups, local.opened) == (10, 4)
        stock = local._stocks[holder.address]
        assert len(stock.tickets) == 5  # 1 + 2 + 4 + 8 given, 10 used
        stock.tickets[:] = [os.urandom(32) for _ in stock.tickets]  # none the benefactor knows
        assert trio.run(groups, 1) == [[False, False]]
        assert (local.groups, local.opened) == (11, 5)
        assert holder.address not in local._remote

        async def two_at_once() -> None:  # both find no ticket kept, both ask for 2
            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    nursery.start_soon(groups, 1)

        trio.run(two_at_once)
        assert (local.groups, local.opened) == (13, 7)
        assert len(local._stocks[holder.address].tickets) == 2  # both kept

        other = manager_stub(cluster["manager"].address, tls, "admin").OpenWrite(
            mpb.OpenWriteRequest(inode=cluster["secret"], client_id="another write"))
        try:
            blobs = [(chunk_id(b), b) for b in (os.urandom(2000) for _ in range(2))]
            got = trio.run(local.put, holder.address, blobs, other.write_token)
            assert got == [False, False] and local.opened == 7  # a kept ticket served it
        finally:
            cluster["admin"].AbortWrite(mpb.AbortWriteRequest(lease_id=other.lease_id))
    finally:
        local.close()
        benefactors.close()
        cluster["admin"].AbortWrite(mpb.AbortWriteRequest(lease_id=lease.lease_id))
