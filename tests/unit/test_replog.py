"""Manager replication in one process (docs/standby.md): an active store with a
replication log, a standby database that starts from a snapshot and applies the log, and
the rules of the log itself (confirmation, the in-sync set, trimming, positions). The
processes and the Follow stream are tested in tests/services/test_standby.py."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest

from mosafs._proto import replication_pb2
from mosafs.errors import InvalidArgument, Unavailable
from mosafs.manager.active import _replication_log
from mosafs.manager.core import Manager, ManagerConfig
from mosafs.manager.metadata import ROOT_INODE, MetadataStore
from mosafs.manager.metadata.schema import DB_NAMES, _Dbs
from mosafs.manager.replog import Follower, ReplicationLog
from mosafs.manager.standby import Standby
from tests.unit.managers import Clock, cid, commit, new_file, register

MAP = 1 << 30


def dump(store: MetadataStore) -> dict[bytes, dict[bytes, bytes]]:
    """Every key and value of every sub-database."""
    out = {}
    with store.transaction() as tx:
        for name, f in zip(DB_NAMES, fields(_Dbs), strict=True):
            out[name] = {bytes(k): bytes(v)
                         for k, v in tx.txn.cursor(db=getattr(tx.db, f.name))}
    return out


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[MetadataStore, Standby]]:
    active = MetadataStore(tmp_path / "active" / "metadata.lmdb", map_size=MAP)
    (tmp_path / "standby").mkdir()
    standby = Standby(tmp_path / "standby", map_size=MAP)
    yield active, standby
    active.close()
    standby.close()


def start_log(store: MetadataStore, standbys: int = 0, **kw: float) -> ReplicationLog:
    seq, epoch = store.log_position()
    journal = ReplicationLog(epoch=epoch + 1, last_seq=seq, last_epoch=epoch,
                             standbys=standbys, **kw)
    store.attach_log(journal)
    journal.serve()
    return journal


def send_snapshot(active: MetadataStore, journal: ReplicationLog, f: Follower,
                  standby: Standby, tmp_path: Path, part: int = 4096) -> None:
    journal.snapshot_started(f)
    path = tmp_path / "snapshot.mdb"
    seq, epoch = active.snapshot_to(path)
    data = path.read_bytes()
    got = None
    for offset in range(0, len(data), part):
        got = standby.snapshot_part(replication_pb2.SnapshotPart(
            offset=offset, data=data[offset:offset + part], total_bytes=len(data),
            done=offset + part >= len(data), seq=seq, epoch=epoch))
    assert got == seq
    journal.snapshot_taken(f, seq)
    journal.confirmed(f, seq)


def catch_up(journal: ReplicationLog, f: Follower, standby: Standby) -> int:
    """Apply every entry sent to F; the seq reached."""
    while True:
        batch = journal.next_entries(f, timeout=0)
        assert batch is not None
        if not batch:
            return standby.position()[0]
        seq = applied(standby, batch)
        journal.confirmed(f, seq)


def applied(standby: Standby, batch: list[bytes]) -> int:
    """BATCH taken by STANDBY and applied to its database at once; the seq reached."""
    seq = standby.take(batch)
    standby.settle()
    return seq


def workload(store: MetadataStore, tag: str) -> None:
    """Writes through every path: single write transactions and group commits, namespace,
    versions, chunk index, benefactors and pools."""
    mgr = Manager(store, ManagerConfig(), clock=Clock())
    register(mgr, "b1")
    d = store.mkdir(ROOT_INODE, f"dir-{tag}", 0o755).inode
    for i in range(5):
        ino = new_file(store, f"f{i}", d)
        commit(mgr, ino, [(cid(i), 100), (cid(100 + i), 50)])
    store.unlink(d, "f3")
    store.rename(d, "f4", ROOT_INODE, f"moved-{tag}")
    store.setxattr(ROOT_INODE, f"user.{tag}", b"v")


def test_a_standby_from_a_snapshot_and_the_log_holds_what_the_active_holds(
        pair: tuple[MetadataStore, Standby], tmp_path: Path) -> None:
    active, standby = pair
    workload(active, "before")  # before the log: only a snapshot carries it
    journal = start_log(active)
    f = journal.attach("s1", *standby.position())
    assert f.needs_snapshot
    workload(active, "during")  # between the attach and the snapshot
    send_snapshot(active, journal, f, standby, tmp_path)
    workload(active, "after")
    assert catch_up(journal, f, standby) == journal.last_seq
    assert dump(standby.store) == dump(active)
    # Reopened, the standby stands where it was and goes on from the log, no snapshot.
    position = standby.position()
    standby.close()
    standby.__init__(tmp_path / "standby", map_size=MAP)  # type: ignore[misc]
    assert standby.position() == position
    journal.detach(f)
    g = journal.attach("s1", *position)
    assert not g.needs_snapshot
    workload(active, "again")
    catch_up(journal, g, standby)
    assert dump(standby.store) == dump(active)


def test_a_writer_waits_for_an_in_sync_standby_and_fails_cleanly_without_one(
        pair: tuple[MetadataStore, Standby], tmp_path: Path) -> None:
    active, standby = pair
    journal = start_log(active, standbys=1, wait_timeout_s=0.5, lag_timeout_s=0.2)
    with pytest.raises(Unavailable, match="stored on the active manager"):
        active.mkdir(ROOT_INODE, "alone", 0o755)  # nobody in sync: stored, not confirmed
    assert active.lookup(ROOT_INODE, "alone").inode
    f = journal.attach("s1", *standby.position())
    send_snapshot(active, journal, f, standby, tmp_path)
    catch_up(journal, f, standby)
    assert journal.followers() == [("s1", 0, True)]
    done = threading.Event()

    def write() -> None:
        active.mkdir(ROOT_INODE, "confirmed", 0o755)
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    assert not done.wait(0.1)  # it waits for the standby
    catch_up(journal, f, standby)
    assert done.wait(5)
    writer.join()
    assert standby.store.lookup(ROOT_INODE, "confirmed").inode
    # A standby that confirms nothing leaves the in-sync set; the writer fails, cleanly.
    with pytest.raises(Unavailable):
        active.mkdir(ROOT_INODE, "lagging", 0o755)
    assert journal.followers() == [("s1", 1, False)]
    catch_up(journal, f, standby)  # caught up again: back in the set
    assert journal.followers() == [("s1", 0, True)]


def test_positions_off_the_log_history_need_a_snapshot(tmp_path: Path) -> None:
    journal = ReplicationLog(epoch=5, last_seq=10, last_epoch=4, standbys=0)
    assert not journal.attach("a", 10, 4).needs_snapshot  # the base
    assert journal.attach("b", 0, 0).needs_snapshot       # nothing applied
    assert journal.attach("c", 10, 3).needs_snapshot      # same seq, another term
    assert journal.attach("d", 9, 4).needs_snapshot       # before the base
    assert journal.attach("e", 11, 5).needs_snapshot      # beyond what was appended
    journal.append(11, [(0, b"k", b"v")])
    assert not journal.attach("f", 11, 5).needs_snapshot


def test_entries_leave_memory_once_confirmed_or_past_the_limit() -> None:
    journal = ReplicationLog(epoch=1, last_seq=0, last_epoch=0, standbys=0, max_bytes=200)
    f = journal.attach("s", 0, 0)
    journal.snapshot_started(f)
    journal.snapshot_taken(f, 0)
    journal.append(2, [(1, b"b", b"x" * 50)])  # out of order: held until 1 comes
    assert journal.last_seq == 0
    journal.append(1, [(1, b"a", b"x" * 50)])
    assert journal.last_seq == 2
    sent = journal.next_entries(f, timeout=0)
    assert [replication_pb2.LogEntry.FromString(b).seq for b in sent or []] == [1, 2]
    journal.confirmed(f, 2)
    for seq in range(3, 10):  # past max_bytes while f confirms nothing
        journal.append(seq, [(1, b"k", b"x" * 100)])
    assert journal.next_entries(f, timeout=0) is None  # trimmed: it needs a snapshot
    assert f.needs_snapshot


def test_a_standby_refuses_entries_that_do_not_follow(
        pair: tuple[MetadataStore, Standby], tmp_path: Path) -> None:
    active, standby = pair
    journal = start_log(active)
    active.mkdir(ROOT_INODE, "logged", 0o755)
    f = journal.attach("s1", *standby.position())
    send_snapshot(active, journal, f, standby, tmp_path)
    seq, epoch = standby.position()
    assert (seq, epoch) == (1, 1)
    before = dump(standby.store)
    for bad in (replication_pb2.LogEntry(seq=seq + 2, epoch=epoch),
                replication_pb2.LogEntry(seq=seq + 1, epoch=epoch - 1),
                replication_pb2.LogEntry(seq=seq + 1, epoch=epoch,
                                         ops=[replication_pb2.LogOp(db=99, key=b"k")])):
        with pytest.raises(InvalidArgument):
            applied(standby, [bad.SerializeToString()])
    with pytest.raises(InvalidArgument, match="malformed"):
        standby.take([b"\xff\xff"])
    assert standby.position() == (seq, epoch)
    with pytest.raises(InvalidArgument):
        standby.snapshot_part(replication_pb2.SnapshotPart(offset=10, data=b"x"))
    assert dump(standby.store) == before


def incoming_files() -> list[str]:
    """The files this process holds open in a standby's metadata.incoming/."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own)
        if "metadata.incoming" in target:
            found.append(target)
    return found


