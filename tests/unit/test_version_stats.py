"""Where a version's chunks came from, the base named by its path (issue 16, point 6), and
provisional versions replaced by their write session's next commit (point 7), on a real
LMDB store through the manager's write protocol."""

from __future__ import annotations

from pathlib import Path

import pytest

from mosafs._proto import metadata_pb2
from mosafs.errors import InvalidArgument
from mosafs.manager.core import Manager, ManagerConfig
from mosafs.manager.fsck import fsck
from mosafs.manager.metadata import ROOT_INODE, MetadataStore, SessionCommit
from mosafs.manager.pruning import Policy
from tests.unit.managers import Clock, MiB, cid, commit, consistent, new_file, refcount, register

SESSION = b"s" * 16


def write(mgr: Manager, inode: int, chunks: list[tuple[bytes, int]], *,
          provisional: bool = False, replaces: int = 0, session: bytes = SESSION,
          place: list[bytes] | None = None, sent: int = 0) -> int:
    """One commit with a fresh lease, as a client's write session makes it: chunks the
    index lacks (or PLACE) placed on b1."""
    lease = mgr.open_write(inode, "client")
    placed = place if place is not None else [
        c for c, _ in chunks if mgr.store.chunk(c) is None]
    version, _ = mgr.commit_version(
        lease.lease_id, inode, chunks, [(c, ["b1"]) for c in placed], new_bytes=sent,
        session=SessionCommit(provisional=provisional, replaces_version=replaces,
                              session=session))
    return version


def sources(store: MetadataStore, inode: int, version: int = 0) -> tuple[int, ...]:
    s = store.version_stats(inode, version)
    return (s.shared_chunks, s.stored_chunks, s.indexed_chunks, s.repeated_chunks)


def kept(store: MetadataStore, inode: int) -> list[int]:
    return [v.version for v in store.list_versions(inode)]


@pytest.fixture
def b1(mgr: Manager) -> Manager:
    register(mgr, "b1")
    return mgr


# --- where chunks came from -----------------------------------------------------------------

def test_unit_sources_split_base_stored_cluster_and_repeats(b1: Manager) -> None:
    store = b1.store
    other, f = new_file(store, "other"), new_file(store, "f")
    commit(b1, other, [(cid(9), 900)])  # elsewhere in the cluster
    commit(b1, f, [(cid(1), 100), (cid(2), 200)])
    # Version 2: one chunk of the base (twice), one found in the index, one stored (and
    # repeated), in that order of the block-map.
    chunks = [(cid(1), 100), (cid(9), 900), (cid(3), 30), (cid(3), 30), (cid(1), 100)]
    assert write(b1, f, chunks, place=[cid(3)], sent=30) == 2
    s = store.version_stats(f)
    assert sources(store, f) == (2, 1, 1, 1)
    assert (s.shared_bytes, s.stored_bytes, s.indexed_bytes, s.repeated_bytes) == (
        200, 30, 900, 30)
    assert s.chunks == 5 and s.size == 1160 and s.new_bytes == 30 and s.sources_known
    # The first version of a new file: everything stored, nothing from a base.
    assert sources(store, f, 1) == (0, 2, 0, 0)
    assert store.version_stats(f, 1).base_version == 0


def test_unit_a_file_whose_bytes_were_all_stored_says_so(b1: Manager) -> None:
    """The issue's case: a copy of a stored file sends nothing and reported 'shared 0,
    deduped against nothing'; now every chunk is found in the cluster."""
    store = b1.store
    a, b = new_file(store, "a"), new_file(store, "b")
    chunks = [(cid(n), MiB) for n in range(1, 5)]
    commit(b1, a, chunks)
    assert write(b1, b, chunks) == 1
    s = store.version_stats(b)
    assert sources(store, b) == (0, 0, 4, 0)
    assert (s.indexed_bytes, s.new_bytes, s.base_version) == (4 * MiB, 0, 0)


