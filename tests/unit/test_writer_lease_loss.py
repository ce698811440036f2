"""A write session that spans a manager restart (docs/durability.md, "Manager restarts"):
the chunks it stored under its first lease are orphans to garbage collection once the
restarted manager forgot that lease, so a new lease must never commit them on the old
one's say (they may be deleted by then: the commit would make a version of bytes that
exist nowhere). The real WriteSession, Manager, LeaseTable and GarbageCollector on a real
LMDB; the client's manager calls go straight to the Manager, as the servicer maps them."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import trio

from mosafs._proto import benefactor_pb2
from mosafs._proto import manager_pb2 as mpb
from mosafs.client.files.blockmap import ChunkEntry
from mosafs.client.files.context import ClientConfig
from mosafs.client.files.writer import WriteSession
from mosafs.errors import LeaseExpired, MosafsError
from mosafs.manager.core import Manager, ManagerConfig
from mosafs.manager.garbage import GarbageCollector
from mosafs.manager.metadata import MetadataStore, SessionCommit
from tests.unit.managers import Clock, Wall, cid, new_file, register

GRACE_S = 5.0


class LocalManager:
    """The client's manager calls, straight onto a Manager (as the servicer maps them)."""

    def __init__(self, mgr: Manager) -> None:
        self.mgr = mgr

    async def open_write(self, inode: int, client_id: str) -> mpb.OpenWriteResponse:
        return self.mgr.open_write(inode, client_id)

    async def renew_lease(self, lease_id: int) -> bytes:
        self.mgr.renew_lease(lease_id)
        return b""

    async def abort_write(self, lease_id: int) -> None:
        self.mgr.abort_write(lease_id)

    async def commit_version(self, request: mpb.CommitVersionRequest) -> mpb.CommitVersionResponse:
        version, attr = self.mgr.commit_version(
            request.lease_id, request.inode, [(c.id, c.length) for c in request.chunks],
            [(p.id, list(p.benefactor_ids)) for p in request.placements],
            mtime_ns=request.mtime_ns, new_bytes=request.new_bytes,
            session=SessionCommit(provisional=request.provisional,
                                  replaces_version=request.replaces_version,
                                  session=request.session))
        return mpb.CommitVersionResponse(version=version, attr=attr)


def _heartbeat(mgr: Manager, bid: str, port: int) -> None:
    mgr.registry.heartbeat(benefactor_pb2.BenefactorInfo(
        id=bid, address=f"127.0.0.1:{port}", capacity_bytes=2 * 10**12, free_bytes=10**12))


def _restart(store: MetadataStore) -> Manager:
    """A new manager process on the same store: leases and sightings forgotten; the
    benefactors resume their heartbeats (no re-registration: their records persist)."""
    m = Manager(store, ManagerConfig(gc_grace_s=GRACE_S), clock=Clock())
    _heartbeat(m, "b1", 7000)
    _heartbeat(m, "b2", 7001)
    return m


def _ctx(manager: LocalManager) -> SimpleNamespace:
    return SimpleNamespace(manager=manager, client_id="client", workers=None,
                           config=ClientConfig(manager="127.0.0.1:1"),
                           spawn=lambda *a, **k: None)


