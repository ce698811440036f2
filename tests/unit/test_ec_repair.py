"""The fragment repairer (docs/erasure_pools.md, "Repair", "Drain", "Conversion") on a
real metadata store, with benefactors stood in for by real chunk stores in tmp_path and
the real Recoder (mosafs.benefactor.recode): the requests the manager plans run as a
benefactor would run them, without gRPC.

- a dead holder's fragments are rebuilt, each on a benefactor that holds no fragment of
  the chunk, the work spread over several rebuilders; the record takes the new holders
  in one transaction, and the rebuilt fragment hashes to its recorded id;
- an optimistic write's holes are filled; a fragment dropped as corrupt is rebuilt;
- too few readable fragments: nothing is planned, the chunk is retried later;
- a draining holder's fragment is copied (not rebuilt) and the drain completes;
- conversion replicas -> ec -> replicas: the record is swapped only once the new layout
  is stored, the old blobs are then garbage; progress figures;
- the recoder refuses bad requests, reads around a corrupt fragment (and reports it),
  and refuses a "repair" whose fragments do not match the record.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import blake3
import pytest

from mosafs._proto import benefactor_pb2 as bpb
from mosafs.benefactor.chunkstore import FileChunkStore
from mosafs.benefactor.recode import RecodeJob, Recoder, Source, Target, job_of, reply_of
from mosafs.erasure import make_coder
from mosafs.errors import IntegrityError, InternalError, InvalidArgument, NotFound, Unavailable
from mosafs.ids import chunk_id
from mosafs.manager.core import Manager, ManagerConfig
from mosafs.manager.fsck import fsck
from mosafs.manager.metadata import ROOT_INODE, Fragments, MetadataStore
from tests.unit.managers import Clock, new_file, register

MiB = 1 << 20
N = 8


class Benefactors:
    """N benefactors b0..b{N-1} at 127.0.0.1:700i, each a chunk store; DOWN ones refuse."""

    def __init__(self, base: Path) -> None:
        self.stores = {f"127.0.0.1:{7000 + i}": FileChunkStore(base / f"b{i}")
                       for i in range(N)}
        self.down: set[str] = set()
        self.asked: list[tuple[str, bpb.RecodeChunkRequest]] = []
        self.copies: list[tuple[str, str]] = []

    def of(self, bid: str) -> FileChunkStore:
        return self.stores[f"127.0.0.1:{7000 + int(bid[1:])}"]

    def _up(self, address: str) -> FileChunkStore:
        if address in self.down:
            raise Unavailable(f"{address} is down")
        return self.stores[address]

    def get(self, address: str, blob: bytes, token: bytes, timeout: float,
            verify: bool) -> bytes:
        return self._up(address).get(blob, verify=verify)

    def put(self, address: str, blob: bytes, data: bytes, timeout: float) -> None:
        self._up(address).put(blob, data)

    def recode(self, address: str, request: bpb.RecodeChunkRequest,
               timeout: float) -> bpb.RecodeChunkResponse:
        assert timeout >= 10
        self.asked.append((address, request))
        recoder = Recoder(self._up(address), self.get, self.put)
        try:
            return reply_of(recoder.recode(job_of(request)))
        finally:
            recoder.close()

    def copy(self, source: str, target: str, ids: Sequence[bytes],
             timeout: float) -> tuple[list[bool], str]:
        self.copies.append((source, target))
        for blob in ids:
            self._up(target).put(blob, self._up(source).get(blob))
        return [True] * len(ids), ""

    def close(self) -> None:
        for store in self.stores.values():
            store.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Benefactors]:
    out = Benefactors(tmp_path)
    yield out
    out.close()


@pytest.fixture
def ec(store: MetadataStore, clock: Clock, cluster: Benefactors) -> Iterator[Manager]:
    mgr = Manager(store, ManagerConfig(benefactor_lease_s=5, gc_grace_s=0.0), clock=clock,
                  copy=cluster.copy, recode=cluster.recode)
    store.update_pool("default", redundancy="ec:4+2", ec_min_chunk=64 << 10)
    for i in range(N):
        register(mgr, f"b{i}", port=7000 + i)
    yield mgr
    assert mgr.replicator is not None and mgr.repairer is not None
    mgr.repairer.close()
    mgr.replicator.close()


def data(seed: str, n: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=n)


def store_coded(mgr: Manager, cluster: Benefactors, name: str, chunk: bytes,
                holders: Sequence[str]) -> tuple[bytes, Fragments]:
    """Encode CHUNK as 4+2, put fragment i on HOLDERS[i] ("" : a hole), commit a file."""
    frags = make_coder("isal").fragments(chunk, 4, 2)
    fids = tuple(chunk_id(f) for f in frags)
    for fid, f, h in zip(fids, frags, holders, strict=True):
        if h:
            cluster.of(h).put(fid, bytes(f))
    cid = chunk_id(chunk)
    layout = Fragments(4, 2, fids, tuple(holders))
    ino = new_file(mgr.store, name)
    lease = mgr.open_write(ino, "test")
    mgr.commit_version(lease.lease_id, ino, [(cid, len(chunk))], [], fragments=[(cid, layout)])
    return cid, layout


def settle(mgr: Manager, rounds: int = 400) -> None:
    """Replication and repair steps until neither has work."""
    assert mgr.replicator is not None and mgr.repairer is not None
    for _ in range(rounds):
        mgr.replicator.step()
        mgr.repairer.step()
        if not mgr.replicator.busy() and not mgr.repairer.busy():
            return
        time.sleep(0.01)
    raise AssertionError("repair did not settle")


def keep_alive(mgr: Manager, clock: Clock, alive: Sequence[str], seconds: float = 6) -> None:
    """Time passes; only ALIVE send heartbeats (the others die)."""
    clock.now += seconds
    for bid in alive:
        register(mgr, bid, port=7000 + int(bid[1:]))


def check_whole(mgr: Manager, cluster: Benefactors, cid: bytes, chunk: bytes) -> list[str]:
    """REC has K+M fragments on distinct live holders, each stored there under its id."""
    rec = mgr.store.chunk(cid)
    assert rec is not None and rec.ec_k == 4
    holders = list(rec.fragment_holders)
    assert all(holders) and len(set(holders)) == 6, holders
    frags = {i: cluster.of(h).get(bytes(f)) for i, (f, h) in
             enumerate(zip(rec.fragment_ids, holders, strict=True))}
    assert make_coder("isal").decode({i: frags[i] for i in (2, 3, 4, 5)}, 4, 2,
                                     len(chunk)) == chunk
    return holders


def test_a_dead_holders_fragments_are_rebuilt_by_several_survivors(
        ec: Manager, cluster: Benefactors, clock: Clock) -> None:
    chunks = [data(f"c{n}", MiB + n) for n in range(6)]
    placed = [store_coded(ec, cluster, f"f{n}", c,
                          [f"b{(n + i) % 7}" for i in range(6)]) for n, c in enumerate(chunks)]
    settle(ec)
    assert not cluster.asked, "nothing to do while every fragment is there"
    # b3 dies: every chunk that had a fragment on it gets it back on a benefactor that
    # holds none of the chunk (b7 joined empty, and the one of b0..b6 each chunk skipped).
    cluster.down.add("127.0.0.1:7003")
    keep_alive(ec, clock, [f"b{i}" for i in range(N) if i != 3])
    settle(ec)
    hit = [n for n, (_, layout) in enumerate(placed) if "b3" in layout.holders]
    assert len(cluster.asked) == len(hit)
    rebuilders = {address for address, _ in cluster.asked}
    assert len(rebuilders) >= 3, f"the work is spread: {rebuilders}"
    for n, (cid, layout) in enumerate(placed):
        holders = check_whole(ec, cluster, cid, chunks[n])
        assert "b3" not in holders
        assert [h for h in holders if h not in layout.holders] == (
            [holders[layout.holders.index("b3")]] if n in hit else [])
    status = ec.cluster_status()
    assert status.ec_short_chunks == 0 and status.under_replicated_chunks == 0
    assert status.ec_rebuilt_fragments == len(hit)
    assert fsck(ec.store).findings == []

    # Every read from a peer carried... no token here (plaintext); the sources list the
    # rebuilder's own fragment first (read locally).
    for _, request in cluster.asked:
        assert len(request.targets) == 1 and request.out_k == 4
        own = [s for s in request.fragments if not s.address]
        assert all(s is request.fragments[0] for s in own[:1])


def test_rebuilds_reserve_links_at_both_ends(ec: Manager, cluster: Benefactors,
                                             clock: Clock) -> None:
    """While many rebuilds run at once, no benefactor sends more than two transfers (the
    repairer's per_link) and none receives more, unless one request alone needs more
    (a rebuilder reading K = 4 fragments)."""
    chunks = [data(f"link{n}", 256 * 1024 + n) for n in range(28)]
    for n, c in enumerate(chunks):
        store_coded(ec, cluster, f"l{n}", c, [f"b{(n + i) % 7}" for i in range(6)])
    settle(ec)
    lock = threading.Lock()
    sending: Counter[str] = Counter()
    receiving: Counter[str] = Counter()
    seen = {"send": 0, "receive": 0, "parallel": 0, "running": 0}
    recode = cluster.recode

    def watched(address: str, request: bpb.RecodeChunkRequest,
                timeout: float) -> bpb.RecodeChunkResponse:
        sources = [s.address for s in request.fragments[:request.ec_k] if s.address]
        with lock:
            for src in sources:
                sending[src] += 1
            receiving[address] += len(sources)
            seen["running"] += 1
            seen["parallel"] = max(seen["parallel"], seen["running"])
            seen["send"] = max(seen["send"], *(sending[src] for src in sources))
            if receiving[address] > len(sources):  # not alone on its link
                seen["receive"] = max(seen["receive"], receiving[address])
        try:
            time.sleep(0.2)  # a transfer takes time: requests overlap, even on a busy host
            return recode(address, request, timeout)
        finally:
            with lock:
                for src in sources:
                    sending[src] -= 1
                receiving[address] -= len(sources)
                seen["running"] -= 1

    assert ec.repairer is not None
    ec.repairer._recode = watched  # the same recoder, watched
    cluster.down.add("127.0.0.1:7003")
    keep_alive(ec, clock, [f"b{i}" for i in range(N) if i != 3])
    settle(ec, rounds=2000)
    assert len(cluster.asked) == sum("b3" in [f"b{(n + i) % 7}" for i in range(6)]
                                     for n in range(len(chunks)))
    # Rebuilds ran side by side, up to the limit on a sender (each reads K = 4 of the
    # seven benefactors, so a third one rarely finds four free senders), never past it.
    assert seen["parallel"] >= 2 and seen["send"] == 2, seen
    assert seen["receive"] <= 2, seen
    assert ec.cluster_status().ec_short_chunks == 0


def test_every_sender_gets_a_share_of_the_plans_whatever_the_queue_order(
        ec: Manager, cluster: Benefactors, clock: Clock) -> None:
    """ec:1+1 chunks on (b0, b1) and a few on (b0, b2), queued b1's first (the walk of a
    dead benefactor's holdings goes by chunk id); b0 dies. Each lost fragment has one
    sender, so b2's link may only be used by b2's chunks: they are planned at once, while
    b1's requests run, not after b1's backlog (the repairer's window of waiting plans is
    shared out per sender, `per_sender`)."""
    ec.store.update_pool("default", redundancy="ec:1+1", ec_min_chunk=0)
    chunks = sorted((data(f"s{n}", 64 * 1024 + n) for n in range(120)), key=chunk_id)
    coder = make_coder("isal")
    for n, chunk in enumerate(chunks):
        pair = ("b0", "b1") if n < 110 else ("b0", "b2")
        frags = coder.fragments(chunk, 1, 1)
        fids = tuple(chunk_id(f) for f in frags)
        for fid, f, h in zip(fids, frags, pair, strict=True):
            cluster.of(h).put(fid, bytes(f))
        ino = new_file(ec.store, f"s{n}")
        lease = ec.open_write(ino, "test")
        ec.commit_version(lease.lease_id, ino, [(chunk_id(chunk), len(chunk))], [],
                          fragments=[(chunk_id(chunk), Fragments(1, 1, fids, pair))])
    settle(ec)
    gate = threading.Event()
    senders: list[str] = []
    recode = cluster.recode

    def held_back(address: str, request: bpb.RecodeChunkRequest,
                  timeout: float) -> bpb.RecodeChunkResponse:
        senders.append(request.fragments[0].address or address)  # "": the worker's own
        gate.wait(30)
        return recode(address, request, timeout)

    assert ec.repairer is not None and ec.replicator is not None
    ec.repairer._recode = held_back
    cluster.down.add("127.0.0.1:7000")
    keep_alive(ec, clock, [f"b{i}" for i in range(1, N)])
    try:
        deadline = time.monotonic() + 10
        while "127.0.0.1:7002" not in senders and time.monotonic() < deadline:
            ec.replicator.step()
            ec.repairer.step()
            time.sleep(0.01)
        assert "127.0.0.1:7002" in senders, f"b2 idle while b1 sends: {senders}"
        # b1's link: its two transfers; no more started while they run.
        assert senders.count("127.0.0.1:7001") == 2, senders
        assert ec.repairer.pending([chunk_id(c) for c in chunks])
    finally:
        gate.set()
    settle(ec, rounds=3000)
    status = ec.cluster_status()
    assert status.ec_short_chunks == 0 and status.ec_rebuilt_fragments == len(chunks)


def test_holes_and_corrupt_fragments_are_rebuilt(ec: Manager, cluster: Benefactors) -> None:
    chunk = data("holes", 3 * MiB)
    # An optimistic write stored four of six: two holes.
    cid, layout = store_coded(ec, cluster, "f", chunk, ["b0", "b1", "", "b3", "b4", ""])
    settle(ec)
    holders = check_whole(ec, cluster, cid, chunk)
    assert holders[:2] == ["b0", "b1"] and holders[3:5] == ["b3", "b4"]
    assert len(cluster.asked) == 1 and len(cluster.asked[0][1].targets) == 2

    # A scrub found fragment 1 corrupt on b1 (deleted it): rebuilt, on a benefactor that
    # holds no fragment of the chunk (b1 itself may be one: its bad copy is gone).
    cluster.of("b1").delete(layout.ids[1], touched_ns=time.time_ns() + 10**9)
    ec.report_corrupt("b1", [layout.ids[1]])
    assert ec.store.chunk(cid).fragment_holders[1] == ""  # type: ignore[union-attr]
    settle(ec)
    check_whole(ec, cluster, cid, chunk)
    assert len(cluster.asked) == 2 and [t.index for t in cluster.asked[1][1].targets] == [1]


def test_too_few_fragments_plan_nothing_and_retry(ec: Manager, cluster: Benefactors,
                                                  clock: Clock) -> None:
    chunk = data("lost", MiB)
    cid, _ = store_coded(ec, cluster, "f", chunk, ["b0", "b1", "b2", "b3", "b4", "b5"])
    for address in ("127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"):
        cluster.down.add(address)
    keep_alive(ec, clock, ["b3", "b4", "b5", "b6", "b7"])
    settle(ec)
    assert not cluster.asked
    status = ec.cluster_status()
    assert status.ec_lost_chunks == 1 and status.ec_missing_fragments == 3
    # b0 comes back: three readable, still short of K... and b1: four. Rebuilt.
    cluster.down -= {"127.0.0.1:7000", "127.0.0.1:7001"}
    keep_alive(ec, clock, ["b0", "b1", "b3", "b4", "b5", "b6", "b7"], seconds=1)
    clock.now += 3  # past the retry
    settle(ec)
    holders = check_whole(ec, cluster, cid, chunk)
    assert "b2" not in holders


def test_a_draining_holders_fragment_is_copied_and_the_drain_completes(
        ec: Manager, cluster: Benefactors) -> None:
    chunk = data("drain", 2 * MiB)
    cid, _ = store_coded(ec, cluster, "f", chunk, ["b0", "b1", "b2", "b3", "b4", "b5"])
    status = ec.drain("b2")
    assert status.pending_chunks == 1 and not status.done
    settle(ec)
    assert not cluster.asked and len(cluster.copies) == 1, "a copy, not a rebuild"
    holders = check_whole(ec, cluster, cid, chunk)
    assert "b2" not in holders
    assert ec.drain_status("b2").done
    with pytest.raises(Exception, match="alive"):
        ec.remove_benefactor("b2")  # alive: stop it first (no --force needed)


def test_conversion_replicas_to_ec_and_back(store: MetadataStore, clock: Clock,
                                            cluster: Benefactors) -> None:
    mgr = Manager(store, ManagerConfig(benefactor_lease_s=5, gc_grace_s=0.0), clock=clock,
                  copy=cluster.copy, recode=cluster.recode)
    store.update_pool("default", replication=2)
    for i in range(N):
        register(mgr, f"b{i}", port=7000 + i)
    chunks = [data(f"conv{n}", MiB + 1000 * n) for n in range(4)]
    ids = []
    for n, chunk in enumerate(chunks):
        cid = chunk_id(chunk)
        for b in ("b0", "b1"):
            cluster.of(b).put(cid, chunk)
        ino = new_file(store, f"f{n}")
        lease = mgr.open_write(ino, "test")
        mgr.commit_version(lease.lease_id, ino, [(cid, len(chunk))], [(cid, ["b0", "b1"])])
        ids.append(cid)
    try:
        settle(mgr)
        store.update_pool("default", redundancy="ec:4+2")
        mgr.pool_changed("default")
        settle(mgr)
        for cid, chunk in zip(ids, chunks, strict=True):
            check_whole(mgr, cluster, cid, chunk)
            rec = store.chunk(cid)
            assert rec is not None and not rec.benefactor_ids, "old copies are garbage"
        (conv,) = mgr.cluster_status().conversions
        assert (conv.pool, conv.redundancy, conv.done_chunks, conv.remaining_chunks) == (
            "default", "ec:4+2", 4, 0)
        assert conv.done_bytes == sum(len(c) for c in chunks)
        # The old whole copies go at the next inventory: nothing names them.
        old = time.time_ns() - 10**10
        assert mgr.report_inventory("b0", [(c, old) for c in ids])[0] == ids

        store.update_pool("default", replication=3)
        mgr.pool_changed("default")
        settle(mgr)
        for cid, chunk in zip(ids, chunks, strict=True):
            rec = store.chunk(cid)
            assert rec is not None and rec.ec_k == 0 and not rec.fragment_ids
            assert len(set(rec.benefactor_ids)) == 3
            assert all(cluster.of(b).get(cid) == chunk for b in rec.benefactor_ids)
        with store.transaction() as tx:  # the fragment index lost the old fragments
            assert not list(tx.txn.cursor(db=tx.db.fragments).iternext())
        (conv,) = mgr.cluster_status().conversions
        assert (conv.redundancy, conv.done_chunks, conv.remaining_chunks) == (
            "replicas:3", 4, 0)
        assert fsck(store).findings == []
    finally:
        assert mgr.replicator is not None and mgr.repairer is not None
        mgr.repairer.close()
        mgr.replicator.close()


def test_a_returning_holders_replaced_fragment_is_garbage(
        ec: Manager, cluster: Benefactors, clock: Clock) -> None:
    chunk = data("return", MiB)
    cid, layout = store_coded(ec, cluster, "f", chunk, ["b0", "b1", "b2", "b3", "b4", "b5"])
    cluster.down.add("127.0.0.1:7005")
    keep_alive(ec, clock, [f"b{i}" for i in range(N) if i != 5])
    settle(ec)
    assert "b5" not in check_whole(ec, cluster, cid, chunk)
    cluster.down.clear()
    keep_alive(ec, clock, [f"b{i}" for i in range(N)], seconds=1)
    old = time.time_ns() - 10**10
    # b5's fragment 5 is not needed: its slot is another benefactor's now.
    assert ec.report_inventory("b5", [(layout.ids[5], old)])[0] == [layout.ids[5]]
    # b0's fragment 0 is.
    assert ec.report_inventory("b0", [(layout.ids[0], old)])[0] == []


# --- the benefactor's side ----------------------------------------------------------------

@pytest.fixture
def recoder(cluster: Benefactors) -> Iterator[Recoder]:
    out = Recoder(cluster.stores["127.0.0.1:7000"], cluster.get, cluster.put)
    yield out
    out.close()


def _coded(cluster: Benefactors, chunk: bytes) -> tuple[bytes, list[bytes]]:
    frags = make_coder("isal").fragments(chunk, 4, 2)
    fids = [chunk_id(f) for f in frags]
    for i, (fid, f) in enumerate(zip(fids, frags, strict=True)):
        cluster.stores[f"127.0.0.1:{7001 + i}"].put(fid, bytes(f))
    return chunk_id(chunk), fids


def test_recoder_reads_around_a_corrupt_fragment_and_reports_it(
        recoder: Recoder, cluster: Benefactors) -> None:
    chunk = data("recoder", MiB + 7)
    cid, fids = _coded(cluster, chunk)
    path = cluster.stores["127.0.0.1:7001"].path_of(fids[0])
    raw = bytearray(path.read_bytes())
    raw[10] ^= 1
    path.write_bytes(bytes(raw))
    sources = [Source(i, f"127.0.0.1:{7001 + i}") for i in range(6) if i != 2]
    out = recoder.recode(RecodeJob(cid, len(chunk), k=4, m=2, fragment_ids=fids,
                                   fragments=sources, out_k=4, out_m=2,
                                   targets=[Target(2, "127.0.0.1:7007")]))
    assert out.stored == [True] and out.unreadable == [0]
    assert cluster.stores["127.0.0.1:7007"].get(fids[2]) == \
        cluster.stores["127.0.0.1:7003"].get(fids[2])
    # The holder was asked to verify (GetChunk verify): it found its copy corrupt.
    with pytest.raises((IntegrityError, NotFound)):
        cluster.stores["127.0.0.1:7001"].get(fids[0])


@pytest.mark.parametrize(("change", "says"), [
    ({"chunk_id": b"short"}, "32 bytes"),
    ({"length": 0}, "length must be"),
    ({"k": 0, "m": 2}, "K \\(data fragments\\)"),
    ({"fragment_ids": []}, "needs 6 fragment ids"),
    ({"targets": []}, "targets"),
    ({"targets": [Target(9, "127.0.0.1:7007")]}, "distinct fragment indices"),
    ({"targets": [Target(1, "x"), Target(2, "x")]}, "two blobs"),
    ({"targets": [Target(1, "no port")]}, "bad target address"),
    ({"fragments": [Source(7, "127.0.0.1:7001")]}, "distinct indices"),
])
def test_recoder_refuses_bad_requests(recoder: Recoder, cluster: Benefactors,
                                      change: dict, says: str) -> None:  # type: ignore[type-arg]
    chunk = data("bad", 4096)
    cid, fids = _coded(cluster, chunk)
    fields = {"chunk_id": cid, "length": len(chunk), "k": 4, "m": 2, "fragment_ids": fids,
              "fragments": [Source(i, f"127.0.0.1:{7001 + i}") for i in range(6)],
              "out_k": 4, "out_m": 2, "targets": [Target(1, "127.0.0.1:7007")], **change}
    with pytest.raises(InvalidArgument, match=says):
        recoder.recode(RecodeJob(**fields))


def test_recoder_refuses_a_repair_that_does_not_match_the_record(
        recoder: Recoder, cluster: Benefactors) -> None:
    chunk = data("mismatch", MiB)
    cid, fids = _coded(cluster, chunk)
    wrong = list(fids)
    wrong[5] = chunk_id(b"not fragment 5")
    sources = [Source(i, f"127.0.0.1:{7001 + i}") for i in range(4)]
    with pytest.raises(IntegrityError, match="rebuilt fragment 5"):
        recoder.recode(RecodeJob(cid, len(chunk), k=4, m=2, fragment_ids=wrong,
                                 fragments=sources, out_k=4, out_m=2,
                                 targets=[Target(5, "127.0.0.1:7007")]))
    assert not cluster.stores["127.0.0.1:7007"].has(wrong[5])
    # Too few readable: Unavailable, saying how many.
    with pytest.raises(Unavailable, match="3 of the 4 fragments"):
        recoder.recode(RecodeJob(cid, len(chunk), k=4, m=2, fragment_ids=fids,
                                 fragments=sources[:3], out_k=4, out_m=2,
                                 targets=[Target(5, "127.0.0.1:7007")]))


@pytest.mark.parametrize(("k", "m", "ids"), [(20, 2, 22), (4, 0, 4), (4, 2, 5)])
def test_fsck_finds_bad_fragment_layouts(ec: Manager, cluster: Benefactors, k: int, m: int,
                                         ids: int) -> None:
    chunk = data("fsck", MiB)
    cid, layout = store_coded(ec, cluster, "f", chunk, ["b0", "b1", "b2", "b3", "b4", "b5"])
    with ec.store.transaction(write=True) as tx:
        rec = tx.chunk(cid)
        assert rec is not None
        rec.ec_k, rec.ec_m = k, m
        del rec.fragment_ids[:]
        rec.fragment_ids.extend([layout.ids[0]] * ids)
        del rec.fragment_holders[:]
        rec.fragment_holders.extend([""] * (k + m))
        tx.put_chunk(cid, rec)
    assert "bad_fragments" in {f.kind for f in fsck(ec.store).findings}


def test_fsck_finds_a_short_fragment_id(ec: Manager, cluster: Benefactors) -> None:
    chunk = data("fsck-id", MiB)
    cid, _ = store_coded(ec, cluster, "f", chunk, ["b0", "b1", "b2", "b3", "b4", "b5"])
    with ec.store.transaction(write=True) as tx:
        rec = tx.chunk(cid)
        assert rec is not None
        rec.fragment_ids[2] = b"x" * 31
        tx.put_chunk(cid, rec)
    findings = fsck(ec.store).findings
    assert [f.kind for f in findings if f.kind == "bad_fragments"] == ["bad_fragments"]
    assert not any(f.repairable for f in findings if f.kind == "bad_fragments")


# --- repair keeps going: parked repairs let out, a failing target avoided ------------------


def _idle(mgr: Manager) -> None:
    assert mgr.repairer is not None
    deadline = time.monotonic() + 10
    while mgr.repairer.oldest_work_ns() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)


def test_parked_repairs_are_not_stranded(ec: Manager, cluster: Benefactors,
                                         clock: Clock) -> None:
    ec.store.update_pool("default", redundancy="ec:1+1", ec_min_chunk=0)
    coder = make_coder("isal")
    ids = []
    for n in range(13):
        chunk = data(f"p{n}", 64 * 1024 + n)
        frags = coder.fragments(chunk, 1, 1)
        fids = tuple(chunk_id(f) for f in frags)
        for fid, f, h in zip(fids, frags, ("b0", "b1"), strict=True):
            cluster.of(h).put(fid, bytes(f))
        ino = new_file(ec.store, f"p{n}")
        lease = ec.open_write(ino, "test")
        ec.commit_version(lease.lease_id, ino, [(chunk_id(chunk), len(chunk))], [],
                          fragments=[(chunk_id(chunk), Fragments(1, 1, fids, ("b0", "b1")))])
        ids.append(chunk_id(chunk))
    rep = ec.repairer
    assert rep is not None
    cluster.down.add("127.0.0.1:7001")
    keep_alive(ec, clock, [f"b{i}" for i in range(N) if i != 1])
    # L1..L4 live, D1..D8 to be deleted, X live: queued in this order (as a walk would).
    rep.enqueue(ids)
    rep.step()
    assert rep._parked_ids, "some were parked behind b0's window"
    _idle(ec)
    for n in range(4, 12):  # the files of D1..D8 go
        ec.store.unlink(ROOT_INODE, f"p{n}")
    for _ in range(40):
        rep.step()
        _idle(ec)
        clock.now += 1
        assert ec.replicator is not None
        ec.replicator.step()
    rec = ec.store.chunk(ids[12])
    assert rec is not None
    assert "b1" not in rec.fragment_holders and all(rec.fragment_holders), (
        f"X never repaired: holders {list(rec.fragment_holders)}, "
        f"parked {len(rep._parked_ids)}, busy {rep.busy()}")


def test_a_target_that_keeps_failing_is_not_picked_forever(
        ec: Manager, cluster: Benefactors, clock: Clock) -> None:
    chunk = data("badtarget", 1 << 20)
    bad: set[str] = set()
    recode = cluster.recode

    def first_target_fails(address: str, request: bpb.RecodeChunkRequest,
                           timeout: float) -> bpb.RecodeChunkResponse:
        if not bad:  # the first target planned has a failing disk
            bad.add(request.targets[0].address or address)
        return recode(address, request, timeout)

    for address, st in cluster.stores.items():
        orig = st.put

        def put(blob: bytes, data: bytes, *a, _orig=orig, _addr=address, **kw):  # type: ignore[no-untyped-def]
            if _addr in bad:
                raise InternalError("I/O error")
            return _orig(blob, data, *a, **kw)
        st.put = put  # type: ignore[method-assign]

    assert ec.repairer is not None and ec.replicator is not None
    ec.repairer._recode = first_target_fails
    cid, _ = store_coded(ec, cluster, "f", chunk, ["b0", "b1", "b2", "b3", "b4", ""])
    for _ in range(20):
        ec.replicator.step()
        ec.repairer.step()
        time.sleep(0.1)
        keep_alive(ec, clock, [f"b{i}" for i in range(8)], seconds=2.5)  # past retry_s
    rec = ec.store.chunk(cid)
    assert rec is not None
    tried = [r.targets[0].address or a for a, r in cluster.asked]
    assert all(rec.fragment_holders), (
        f"still short after {len(cluster.asked)} rebuilds, targets tried: {set(tried)}")
