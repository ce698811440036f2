"""The manager's write protocol around the store: write leases, placement and the benefactor
registry, pools, concurrent operations. Time for leases and liveness comes from a test
clock so expiry is exact and instant."""

from __future__ import annotations

import itertools

import pytest

from mosafs._proto import benefactor_pb2, manager_pb2
from mosafs.errors import (
    AccessDenied,
    ConfigError,
    InvalidArgument,
    IsADirectory,
    LeaseExpired,
    NoSpace,
    NotFound,
    Unavailable,
)
from mosafs.manager.core import MAX_FIND_CHUNKS, Manager, ManagerConfig
from mosafs.manager.metadata import ROOT_INODE, MetadataStore
from tests.unit.managers import Clock, MiB, cid, commit, new_file, refcount, register

# --- leases -------------------------------------------------------------------------------

def test_write_lease_expires_unless_renewed(mgr: Manager, clock: Clock) -> None:
    register(mgr, "b1")
    f = new_file(mgr.store, "f")
    lease = mgr.open_write(f, "c")
    assert lease.lease_ttl_ms == 60_000
    clock.now += 50
    assert mgr.renew_lease(lease.lease_id) == 60_000
    clock.now += 50  # 100 s after opening, 50 s after renewing
    register(mgr, "b1")  # keep the benefactor alive
    mgr.commit_version(lease.lease_id, f, [(cid(1), 1)], [(cid(1), ["b1"])])
    lease = mgr.open_write(f, "c")
    clock.now += 61
    with pytest.raises(LeaseExpired, match="expired"):
        mgr.renew_lease(lease.lease_id)
    with pytest.raises(LeaseExpired):
        mgr.commit_version(lease.lease_id, f, [(cid(1), 1)], [])
    assert mgr.store.getattr(f).version == 1


def test_lease_is_consumed_and_bound_to_its_inode(mgr: Manager) -> None:
    register(mgr, "b1")
    f, g = new_file(mgr.store, "f"), new_file(mgr.store, "g")
    lease = mgr.open_write(f, "c")
    with pytest.raises(LeaseExpired, match=f"inode {f}"):
        mgr.commit_version(lease.lease_id, g, [], [])
    mgr.commit_version(lease.lease_id, f, [], [])
    # A repeat of the same commit is answered with its version (tests/unit/test_pruning_
    # commits.py); other content on a used lease is refused.
    assert mgr.commit_version(lease.lease_id, f, [], [])[0] == 1
    with pytest.raises(LeaseExpired, match="committed already"):
        mgr.commit_version(lease.lease_id, f, [(cid(1), 1)], [(cid(1), ["b1"])])
    with pytest.raises(LeaseExpired):
        mgr.renew_lease(12345)
    lease = mgr.open_write(f, "c")
    mgr.abort_write(lease.lease_id)
    mgr.abort_write(lease.lease_id)  # idempotent
    mgr.abort_write(999)
    with pytest.raises(LeaseExpired):
        mgr.commit_version(lease.lease_id, f, [], [])
    assert mgr.store.getattr(f).version == 1


def test_lease_is_used_only_by_the_certificate_that_opened_it(mgr: Manager) -> None:
    """A client that may not write a file must not commit a version of it, take its write
    token or end its session through another client's lease: renew, commit (and its
    repeat) and abort with another certificate's fingerprint are refused."""
    register(mgr, "b1")
    f = new_file(mgr.store, "f")
    owner, other = b"\x01" * 32, b"\x02" * 32
    lease = mgr.open_write(f, "c", owner).lease_id
    for attempt in (lambda: mgr.renew_lease(lease, other),
                    lambda: mgr.commit_version(lease, f, [], [], holder=other),
                    lambda: mgr.abort_write(lease, other),
                    lambda: mgr.commit_version(lease, f, [], [])):  # plaintext's b""
        with pytest.raises(AccessDenied, match="another certificate"):
            attempt()
    assert mgr.store.getattr(f).version == 0
    assert mgr.renew_lease(lease, owner) == 60_000
    assert mgr.commit_version(lease, f, [], [], holder=owner)[0] == 1
    # The repeat of a stored commit answers only its holder; nor may another end it.
    with pytest.raises(AccessDenied):
        mgr.commit_version(lease, f, [], [], holder=other)
    with pytest.raises(AccessDenied):
        mgr.abort_write(lease, other)
    assert mgr.commit_version(lease, f, [], [], holder=owner)[0] == 1
    mgr.abort_write(lease, owner)


