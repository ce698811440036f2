"""Recovery of a manager from the benefactors alone (mosafs.manager.recovery) after every
manager is lost, from backups taken through mosafs.manager.backups: which backup it
chooses, what a failure part way leaves, and what it reports (docs/coordination.md,
"Metadata backups"). A real store and real chunk stores, no gRPC."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mosafs.benefactor.recovery import RecoveryRecords
from mosafs.errors import InvalidArgument, MosafsError, NotFound, Unavailable
from mosafs.ids import chunk_id
from mosafs.manager import recovery
from mosafs.manager.backups import Backups, decode
from mosafs.manager.core import Manager, ManagerConfig
from mosafs.manager.metadata import MetadataStore
from tests.unit.managers import Clock, MiB, new_file, register
from tests.unit.test_ec_repair import Benefactors, N, cluster, data, settle  # noqa: F401

ROOT = 1


class Peers:
    """recovery's view of the benefactors: Benefactors' chunk stores, and records.
    BROKEN_INVENTORY: addresses whose ListChunks stream fails; BROKEN_INFO: whose
    GetInfo does."""

    def __init__(self, cluster: Benefactors, records: RecoveryRecords,  # noqa: F811
                 broken_inventory: frozenset[str] = frozenset(),
                 broken_info: frozenset[str] = frozenset()) -> None:
        self.cluster = cluster
        self.records = records
        self.broken_inventory = broken_inventory
        self.broken_info = broken_info

    def recovery_records(self, address: str) -> list[tuple[str, bytes]]:
        return self.records.records()

    def get(self, address: str, cid: bytes, token: bytes, timeout: float) -> bytes:
        return self.cluster.stores[address].get(cid)

    def inventory(self, address: str) -> Iterator[tuple[bytes, int]]:
        for n, item in enumerate(self.cluster.stores[address].inventory()):
            if address in self.broken_inventory and n:
                raise Unavailable(f"{address}: connection reset")
            yield item.id, item.length
        if address in self.broken_inventory:
            raise Unavailable(f"{address}: connection reset")

    def benefactor_id(self, address: str) -> str:
        if address in self.broken_info:
            raise Unavailable(f"{address}: GetInfo timed out")
        return f"b{int(address.rsplit(':', 1)[1]) - 7000}"


def _manager(store: MetadataStore, clock: Clock, cluster: Benefactors,  # noqa: F811
             **kw: object) -> Manager:
    mgr = Manager(store, ManagerConfig(benefactor_lease_s=5, gc_grace_s=0.0), clock=clock,
                  **kw)  # type: ignore[arg-type]
    store.update_pool("default", replication=2)
    for i in range(N):
        register(mgr, f"b{i}", port=7000 + i)
    return mgr


def _close(mgr: Manager) -> None:
    if mgr.repairer is not None:
        mgr.repairer.close()
    if mgr.replicator is not None:
        mgr.replicator.close()


def _snapshot(backups: Backups, path: Path) -> dict[str, int]:
    """A snapshot as `mosafs backup` receives it (SnapshotMetadata), into PATH; what
    RecordBackup is then told of it."""
    with path.open("wb") as f:
        for part in backups.snapshot():
            f.write(part.data)
    return {"seq": part.seq, "epoch": part.epoch, "counter": part.counter,
            "taken_ms": part.taken_ms}


def _write_backup(mgr: Manager, cluster: Benefactors, path: Path) -> tuple[int, int]:  # noqa: F811
    """PATH as a new version of /.mosafs/backups/metadata.lmdb (1 MiB chunks on b0, b1);
    (inode, version)."""
    store = mgr.store
    parent = ROOT
    for folder in (".mosafs", "backups"):
        try:
            parent = store.lookup(parent, folder).inode
        except NotFound:
            parent = store.mkdir(parent, folder, 0o700).inode
    try:
        ino = store.lookup(parent, "metadata.lmdb").inode
    except NotFound:
        ino = store.create(parent, "metadata.lmdb", 0o600).inode
    raw = path.read_bytes()
    chunks = []
    for at in range(0, len(raw), MiB):
        part = raw[at:at + MiB]
        c = chunk_id(part)
        for b in ("b0", "b1"):
            cluster.of(b).put(c, part)
        chunks.append((c, len(part)))
    lease = mgr.open_write(ino, "backup")
    missing = [c for c, _ in chunks if store.chunk(c) is None]
    version, _ = mgr.commit_version(lease.lease_id, ino, chunks,
                                    [(c, ["b0", "b1"]) for c in dict.fromkeys(missing)])
    return int(ino), int(version)


def _commit(mgr: Manager, cluster: Benefactors, name: str, body: bytes,  # noqa: F811
            on: tuple[str, ...] = ("b2", "b3")) -> bytes:
    """A new file NAME of one chunk, BODY, copied to the benefactors ON: its chunk id."""
    ino = new_file(mgr.store, name)
    c = chunk_id(body)
    for b in on:
        cluster.of(b).put(c, body)
    lease = mgr.open_write(ino, "t")
    mgr.commit_version(lease.lease_id, ino, [(c, len(body))], [(c, list(on))])
    return c


def _backups(store: MetadataStore, records: RecoveryRecords, tmp_path: Path,
             now: list[float] | None = None) -> Backups:
    return Backups(store, lambda: ["127.0.0.1:7000"],
                   lambda address, name, blob: records.put(name, blob), tmp_path / "spool",
                   clock=(lambda: now[0]) if now else time.time)


@pytest.mark.parametrize("step_s", [5.0, -3600.0], ids=["later", "clock-stepped-back"])
def test_recovery_restores_the_newest_snapshot_not_the_last_recorded(
        store: MetadataStore, clock: Clock, cluster: Benefactors,  # noqa: F811
        tmp_path: Path, step_s: float) -> None:
    """Two `mosafs backup` runs overlap (one with --every, one by hand): A snapshots
    first, B later; B records first, A last (and the clock may step back between the
    snapshots). Recovery restores B, the newer snapshot, with the version committed
    between the two."""
    mgr = _manager(store, clock, cluster)
    records = RecoveryRecords(tmp_path / "b0-records")
    now = [1_700_000_000.0]
    backups = _backups(store, records, tmp_path, now)
    try:
        _commit(mgr, cluster, "early", data("early", 5000))
        snap_a = _snapshot(backups, tmp_path / "a.mdb")
        _commit(mgr, cluster, "late", data("late", 7000))  # after A's snapshot, before B's
        now[0] += step_s
        snap_b = _snapshot(backups, tmp_path / "b.mdb")
        assert snap_a["seq"] == snap_b["seq"] == 0  # no standbys: no log position
        assert snap_b["counter"] == snap_a["counter"] + 1
        ino_b, ver_b = _write_backup(mgr, cluster, tmp_path / "b.mdb")
        name_b, _ = backups.record(ino_b, ver_b, **snap_b)
        now[0] += 10
        ino_a, ver_a = _write_backup(mgr, cluster, tmp_path / "a.mdb")
        name_a, _ = backups.record(ino_a, ver_a, **snap_a)  # recorded last
    finally:
        _close(mgr)
    assert name_a < name_b  # the benefactors' keep-newest-8 keeps B over A
    kept = RecoveryRecords(tmp_path / "b0-records", keep=1)
    kept.put(name_a, dict(records.records())[name_a])  # trims to the newest one
    assert [n for n, _ in kept.records()] == [name_b]

    report = recovery.recover(tmp_path / "rebuilt", list(cluster.stores),
                              Peers(cluster, records), map_size=256 * MiB)
    assert report.backup == name_b
    with MetadataStore(tmp_path / "rebuilt" / "metadata.lmdb", map_size=256 * MiB) as got:
        got.lookup(ROOT, "late")
        got.lookup(ROOT, "early")
        # The counter is in the snapshot: the rebuilt manager's next backup comes after.
        again = _backups(got, RecoveryRecords(tmp_path / "again"), tmp_path)
        assert _snapshot(again, tmp_path / "c.mdb")["counter"] == snap_b["counter"] + 1


def test_recovery_orders_by_the_descriptors_not_by_their_names(
        store: MetadataStore, clock: Clock, cluster: Benefactors,  # noqa: F811
        tmp_path: Path) -> None:
    """A record kept under a file name that sorts last but describing an older snapshot
    is not the one chosen: the descriptors' content orders them."""
    mgr = _manager(store, clock, cluster)
    records = RecoveryRecords(tmp_path / "records")
    backups = _backups(store, records, tmp_path)
    try:
        snap = _snapshot(backups, tmp_path / "a.mdb")
        ino, ver = _write_backup(mgr, cluster, tmp_path / "a.mdb")
        old, _ = backups.record(ino, ver, **snap)
        snap = _snapshot(backups, tmp_path / "b.mdb")
        ino, ver = _write_backup(mgr, cluster, tmp_path / "b.mdb")
        new, _ = backups.record(ino, ver, **snap)
    finally:
        _close(mgr)
    renamed = "metadata-z"  # sorts after both: the old one under another name
    (tmp_path / "records" / "recovery" / renamed).write_bytes(dict(records.records())[old])
    assert decode(dict(records.records())[renamed]).name == old
    report = recovery.recover(tmp_path / "rebuilt", list(cluster.stores),
                              Peers(cluster, records), map_size=256 * MiB)
    assert report.backup == new