@pytest.mark.parametrize("new_lease_before_grace", [False, True])
def test_commit_after_restart_never_names_blobs_gc_released(
        store: MetadataStore, new_lease_before_grace: bool) -> None:
    store.update_pool("default", replication=2, write_semantics="pessimistic")
    m1 = Manager(store, ManagerConfig(gc_grace_s=GRACE_S), clock=Clock())
    register(m1, "b1")
    register(m1, "b2", port=7001)
    inode = new_file(store, "ckpt")
    c = cid(1)
    local = LocalManager(m1)
    ctx = _ctx(local)
    outcome: dict[str, object] = {}

    async def main() -> None:
        session = await WriteSession.create(ctx, inode)
        first = session.lease
        assert first is not None
        # The session puts chunk C on both targets (pessimistic, R=2), as a checkpoint
        # writer does, and keeps writing.
        put_ns = time.time_ns()
        session.stored.ids.add(c)
        session.stored.placements[c] = ["b1", "b2"]
        session.stored.new_bytes += 10
        session.replace_content([ChunkEntry(c, 10)])

        # The manager restarts.
        m2 = _restart(store)
        local.mgr = m2
        wall = Wall()
        gc = GarbageCollector(store, m2.leases, grace_s=GRACE_S, wall_ns=wall)
        # An inventory round (periodic, or `mosafs gc`) sees C unreferenced.
        for bid in ("b1", "b2"):
            gc.review(bid, [(c, put_ns - 5 * 10**9)])
        # The renewal loop learns that the lease is gone.
        with pytest.raises(LeaseExpired):
            await local.renew_lease(first.lease_id)
        session._renewal_refused(first)
        assert session.lease is None
        if new_lease_before_grace:
            # The next write() takes a new lease at once (writer.py write -> _acquire_lease)
            # and the session goes on writing longer than --gc-grace.
            await session._acquire_lease()
            assert session.lease is not None
        wall.advance(GRACE_S + 1)
        released = []
        for bid in ("b1", "b2"):
            ids, _ = gc.review(bid, [(c, put_ns - 5 * 10**9)])
            if c in ids:
                released.append(bid)  # the benefactor deletes its copy now
        outcome["released"] = released
        try:
            reply = await session.commit()
            outcome["version"] = reply.version if reply else None
        except MosafsError as exc:
            outcome["error"] = exc

    trio.run(main)
    assert outcome["released"] == ["b1", "b2"]  # what the collector may do, and did
    assert isinstance(outcome.get("error"), LeaseExpired), outcome
    assert store.chunk(c) is None, "no record names the deleted copies"
    assert store.getattr(inode).size == 0  # the file keeps its previous (empty) content


class BufferingPipeline:
    """Holds appended bytes; stores them as one chunk only when drained (as a real
    pipeline does for a write smaller than a chunk)."""

    stored_any = False  # nothing claimed, nothing sent

    def __init__(self, session: WriteSession) -> None:
        self.session = session
        self.data = b""

    async def append(self, data: bytes) -> None:
        self.data += data

    async def send_rest(self) -> None:
        pass

    async def finish(self) -> list[ChunkEntry]:
        c = cid(99)
        self.session.stored.ids.add(c)
        self.session.stored.placements[c] = ["b1"]  # put under the *current* lease
        self.session.stored.new_bytes += len(self.data)
        return [ChunkEntry(c, len(self.data))]


def test_small_stream_write_survives_a_lease_that_expired_with_nothing_stored(
        store: MetadataStore) -> None:
    store.update_pool("default", replication=1)
    m1 = Manager(store, ManagerConfig(gc_grace_s=GRACE_S), clock=Clock())
    register(m1, "b1")
    register(m1, "b2", port=7001)
    inode = new_file(store, "f")
    local = LocalManager(m1)
    ctx = _ctx(local)
    out: dict[str, object] = {}

    async def main() -> None:
        session = await WriteSession.create(ctx, inode)

        async def fake_pipeline() -> BufferingPipeline:
            return BufferingPipeline(session)
        session._new_pipeline = fake_pipeline  # type: ignore[method-assign]
        await session.write(0, b"hello")  # buffered: no chunk stored, no placement
        assert not session.stored.placements
        first = session.lease
        local.mgr = _restart(store)  # the manager restarts: the lease is forgotten
        with pytest.raises(LeaseExpired):
            await local.renew_lease(first.lease_id)
        session._renewal_refused(first)
        try:
            reply = await session.commit()
            out["version"] = reply.version
        except LeaseExpired as exc:
            out["error"] = exc

    trio.run(main)
    assert "error" not in out, f"session lost with nothing stored: {out.get('error')}"
    assert store.getattr(inode).size == 5