def test_a_snapshot_refused_leaves_the_standby_as_it_was(
        pair: tuple[MetadataStore, Standby], tmp_path: Path) -> None:
    """A snapshot of the wrong size, one that is no LMDB copy, and one that does not hold
    the position it was announced at are refused before they take the database's place
    (a data directory that does not open is no standby), and leave no file open."""
    active, standby = pair
    journal = start_log(active)
    f = journal.attach("s1", *standby.position())
    send_snapshot(active, journal, f, standby, tmp_path)
    active.mkdir(ROOT_INODE, "later", 0o755)
    position, before = standby.position(), dump(standby.store)
    seq, epoch = active.snapshot_to(tmp_path / "later.mdb")
    data = (tmp_path / "later.mdb").read_bytes()

    def whole(data: bytes, *, total: int | None = None,
              at: tuple[int, int] = (seq, epoch)) -> replication_pb2.SnapshotPart:
        return replication_pb2.SnapshotPart(
            offset=0, data=data, total_bytes=len(data) if total is None else total,
            done=True, seq=at[0], epoch=at[1])

    for bad, says in ((whole(data, total=len(data) + 1), "ended after"),
                      (whole(b"x" * 8192), "no metadata database"),
                      (whole(data, at=(seq + 1, epoch)), f"holds {seq} of epoch {epoch}")):
        with pytest.raises(InvalidArgument, match=says):
            standby.snapshot_part(bad)
        assert not incoming_files()
        assert not (tmp_path / "standby" / "metadata.incoming").exists()
        assert standby.position() == position and dump(standby.store) == before
    assert standby.snapshot_part(whole(data)) == seq
    assert dump(standby.store) == dump(active)