def test_lease_ids_are_random_not_a_counter(mgr: Manager) -> None:
    """Ids that follow each other would let a client guess the lease another just got."""
    register(mgr, "b1")
    f = new_file(mgr.store, "f")
    ids = [mgr.open_write(f, "c").lease_id for _ in range(64)]
    assert len(set(ids)) == 64 and 0 not in ids
    assert all(abs(a - b) > 1 for a, b in itertools.pairwise(ids))
    assert max(ids) >= 1 << 48  # spread over 64 bits (fails with odds 2**-1024)


def test_expired_leases_are_forgotten(mgr: Manager, clock: Clock) -> None:
    register(mgr, "b1")
    f = new_file(mgr.store, "f")
    for _ in range(5):
        mgr.open_write(f, "c")
    assert len(mgr.leases) == 5
    clock.now += 120
    register(mgr, "b1")
    mgr.open_write(f, "c")
    assert len(mgr.leases) == 1


# --- open-write placement and the registry ------------------------------------------------

def test_open_write_errors(mgr: Manager, clock: Clock) -> None:
    f = new_file(mgr.store, "f")
    with pytest.raises(Unavailable, match="no live benefactor"):
        mgr.open_write(f, "c")
    register(mgr, "full", free=0)
    with pytest.raises(NoSpace):
        mgr.open_write(f, "c")
    register(mgr, "b1")
    with pytest.raises(IsADirectory):
        mgr.open_write(ROOT_INODE, "c")
    with pytest.raises(NotFound):
        mgr.open_write(4242, "c")
    assert [t.id for t in mgr.open_write(f, "c").targets] == ["b1"]
    clock.now += 5.1  # every benefactor lease runs out: nobody live (retryable)
    with pytest.raises(Unavailable):
        mgr.open_write(f, "c")
    assert len(mgr.leases) == 1


def test_placement_round_robin(mgr: Manager) -> None:
    for i in range(4):
        register(mgr, f"b{i}", port=7000 + i)
    f = new_file(mgr.store, "f")
    firsts = []
    for _ in range(5):
        reply = mgr.open_write(f, "c")
        ids = [t.id for t in reply.targets]
        assert len(ids) == 3 == len(set(ids))
        firsts.append(ids[0])
        start = int(ids[0][1:])
        assert ids == [f"b{(start + k) % 4}" for k in range(3)]
        assert reply.targets[0].address == f"127.0.0.1:{7000 + start}"
        assert reply.pool == mgr.store.pool("default")
    assert firsts == ["b0", "b1", "b2", "b3", "b0"]


def test_stripe_width_is_capped_by_available_benefactors(mgr: Manager) -> None:
    mgr.store.update_pool("default", stripe_width=8)
    register(mgr, "b1")
    register(mgr, "b2")
    register(mgr, "b3", free=0)
    reply = mgr.open_write(new_file(mgr.store, "f"), "c")
    assert sorted(t.id for t in reply.targets) == ["b1", "b2"]


def test_register_validates_identity(mgr: Manager) -> None:
    bad = [("", "h:1"), ("a b", "h:1"), ("x" * 129, "h:1"), ("ok", "nohostport"),
           ("ok", "h:0"), ("ok", "h:65536"), ("ok", ":80"), ("ok", "h:http")]
    for bid, address in bad:
        with pytest.raises(InvalidArgument):
            mgr.registry.register(benefactor_pb2.BenefactorInfo(id=bid, address=address))
    with pytest.raises(InvalidArgument, match="pool"):
        mgr.registry.register(benefactor_pb2.BenefactorInfo(
            id="ok", address="h:1", pool="nope"))
    mgr.registry.register(benefactor_pb2.BenefactorInfo(id="A-z_0.9", address="[::1]:70"))
    assert mgr.store.benefactors().keys() == {"A-z_0.9"}


def test_heartbeats_and_liveness(mgr: Manager, store: MetadataStore, clock: Clock) -> None:
    info = benefactor_pb2.BenefactorInfo(id="b1", address="h:1", capacity_bytes=100,
                                         free_bytes=60, chunks=3)
    with pytest.raises(NotFound, match="register"):
        mgr.registry.heartbeat(info)
    mgr.registry.register(info)
    clock.now += 4
    info.free_bytes = 50
    mgr.registry.heartbeat(info)
    clock.now += 4
    [status] = mgr.registry.statuses()
    assert status.alive and status.last_heartbeat_age_ms == 4000
    assert status.info.free_bytes == 50 and status.info.pool == "default"
    assert mgr.statfs() == manager_pb2.StatFsResponse(capacity_bytes=100, free_bytes=50,
                                                      files=1)
    moved = benefactor_pb2.BenefactorInfo(id="b1", address="h:2")
    with pytest.raises(NotFound, match="register again"):
        mgr.registry.heartbeat(moved)
    clock.now += 2
    assert not mgr.registry.is_alive("b1")
    assert mgr.statfs().capacity_bytes == 0
    # A restarted manager knows the registration but not the liveness, until a heartbeat.
    restarted = Manager(store, ManagerConfig(benefactor_lease_s=5), clock=clock)
    [status] = restarted.registry.statuses()
    assert not status.alive and status.last_heartbeat_age_ms == -1
    restarted.registry.heartbeat(info)
    assert restarted.registry.is_alive("b1")