def test_a_record_naming_a_counter_the_store_never_reached_is_refused(
        store: MetadataStore, clock: Clock, cluster: Benefactors,  # noqa: F811
        tmp_path: Path) -> None:
    mgr = _manager(store, clock, cluster)
    backups = _backups(store, RecoveryRecords(tmp_path), tmp_path)
    try:
        snap = _snapshot(backups, tmp_path / "a.mdb")
        ino, ver = _write_backup(mgr, cluster, tmp_path / "a.mdb")
    finally:
        _close(mgr)
    with pytest.raises(InvalidArgument, match="no snapshot of this store"):
        backups.record(ino, ver, snap["seq"], snap["epoch"], counter=snap["counter"] + 1,
                       taken_ms=snap["taken_ms"])


@pytest.mark.parametrize("broken", ["inventory", "info"])
def test_a_failed_reconciliation_leaves_nothing_and_can_be_run_again(
        store: MetadataStore, clock: Clock, cluster: Benefactors,  # noqa: F811
        tmp_path: Path, broken: str, caplog: pytest.LogCaptureFixture) -> None:
    """A benefactor answers ListRecoveryRecords, then its ListChunks stream (or GetInfo)
    fails: recover() raises and installs nothing (no data.mdb without the file keeping
    the blobs newer than the backup); the same command then succeeds."""
    mgr = _manager(store, clock, cluster)
    records = RecoveryRecords(tmp_path / "records")
    backups = _backups(store, records, tmp_path)
    try:
        snap = _snapshot(backups, tmp_path / "s.mdb")
        ino, ver = _write_backup(mgr, cluster, tmp_path / "s.mdb")
        backups.record(ino, ver, **snap)
    finally:
        _close(mgr)
    after = data("after", 9000)  # stored after the backup
    cluster.of("b4").put(chunk_id(after), after)
    cluster.of("b5").put(chunk_id(after), after)

    rebuilt = tmp_path / "rebuilt"
    rebuilt.mkdir()
    flaky = Peers(cluster, records, **{f"broken_{broken}": frozenset({"127.0.0.1:7005"})})
    with pytest.raises(MosafsError), caplog.at_level(logging.ERROR, "mosafs.manager"):
        recovery.recover(rebuilt, list(cluster.stores), flaky, map_size=256 * MiB)
    assert list(rebuilt.iterdir()) == []  # as it was: nothing half-installed
    assert "nothing installed" in caplog.text

    report = recovery.recover(rebuilt, list(cluster.stores), Peers(cluster, records),
                              map_size=256 * MiB)
    assert chunk_id(after).hex() in {b["id"] for b in report.after_backup}
    assert sorted(p.name for p in rebuilt.iterdir()) == ["metadata.lmdb",
                                                         recovery.REPORT_FILE]
    with MetadataStore(rebuilt / "metadata.lmdb", map_size=256 * MiB) as got:
        sysdir = got.lookup(ROOT, ".mosafs").inode
        kept = got.lookup(got.lookup(sysdir, "recovered").inode, f"after-{report.backup}")
        assert chunk_id(after) in {c.id for c in got.block_map(kept.inode).chunks}