# -- terms (docs/standby.md, "Epoch") -------------------------------------------------------

def log_as_active_starts_it(store: MetadataStore, standbys: int = 0) -> ReplicationLog:
    """STORE's replication log as mosafs.manager.active starts it (without failover),
    serving."""
    journal = _replication_log(argparse.Namespace(standbys=standbys, standby_wait=10.0),
                               store, None, None)
    journal.serve()
    return journal


def names(store: MetadataStore) -> set[str]:
    return {name for name, _ in store.readdir(ROOT_INODE)[0]}


def test_a_manager_killed_after_shipping_an_entry_it_never_stored_begins_a_new_term(
        tmp_path: Path) -> None:
    """The first entry of a term is shipped, taken by the standby, and the manager killed
    before its commit: its database still holds the previous epoch. Started again, it
    must not take the same term: its next change would be the same (seq, epoch) as the
    standby's, which would pass for a position on its history, and be acknowledged
    though the standby lacks it."""
    active = MetadataStore(tmp_path / "active" / "metadata.lmdb", map_size=MAP)
    (tmp_path / "standby").mkdir()
    standby = Standby(tmp_path / "standby", map_size=MAP)
    restarted: MetadataStore | None = None
    try:
        journal = log_as_active_starts_it(active)
        f = journal.attach("s1", *standby.position())
        send_snapshot(active, journal, f, standby, tmp_path)
        (tmp_path / "crashed").mkdir()  # the disk the kill leaves: without what follows
        active.snapshot_to(tmp_path / "crashed" / "data.mdb")
        active.mkdir(ROOT_INODE, "X", 0o755)
        catch_up(journal, f, standby)
        journal.detach(f)
        active.close()
        taken = standby.position()
        assert "X" in names(standby.store) and taken[1] == journal.epoch

        restarted = MetadataStore(tmp_path / "crashed", map_size=MAP)
        base = restarted.log_position()
        assert base[0] == taken[0] - 1
        journal2 = log_as_active_starts_it(restarted, standbys=1)
        assert journal2.epoch > journal.epoch
        g = journal2.attach("s1", *taken)
        assert g.needs_snapshot  # X is no entry of this history
        acknowledged: list[str] = []

        def write() -> None:
            assert restarted is not None
            restarted.mkdir(ROOT_INODE, "Y", 0o755)
            acknowledged.append("Y")

        writer = threading.Thread(target=write)
        writer.start()
        deadline = time.monotonic() + 10  # stored here (so the snapshot holds it) ...
        while restarted.log_position()[0] <= base[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not acknowledged  # ... not acknowledged: the standby does not hold it yet
        send_snapshot(restarted, journal2, g, standby, tmp_path)
        catch_up(journal2, g, standby)
        writer.join(10)
        assert acknowledged == ["Y"]
        assert names(standby.store) == names(restarted) and "X" not in names(restarted)
        assert dump(standby.store) == dump(restarted)
    finally:
        standby.close()
        if restarted is not None:
            restarted.close()
        else:
            active.close()


def test_each_term_is_past_every_one_begun_and_at_least_the_leadership_epoch(
        tmp_path: Path) -> None:
    path = tmp_path / "metadata.lmdb"
    store = MetadataStore(path, map_size=MAP)
    try:
        assert store.start_term() == (0, 0, 1)
        assert store.start_term() == (0, 0, 2)  # nothing stored in term 1: still a new one
        assert store.start_term(at_least=40) == (0, 0, 40)  # etcd's revision is the term
        store.attach_log(ReplicationLog(epoch=40, last_seq=0, last_epoch=0, standbys=0))
        store.mkdir(ROOT_INODE, "d", 0o755)
        assert store.log_position() == (1, 40)
    finally:
        store.close()
    store = MetadataStore(path, map_size=MAP)  # stored durably
    try:
        assert store.start_term() == (1, 40, 41)
        # etcd's data lost and begun again (revisions from 1): past what the database held
        assert store.start_term(at_least=7) == (1, 40, 42)
        assert store.start_term(at_least=50) == (1, 40, 50)
    finally:
        store.close()


# -- failover: the fence and the published in-sync set (docs/coordination.md) -------------

def _in_sync_follower(journal: ReplicationLog, member: str, seq: int) -> Follower:
    """MEMBER attached, sent everything up to SEQ (as a snapshot) and confirming it."""
    f = journal.attach(member, 0, 0)
    journal.snapshot_started(f)
    journal.snapshot_taken(f, seq)
    journal.confirmed(f, seq)
    return f


def test_a_manager_past_its_lease_acknowledges_nothing() -> None:
    valid = [True]
    journal = ReplicationLog(epoch=3, last_seq=0, last_epoch=0, standbys=0,
                             fence=lambda: valid[0])
    journal.serve()
    journal.append(1, [])
    journal.wait_confirmed(1)  # valid: acknowledged
    valid[0] = False
    journal.append(2, [])
    with pytest.raises(Unavailable, match="no longer the active one"):
        journal.wait_confirmed(2)


def test_start_up_writes_wait_for_no_standby_but_served_ones_do() -> None:
    journal = ReplicationLog(epoch=1, last_seq=0, last_epoch=0, standbys=1,
                             wait_timeout_s=0.2)
    journal.append(1, [])
    journal.wait_confirmed(1)  # not serving yet: nobody to wait for, nobody acknowledged
    journal.serve()
    journal.append(2, [])
    with pytest.raises(Unavailable, match="fewer than 1 standby"):
        journal.wait_confirmed(2)


def test_the_in_sync_set_is_published_as_it_changes() -> None:
    published: list[frozenset[str]] = []
    journal = ReplicationLog(epoch=1, last_seq=0, last_epoch=0, standbys=1,
                             on_in_sync=lambda m: published.append(m) or True)
    journal.serve()
    journal.append(1, [])
    f = _in_sync_follower(journal, "b", 1)
    assert published == [frozenset({"b"})]  # at once, with no write waiting
    journal.append(2, [])
    assert journal.next_entries(f, 0.1)
    journal.confirmed(f, 2)
    journal.wait_confirmed(2)
    assert published == [frozenset({"b"})]  # unchanged: not published again


def test_a_laggard_is_unpublished_before_anything_it_lacks_is_acknowledged() -> None:
    clock = [0.0]
    lands = [True]
    published: list[frozenset[str]] = []

    def publish(members: frozenset[str]) -> bool:
        if lands[0]:
            published.append(members)
        return lands[0]

    journal = ReplicationLog(epoch=1, last_seq=0, last_epoch=0, standbys=1,
                             lag_timeout_s=1.0, wait_timeout_s=0.3, clock=lambda: clock[0],
                             on_in_sync=publish)
    journal.serve()
    journal.append(1, [])
    _in_sync_follower(journal, "b", 1)
    fast = _in_sync_follower(journal, "c", 1)
    assert published[-1] == frozenset({"b", "c"})
    journal.append(2, [])  # b never confirms it; c does
    assert journal.next_entries(fast, 0.1)
    journal.confirmed(fast, 2)
    clock[0] = 5.0  # b has owed entry 2 past its lag timeout
    lands[0] = False  # etcd cannot be told that b left
    deadline = [clock[0] + 0.3]

    def advance() -> None:
        time.sleep(0.05)
        clock[0] = deadline[0] + 1  # the writer's deadline passes
    threading.Thread(target=advance).start()
    with pytest.raises(Unavailable):
        journal.wait_confirmed(2)  # b is still named as in sync: not acknowledged
    lands[0] = True
    journal.wait_confirmed(2)  # b unpublished first, then acknowledged
    assert published[-1] == frozenset({"c"})


def _waiting_writer(journal: ReplicationLog, failed: list[str]) -> threading.Thread:
    """A writer waiting for entry 1's confirmations; its failure's message into FAILED."""
    def wait() -> None:
        try:
            journal.wait_confirmed(1)
        except Unavailable as exc:
            failed.append(exc.message)
    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.2)
    return thread