def test_find_and_locate_chunks(mgr: Manager, clock: Clock) -> None:
    register(mgr, "b1", port=1)
    register(mgr, "b2", port=2)
    f = new_file(mgr.store, "f")
    commit(mgr, f, [(cid(1), 10)], place_on="b1")
    commit(mgr, f, [(cid(1), 10), (cid(2), 10)], place_on="b2")
    assert mgr.find_chunks([cid(1), cid(2), cid(3), cid(1)]) == [True, True, False, True]
    reply = mgr.locate_chunks([cid(2), cid(3), cid(2)])
    assert [(loc.id, list(loc.benefactor_ids)) for loc in reply.locations] == [(cid(2), ["b2"])]
    assert [(b.id, b.address) for b in reply.benefactors] == [("b2", "127.0.0.1:2")]
    clock.now += 3
    register(mgr, "b2", port=2)  # only b2 keeps its lease
    clock.now += 3
    assert mgr.find_chunks([cid(1), cid(2)]) == [False, True]
    with pytest.raises(InvalidArgument, match="32 bytes"):
        mgr.find_chunks([cid(1), b"../x"])
    with pytest.raises(InvalidArgument, match="at most"):
        mgr.find_chunks([cid(1)] * (MAX_FIND_CHUNKS + 1))
    with pytest.raises(InvalidArgument):
        mgr.locate_chunks([b""])


def test_block_map_lists_live_replicas_first(mgr: Manager, clock: Clock) -> None:
    register(mgr, "b1", port=1)
    register(mgr, "b2", port=2)
    f = new_file(mgr.store, "f")
    lease = mgr.open_write(f, "c")
    mgr.commit_version(lease.lease_id, f, [(cid(1), 10)], [(cid(1), ["b1", "b2"])])
    assert list(mgr.block_map(f).locations[0].benefactor_ids) == ["b1", "b2"]
    clock.now += 4
    register(mgr, "b2", port=2)
    clock.now += 4
    assert list(mgr.block_map(f).locations[0].benefactor_ids) == ["b2", "b1"]


# --- pools --------------------------------------------------------------------------------

def test_update_pool_validates_and_keeps_what_is_not_given(store: MetadataStore) -> None:
    out = store.update_pool("default", replication=2, chunker="fixed:65536")
    assert (out.replication, out.stripe_width, out.chunker) == (2, 3, "fixed:65536")
    assert store.update_pool("default") == out
    for kwargs in ({"chunker": "cdc:1:3:8"}, {"chunker": "fixed:x"}, {"chunker": "rabin:4"},
                   {"chunker": "fixed:0"}, {"chunker": f"fixed:{64 * MiB + 1}"},
                   {"replication": 0}, {"stripe_width": -1}, {"write_semantics": "eventual"},
                   {"hash_backend": "tpu"}):
        with pytest.raises(ConfigError):
            store.update_pool("default", **kwargs)  # type: ignore[arg-type]
    assert store.pool("default") == out
    with pytest.raises(NotFound):
        store.update_pool("nope", replication=1)


def test_concurrent_operations_from_threads(mgr: Manager) -> None:
    """The gRPC worker threads share one store: writers serialise, readers see snapshots,
    and no update is lost."""
    from concurrent.futures import ThreadPoolExecutor

    store = mgr.store
    register(mgr, "b1")
    d = store.mkdir(ROOT_INODE, "d", 0o755).inode

    def work(i: int) -> int:
        f = new_file(store, f"f{i}", d)
        commit(mgr, f, [(cid(i % 7), 10), (cid(100), 10)])
        store.readdir(d)
        store.mkdir(d, f"sub{i}", 0o755)
        return f

    with ThreadPoolExecutor(16) as pool:
        inodes = list(pool.map(work, range(64)))
    assert len(set(inodes)) == 64
    assert store.getattr(d).nlink == 2 + 64
    assert refcount(store, cid(100)) == 64
    assert store.refcount_mismatches() == {}