def test_unit_a_record_from_before_the_sources_reads(tmp_path: Path) -> None:
    """A VersionRecord written before the new fields (proto3: they read 0): the figures
    are not known, unless every entry was shared with the base (then they are)."""
    with MetadataStore(tmp_path / "m", map_size=64 * MiB) as store:
        mgr = Manager(store, ManagerConfig(), clock=Clock())
        register(mgr, "b1")
        f = new_file(store, "f")
        commit(mgr, f, [(cid(1), 10), (cid(2), 10)])
        commit(mgr, f, [(cid(1), 10), (cid(2), 10)])
        old_style = {1: metadata_pb2.VersionRecord(size=20, chunks=2, new_bytes=20,
                                                   commit_time_ns=1, mtime_ns=1),
                     2: metadata_pb2.VersionRecord(size=20, chunks=2, shared_chunks=2,
                                                   shared_bytes=20, base_inode=f,
                                                   base_version=1, commit_time_ns=2,
                                                   mtime_ns=2)}
        with store.transaction(write=True) as tx:
            for version, rec in old_style.items():
                tx.txn.put(f.to_bytes(8, "big") + version.to_bytes(8, "big"),
                           rec.SerializeToString(), db=tx.db.versions)
        first, second = store.list_versions(f)
        assert not first.sources_known and first.stored_chunks == 0
        assert not first.provisional and first.replaced_versions == 0
        assert second.sources_known and second.shared_chunks == 2
        assert fsck(store).findings == []


# --- the base, by its path ------------------------------------------------------------------

def test_unit_the_base_is_named_by_its_path(b1: Manager) -> None:
    store = b1.store
    d = store.mkdir(ROOT_INODE, "ckpt", 0o755).inode
    step1 = new_file(store, "app.n0.1", d)
    commit(b1, step1, [(cid(1), 10), (cid(2), 10)])
    step2 = new_file(store, "app.n0.2", d)  # the series base: step 1
    write(b1, step2, [(cid(1), 10), (cid(3), 10)])
    s = store.version_stats(step2)
    assert (s.base_inode, s.base_version, s.base_path) == (step1, 1, "/ckpt/app.n0.1")
    assert (s.base_removed, s.base_version_kept) == (False, True)
    assert sources(store, step2) == (1, 1, 0, 0)
    # Renamed since: the path it has now.
    store.rename(d, "app.n0.1", ROOT_INODE, "kept.n0.1")
    assert store.version_stats(step2).base_path == "/kept.n0.1"
    # Its name went while another hard link remains: no path, not removed.
    store.link(step1, ROOT_INODE, "hard")
    store.unlink(ROOT_INODE, "kept.n0.1")
    s = store.version_stats(step2)
    assert (s.base_path, s.base_removed) == ("", False)
    # Removed: said so.
    store.unlink(ROOT_INODE, "hard")
    s = store.version_stats(step2)
    assert (s.base_path, s.base_removed, s.base_version_kept) == ("", True, False)
    assert s.base_inode == step1  # still named by number


def test_unit_the_base_version_pruned_since_is_said(b1: Manager) -> None:
    store = b1.store
    f = new_file(store, "model.pt")
    commit(b1, f, [(cid(1), 10)])
    commit(b1, f, [(cid(1), 10), (cid(2), 10)])
    commit(b1, f, [(cid(2), 10), (cid(3), 10)])
    b1.set_folder(ROOT_INODE, pool=None, series_pattern=None, policy=Policy(keep_last=2),
                  clear_policy=False)
    assert kept(store, f) == [2, 3]
    v2, v3 = store.list_versions(f)
    assert (v2.base_version, v2.base_path, v2.base_version_kept) == (1, "/model.pt", False)
    assert (v3.base_version, v3.base_version_kept) == (2, True)


# --- provisional versions -------------------------------------------------------------------