def test_writers_waiting_fail_at_once_when_deposed_or_stopping() -> None:
    valid = [True]
    for how in ("deposed", "stopping"):
        valid[0] = True
        journal = ReplicationLog(epoch=1, last_seq=0, last_epoch=0, standbys=1,
                                 wait_timeout_s=30, fence=lambda: valid[0])
        journal.serve()
        journal.append(1, [])
        failed: list[str] = []
        writer = _waiting_writer(journal, failed)
        started = time.monotonic()
        if how == "deposed":
            valid[0] = False  # the lease lapsed: no confirmation will be waited for
        else:
            journal.close()
        writer.join(timeout=10)
        assert failed, how
        assert ("no longer the active one" if how == "deposed" else "stopping") in failed[0]
        assert time.monotonic() - started < 5  # not the 30 s deadline


# -- shipped before the local commit (docs/standby.md) -------------------------------------

def test_replaying_an_entry_stores_what_a_standby_applies(
        pair: tuple[MetadataStore, Standby], tmp_path: Path) -> None:
    """A group's entry reaches the standbys before its local commit; if that commit fails,
    the manager replays the entry: its database must then hold what a standby that
    applied the entry holds."""
    active, standby = pair
    journal = start_log(active)
    f = journal.attach("s1", *standby.position())
    send_snapshot(active, journal, f, standby, tmp_path)
    (tmp_path / "copy").mkdir()
    active.snapshot_to(tmp_path / "copy" / "data.mdb")  # the active's, before the entries
    copy = MetadataStore(tmp_path / "copy", map_size=MAP)
    try:
        workload(active, "replayed")
        batch = journal.next_entries(f, timeout=0)
        assert batch
        journal.confirmed(f, applied(standby, batch))
        for entry in map(replication_pb2.LogEntry.FromString, batch):
            copy._replay(entry.seq, entry.epoch, [
                (op.db, op.key, None if op.delete else op.value) for op in entry.ops])
        assert dump(copy) == dump(standby.store) == dump(active)
        assert copy.log_position() == active.log_position()
    finally:
        copy.close()