def test_versions_whose_chunks_went_after_the_backup_are_reported_unreadable(
        store: MetadataStore, clock: Clock, cluster: Benefactors,  # noqa: F811
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Backup, then `mosafs pool set default --redundancy ec:4+2`: the conversion swaps
    the chunk's two copies for 6 fragments the backup does not name, and the copies are
    collected. The restored /model names only the gone copies: recovery cannot make it
    readable (docs/coordination.md: a known limitation), but says so, in its report and
    its log, instead of nothing."""
    mgr = _manager(store, clock, cluster, copy=cluster.copy, recode=cluster.recode)
    records = RecoveryRecords(tmp_path / "records")
    backups = _backups(store, records, tmp_path)
    try:
        cid = _commit(mgr, cluster, "model", data("model", MiB), on=("b6", "b7"))
        _commit(mgr, cluster, "other", data("other", 3000))  # stays readable
        settle(mgr)
        snap = _snapshot(backups, tmp_path / "s.mdb")
        bino, bver = _write_backup(mgr, cluster, tmp_path / "s.mdb")
        backups.record(bino, bver, **snap)

        store.update_pool("default", redundancy="ec:4+2")  # after the backup
        mgr.pool_changed("default")
        settle(mgr)
        rec = store.chunk(cid)
        assert rec is not None and rec.ec_k == 4 and not rec.benefactor_ids
        old = time.time_ns() - 10**10
        for b in ("b6", "b7"):  # the old copies go at the next inventory
            for blob in mgr.report_inventory(b, [(cid, old)])[0]:
                cluster.of(b).delete(blob, touched_ns=time.time_ns())
        assert not cluster.of("b6").has(cid) and not cluster.of("b7").has(cid)
    finally:
        _close(mgr)

    rebuilt = tmp_path / "rebuilt"
    with caplog.at_level(logging.ERROR, "mosafs.manager"):
        report = recovery.recover(rebuilt, list(cluster.stores), Peers(cluster, records),
                                  map_size=256 * MiB)
    assert [c["id"] for c in report.missing_chunks] == [cid.hex()]
    assert report.missing_chunks[0]["recorded_on"] == ["b6", "b7"]
    assert [(v["path"], v["version"], v["missing"]) for v in report.unreadable_versions] \
        == [("/model", 1, [cid.hex()])]
    written = json.loads((rebuilt / recovery.REPORT_FILE).read_text())
    assert written["unreadable_versions"] == report.unreadable_versions
    assert "/model version 1" in caplog.text and "cannot be read" in caplog.text


def test_an_erasure_coded_chunk_with_enough_fragments_is_not_reported(
        store: MetadataStore, clock: Clock, cluster: Benefactors,  # noqa: F811
        tmp_path: Path) -> None:
    """A chunk held only as fragments is readable if K of them are on the benefactors:
    recovery lists it as missing only when fewer are."""
    mgr = _manager(store, clock, cluster, copy=cluster.copy, recode=cluster.recode)
    store.update_pool("default", redundancy="ec:4+2")
    records = RecoveryRecords(tmp_path / "records")
    backups = _backups(store, records, tmp_path)
    try:
        cid = _commit(mgr, cluster, "coded", data("coded", MiB), on=("b6", "b7"))
        mgr.pool_changed("default")
        settle(mgr)
        rec = store.chunk(cid)
        assert rec is not None and rec.ec_k == 4 and not rec.benefactor_ids
        for b in ("b6", "b7"):
            cluster.of(b).delete(cid, touched_ns=time.time_ns())
        snap = _snapshot(backups, tmp_path / "s.mdb")
        bino, bver = _write_backup(mgr, cluster, tmp_path / "s.mdb")
        backups.record(bino, bver, **snap)
    finally:
        _close(mgr)
    holders = list(zip(rec.fragment_ids, rec.fragment_holders, strict=True))

    report = recovery.recover(tmp_path / "one", list(cluster.stores),
                              Peers(cluster, records), map_size=256 * MiB)
    assert report.missing_chunks == [] and report.unreadable_versions == []

    for fid, holder in holders[:3]:  # 3 of 6 left: fewer than K
        cluster.of(holder).delete(bytes(fid), touched_ns=time.time_ns())
    report = recovery.recover(tmp_path / "two", list(cluster.stores),
                              Peers(cluster, records), map_size=256 * MiB)
    assert [c["id"] for c in report.missing_chunks] == [cid.hex()]
    assert report.missing_chunks[0]["fragments"] == "3 of 6 held, 4 needed"
    assert [v["path"] for v in report.unreadable_versions] == ["/coded"]