def test_unit_fsyncs_of_one_session_leave_one_version(b1: Manager) -> None:
    """20 fsync commits of one open session, each replacing the one before: one version
    remains, standing for the whole session (its base, its bytes sent, its chunks)."""
    store = b1.store
    f = new_file(store, "db.sqlite")
    commit(b1, f, [(cid(100), 10)])  # a version from an earlier session: kept
    previous = 0
    for step in range(1, 21):
        chunks = [(cid(100), 10), *((cid(n), 10) for n in range(1, step + 1))]
        version = write(b1, f, chunks, provisional=True, replaces=previous,
                        place=[cid(step)], sent=10)
        assert kept(store, f) == [1, version]
        previous = version
    s = store.version_stats(f)
    assert (s.version, s.provisional, s.replaced_versions) == (21, True, 19)
    # Every chunk the session stored counts as stored, not as found in the index; the
    # base is the version the session started from.
    assert (s.base_version, s.base_path) == (1, "/db.sqlite")
    assert sources(store, f) == (1, 20, 0, 0)
    assert s.new_bytes == 200
    assert all(refcount(store, cid(n)) == 1 for n in range(1, 21))
    assert consistent(store) and fsck(store).findings == []
    # The final close replaces the last fsync'ed version; nothing is provisional after.
    version = write(b1, f, [(cid(100), 10), (cid(1), 10)], replaces=previous, place=[])
    s = store.version_stats(f)
    assert kept(store, f) == [1, version] and not s.provisional
    assert (s.replaced_versions, s.stored_chunks, s.shared_chunks) == (20, 1, 1)
    assert [refcount(store, cid(n)) for n in (1, 2, 20)] == [1, 0, 0]
    assert consistent(store)


def test_unit_only_the_same_session_replaces_and_only_the_newest(b1: Manager) -> None:
    store = b1.store
    f = new_file(store, "f")
    v1 = write(b1, f, [(cid(1), 10)], provisional=True)
    # Another session (a crashed writer's provisional version stays).
    v2 = write(b1, f, [(cid(2), 10)], replaces=v1, session=b"other")
    assert kept(store, f) == [v1, v2]
    # Not the newest any more: another writer committed since; both stay.
    v3 = write(b1, f, [(cid(3), 10)], provisional=True, session=b"third")
    write(b1, f, [(cid(4), 10)], session=b"fourth")
    v5 = write(b1, f, [(cid(5), 10)], replaces=v3, session=b"third")
    assert kept(store, f) == [v1, v2, v3, 4, v5]
    # A version committed final is never replaced.
    v6 = write(b1, f, [(cid(6), 10)], replaces=v5, session=b"third")
    assert kept(store, f)[-2:] == [v5, v6]
    assert consistent(store)


def test_unit_session_rules_are_checked(b1: Manager) -> None:
    f = new_file(b1.store, "f")
    for session in (SessionCommit(provisional=True), SessionCommit(replaces_version=1),
                    SessionCommit(session=b"x" * 65), SessionCommit(replaces_version=-1,
                                                                    session=b"s")):
        lease = b1.open_write(f, "c").lease_id
        with pytest.raises(InvalidArgument):
            b1.commit_version(lease, f, [(cid(1), 10)], [(cid(1), ["b1"])], session=session)
    assert kept(b1.store, f) == []


def test_unit_a_repeated_replacing_commit_is_one_version(b1: Manager) -> None:
    """A replacing commit whose reply was lost is sent again with the same lease: the
    same version again, and nothing dropped twice."""
    store = b1.store
    f = new_file(store, "f")
    v1 = write(b1, f, [(cid(1), 10)], provisional=True)
    lease = b1.open_write(f, "c").lease_id
    request = ([(cid(1), 10), (cid(2), 10)], [(cid(2), ["b1"])])
    session = SessionCommit(replaces_version=v1, session=SESSION)
    first = b1.commit_version(lease, f, *request, session=session)
    assert b1.commit_version(lease, f, *request, session=session) == first
    assert kept(store, f) == [first[0]]
    assert [refcount(store, cid(n)) for n in (1, 2)] == [1, 1]
    assert consistent(store)


def test_unit_provisional_versions_survive_a_manager_restart(tmp_path: Path) -> None:
    """The mark is in LMDB: after a restart (leases forgotten) the session's next commit,
    under a new lease, still replaces its provisional version."""
    path = tmp_path / "m"
    with MetadataStore(path, map_size=64 * MiB) as store:
        mgr = Manager(store, ManagerConfig(), clock=Clock())
        register(mgr, "b1")
        f = new_file(store, "f")
        v1 = write(mgr, f, [(cid(1), 10)], provisional=True)
    with MetadataStore(path, map_size=64 * MiB) as store:
        mgr = Manager(store, ManagerConfig(), clock=Clock())
        register(mgr, "b1")
        assert store.version_stats(f).provisional
        v2 = write(mgr, f, [(cid(1), 10), (cid(2), 10)], replaces=v1)
        assert kept(store, f) == [v2]
        assert sources(store, f) == (0, 2, 0, 0)  # cid(1): stored by this session
        assert consistent(store)