# A store with a log, a first change, then a file size limit at its data file's size: the
# next commit has to grow the file and fails (EFBIG), as a full disk fails it.
UNSTORABLE = """
import json, resource, signal, sys
from pathlib import Path
from mosafs.errors import MosafsError
from mosafs.manager.metadata import ROOT_INODE, MetadataStore
from mosafs.manager.replog import ReplicationLog

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not the signal
path = Path(sys.argv[1])
store = MetadataStore(path, map_size=1 << 30)
seq, epoch = store.log_position()
journal = ReplicationLog(epoch=epoch + 1, last_seq=seq, last_epoch=epoch, standbys=0)
store.attach_log(journal)
journal.serve()
store.mkdir(ROOT_INODE, "before", 0o755)
limit = (path / "data.mdb").stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
out = {"errors": []}
for name in ("big-" + "x" * 200, "after"):
    try:
        store.mkdir(ROOT_INODE, name, 0o755)
    except Exception as exc:
        out["errors"].append(f"{type(exc).__name__}: {exc}")
out.update(broken=journal.broken, shipped=journal.last_seq, stored=store.log_position()[0])
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
out["names"] = sorted(name for name, _ in store.readdir(ROOT_INODE)[0])
print(json.dumps(out))
"""


def test_a_change_shipped_but_not_stored_here_stops_every_acknowledgement(
        tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-P", "-c", UNSTORABLE, str(tmp_path / "db")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    # The change reached the log (the standbys) and not the database: the commit failed,
    # and so did its replay. Its caller was told; so is every later writer, at its seal.
    assert out["shipped"] == out["stored"] + 1, out
    assert "reached the standbys but not this manager's database" in out["broken"]
    assert "File too large" in out["errors"][0], out
    assert out["errors"][1].startswith("Unavailable: metadata change"), out
    assert [n for n in out["names"] if n != "before"] == [], out
    # Said once, as an error, with no traceback: the disk's failure is not a bug.
    assert "stop it and let a standby take over" in run.stderr
    assert "Traceback" not in run.stderr and "bug in" not in run.stderr, run.stderr


# --- the in-sync set in etcd: a publish in doubt, and no shrinking it needlessly -----------

def test_a_publish_in_doubt_does_not_let_an_unconfirmed_member_stay_eligible() -> None:
    etcd: dict[str, frozenset[str]] = {}  # what etcd really holds
    in_doubt = [False]

    def publish(members: frozenset[str]) -> bool:
        etcd["in_sync"] = members  # etcd applies the write...
        return not in_doubt[0]     # ...but the answer timed out

    journal = ReplicationLog(epoch=1, last_seq=0, last_epoch=0, standbys=1,
                             wait_timeout_s=0.5, on_in_sync=publish)
    journal.serve()
    journal.append(1, [])
    b = _in_sync_follower(journal, "b", 1)
    assert etcd["in_sync"] == {"b"}
    in_doubt[0] = True
    c = _in_sync_follower(journal, "c", 1)  # lands in etcd as {b, c}, reported failed
    assert etcd["in_sync"] == {"b", "c"}
    in_doubt[0] = False
    journal.detach(c)  # c goes away (or lags and is dropped)

    journal.append(2, [])
    assert journal.next_entries(b, 0.1)
    journal.confirmed(b, 2)
    acknowledged = True
    try:
        journal.wait_confirmed(2)
    except Exception:
        acknowledged = False
    # Entry 2 may be acknowledged only if every member etcd names as in sync holds it:
    # c (still named by etcd, so eligible to take over) never got entry 2.
    assert not acknowledged or etcd["in_sync"] <= {"b"}, (
        f"entry 2 acknowledged while etcd names {sorted(etcd['in_sync'])} as in sync, "
        f"and c lacks it")


def test_a_new_leader_does_not_unpublish_standbys_before_it_can_acknowledge() -> None:
    # etcd as the previous leader L left it: L and A hold every acknowledged entry.
    etcd = {"in_sync": frozenset({"L", "A"})}

    def publish(members: frozenset[str]) -> bool:  # ha_main adds the leader itself
        etcd["in_sync"] = members | {"A"}
        return True

    # A has just been elected; L (restarted by `mosafs up`) has not reconnected yet.
    journal = ReplicationLog(epoch=7, last_seq=10, last_epoch=6, standbys=1,
                             wait_timeout_s=0.2, on_in_sync=publish)
    journal.serve()
    journal.append(11, [])
    with pytest.raises(Unavailable):
        journal.wait_confirmed(11)  # nothing can be acknowledged: no standby in sync
    # Nothing was acknowledged in A's term, so L still holds every acknowledged entry;
    # yet etcd now names only A: if A's host is lost, L may never lead (election stalls).
    assert "L" in etcd["in_sync"], f"etcd in-sync set shrunk to {sorted(etcd['in_sync'])}"
