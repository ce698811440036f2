"""A standby's journal (docs/standby.md, "The standby's journal"): entries it confirmed
before applying them survive its SIGKILL and reach its database when it opens again (as a
standby, or as the active manager after a failover); a write cut short, entries already
applied, entries that do not follow, a batch ending just short of a block boundary (also
as an older writer laid it out), an entry LMDB cannot store and a full disk (for the
journal or for a snapshot) each lose nothing confirmed and leave a database that opens."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mosafs._proto import replication_pb2
from mosafs.errors import InvalidArgument, NoSpace
from mosafs.manager.metadata import ROOT_INODE, MetadataStore
from mosafs.manager.metadata import journal as journal_file
from mosafs.manager.metadata.journal import BLOCK, JOURNAL, records
from mosafs.manager.replog import ReplicationLog
from mosafs.manager.standby import Standby
from tests import harness
from tests.unit.test_replog import MAP, applied, dump, send_snapshot, start_log, workload


def entries_after_snapshot(active: MetadataStore, standby: Standby, tmp_path: Path,
                           tag: str) -> tuple[ReplicationLog, list[bytes]]:
    """STANDBY brought to a snapshot of ACTIVE, then the entries of a workload on ACTIVE
    after it (not given to the standby)."""
    journal = start_log(active)
    f = journal.attach("s1", *standby.position())
    send_snapshot(active, journal, f, standby, tmp_path)
    workload(active, tag)
    batch = journal.next_entries(f, timeout=0)
    assert batch
    return journal, batch


def new_standby(tmp_path: Path) -> tuple[Path, Standby]:
    """A standby's data directory under TMP_PATH, and the standby opened on it."""
    data = tmp_path / "standby"
    data.mkdir()
    return data, Standby(data, map_size=MAP)


def reopened(data: Path, journal: bytes, caplog: pytest.LogCaptureFixture) -> Standby:
    """The standby on DATA opened again, its journal made to hold JOURNAL, its log
    captured in CAPLOG."""
    (data / "metadata.lmdb" / JOURNAL).write_bytes(journal)
    with caplog.at_level(logging.INFO, "mosafs.manager.metadata"):
        return Standby(data, map_size=MAP)


@pytest.fixture
def active(tmp_path: Path) -> Iterator[MetadataStore]:
    store = MetadataStore(tmp_path / "active" / "metadata.lmdb", map_size=MAP)
    yield store
    store.close()


def take_and_die(data_dir: Path, *batches: list[bytes]) -> None:
    """A standby process on DATA_DIR takes BATCHES (confirming each), then is SIGKILLed
    before it applies anything."""
    (data_dir.parent / "batches.json").write_text(
        json.dumps([[b.hex() for b in batch] for batch in batches]))
    script = (
        "import json, os, signal, sys\n"
        "from pathlib import Path\n"
        "from mosafs.manager.standby import Standby\n"
        "d = Path(sys.argv[1])\n"
        "batches = json.loads((d.parent / 'batches.json').read_text())\n"
        f"s = Standby(d, map_size={MAP})\n"
        "for batch in batches:\n"
        "    seq = s.take([bytes.fromhex(h) for h in batch])\n"
        "print(seq, flush=True)\n"
        "assert s.unsettled\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", script, str(data_dir)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert int(done.stdout) > 0


def test_entries_confirmed_before_they_were_applied_survive_a_sigkill(
        active: MetadataStore, tmp_path: Path) -> None:
    data, standby = new_standby(tmp_path)
    journal, batch = entries_after_snapshot(active, standby, tmp_path, "killed")
    applied_before = dump(standby.store)
    standby.close()
    take_and_die(data, batch)
    assert (data / "metadata.lmdb" / JOURNAL).stat().st_size > 0
    # As a standby again: it stands at the last entry it confirmed, with it applied.
    standby = Standby(data, map_size=MAP)
    try:
        assert standby.position() == (journal.last_seq, journal.epoch)
        assert dump(standby.store) == dump(active) != applied_before
    finally:
        standby.close()


def test_a_former_standby_opened_as_the_active_manager_has_what_it_confirmed(
        active: MetadataStore, tmp_path: Path) -> None:
    data, standby = new_standby(tmp_path)
    journal, batch = entries_after_snapshot(active, standby, tmp_path, "promoted")
    standby.close()
    take_and_die(data, batch)
    promoted = MetadataStore(data / "metadata.lmdb", map_size=MAP)  # as active.py opens it
    try:
        assert promoted.log_position() == (journal.last_seq, journal.epoch)
        assert dump(promoted) == dump(active)
        assert not (data / "metadata.lmdb" / JOURNAL).exists()
    finally:
        promoted.close()


def test_a_write_cut_short_and_entries_applied_already_are_skipped(
        active: MetadataStore, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data, standby = new_standby(tmp_path)
    journal, batch = entries_after_snapshot(active, standby, tmp_path, "torn")
    half = len(batch) // 2
    applied(standby, batch[:half])  # applied; then its records appear again, as if the
    standby.close()              # journal had not been emptied after that commit
    torn = records(batch[half:half + 1])[:-3]  # the last write, cut short by a crash
    standby = reopened(data, records(batch[:half]) + torn + bytes(BLOCK), caplog)
    try:
        assert standby.position()[0] == journal.last_seq - (len(batch) - half)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        # The standby goes on from there: the rest follows.
        applied(standby, batch[half:])
        assert dump(standby.store) == dump(active)
    finally:
        standby.close()


def test_journaled_entries_that_do_not_follow_are_set_aside_not_applied(
        active: MetadataStore, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data, standby = new_standby(tmp_path)
    _, batch = entries_after_snapshot(active, standby, tmp_path, "gap")
    position, before = standby.position(), dump(standby.store)
    standby.close()
    path = data / "metadata.lmdb" / JOURNAL
    standby = reopened(data, records(batch[1:]), caplog)  # the first is missing: a gap
    try:
        assert standby.position() == position and dump(standby.store) == before
        aside = list(path.parent.glob(f"{JOURNAL}.unapplied-*"))
        assert len(aside) == 1 and aside[0].read_bytes() == records(batch[1:])
        first = replication_pb2.LogEntry.FromString(batch[1]).seq
        assert f"entries from entry {first} on cannot be applied" in caplog.text
    finally:
        standby.close()


def test_a_snapshot_installed_discards_the_journal_it_supersedes(
        active: MetadataStore, tmp_path: Path) -> None:
    data, standby = new_standby(tmp_path)
    try:
        journal, batch = entries_after_snapshot(active, standby, tmp_path, "superseded")
        standby.take(batch)
        assert standby.unsettled
        f = journal.attach("s1", 0, 0)  # it starts over from a snapshot
        send_snapshot(active, journal, f, standby, tmp_path)
        assert not standby.unsettled
        assert journal_file.read(data / "metadata.lmdb" / JOURNAL) == []
        assert standby.position() == (journal.last_seq, journal.epoch)
        assert dump(standby.store) == dump(active)
    finally:
        standby.close()


def test_records_of_an_earlier_round_end_the_journal(
        active: MetadataStore, tmp_path: Path) -> None:
    """After the entries are applied the journal starts over at offset 0: a crash then
    leaves the new round's records before the old round's, which must not be read as
    more entries."""
    data, standby = new_standby(tmp_path)
    journal, batch = entries_after_snapshot(active, standby, tmp_path, "rounds")
    assert len(batch) >= 3
    for entry in batch[:-1]:   # a block each
        standby.take([entry])
    standby.settle()           # the journal starts over ...
    standby.take(batch[-1:])   # ... and the last entry lies over the first ones
    on_disk = journal_file.read(data / "metadata.lmdb" / JOURNAL)
    assert len(on_disk) >= 2 and on_disk[0] == batch[-1]
    standby._close_journal()   # as a SIGKILL leaves it: nothing settled at close
    standby.store.close()
    standby = Standby(data, map_size=MAP)
    try:
        assert standby.position() == (journal.last_seq, journal.epoch)
        assert dump(standby.store) == dump(active)
    finally:
        standby.close()


def test_a_full_disk_refuses_the_batch_and_loses_nothing_taken(
        active: MetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    monkeypatch.setattr(journal_file, "JOURNAL_BYTES", 2 * BLOCK)  # a big entry grows it
    with harness.tmpfs(tmp_path / "standby", "256M") as data:
        standby = Standby(data, map_size=MAP)
        try:
            journal = start_log(active)
            f = journal.attach("s1", *standby.position())
            send_snapshot(active, journal, f, standby, tmp_path)
            active.setxattr(ROOT_INODE, "user.big", b"x" * 16384)  # more than the journal
            active.mkdir(ROOT_INODE, "small", 0o755)
            batch = journal.next_entries(f, timeout=0)
            assert batch and len(batch) == 2
            path = data / "metadata.lmdb" / JOURNAL
            position = standby.position()
            filler = data / "filler"
            fill(filler)
            # The journal cannot grow: nothing is taken, and the file is as it was.
            with pytest.raises(NoSpace, match="standby journal"):
                standby.take(batch)
            assert standby.position() == position and not standby.unsettled
            assert path.stat().st_size == 2 * BLOCK
            filler.unlink()
            assert standby.take(batch) == journal.last_seq  # it grows now
            # A full disk when the entries are applied: they stay taken, and go in later.
            fill(filler)
            with pytest.raises(NoSpace):
                standby.settle()
            assert standby.unsettled and standby.position()[0] == journal.last_seq
            filler.unlink()
            standby.settle()
            assert dump(standby.store) == dump(active)
        finally:
            standby.close()


def test_a_snapshot_the_disk_refuses_is_dropped_and_taken_again_later(
        active: MetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its parts do not fit, or it is in place but the new database's journal cannot be
    made: NoSpace either way (the follower reports it and starts again), the space it took
    is free again, and the standby goes on once there is space."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    with harness.tmpfs(tmp_path / "standby", "256M") as data:
        standby = Standby(data, map_size=MAP)
        try:
            journal = start_log(active)
            workload(active, "snapshot")
            f = journal.attach("s1", *standby.position())
            filler = data / "filler"
            fill(filler)
            with pytest.raises(NoSpace, match="the snapshot"):
                send_snapshot(active, journal, f, standby, tmp_path)
            assert standby.position() == (0, 0)
            assert not (data / "metadata.incoming").exists()
            filler.unlink()
            # In place, and then a journal larger than the disk: the standby is closed until
            # it can be opened again (the follower asks before each connection).
            made = journal_file.JOURNAL_BYTES
            monkeypatch.setattr(journal_file, "JOURNAL_BYTES", 512 << 20)
            f = journal.attach("s1", *standby.position())
            with pytest.raises(NoSpace, match="standby journal"):
                send_snapshot(active, journal, f, standby, tmp_path)
            with pytest.raises(NoSpace, match="standby journal"):
                standby.ready()
            monkeypatch.setattr(journal_file, "JOURNAL_BYTES", made)
            standby.ready()
            assert standby.position() == active.log_position()
            assert dump(standby.store) == dump(active)
            f = journal.attach("s1", *standby.position())
            assert not f.needs_snapshot
            workload(active, "after")
            batch = journal.next_entries(f, timeout=0)
            assert batch
            applied(standby, batch)
            assert dump(standby.store) == dump(active)
        finally:
            standby.close()


def fill(path: Path) -> None:
    """Fill the file system PATH is on."""
    with path.open("wb") as out, pytest.raises(OSError):
        while True:
            out.write(bytes(1 << 20))
            out.flush()


# -- batches that end just short of a block boundary ----------------------------------------

def entry_of_size(seq: int, size: int, epoch: int = 1) -> bytes:
    """A serialized LogEntry (SEQ, EPOCH) of exactly SIZE bytes: one put in `meta`."""
    for pad in range(size, 0, -1):
        entry = replication_pb2.LogEntry(seq=seq, epoch=epoch)
        entry.ops.add(db=0, key=b"padding-%d" % seq, value=b"x" * pad)
        data = entry.SerializeToString()
        if len(data) == size:
            return data
    raise AssertionError(f"no entry of {size} bytes")


def short_of_a_block(seq: int, short: int) -> bytes:
    """Entry SEQ whose record, alone in a batch, ends SHORT bytes before a boundary."""
    return entry_of_size(seq, BLOCK - 8 - short)


# A next batch of 100 bytes starts with a length whose high bytes are zeros; one of 70,000
# with a length whose third byte is not (the older writer lost it after 5 zeros too).
@pytest.mark.parametrize("next_size", [100, 70_000])
@pytest.mark.parametrize("short", range(1, 9))
def test_a_batch_ending_just_short_of_a_boundary_hides_no_batch_after_it(
        tmp_path: Path, short: int, next_size: int) -> None:
    batches = [[short_of_a_block(1, short)], [entry_of_size(2, next_size)],
               [entry_of_size(3, 100)]]
    writer = journal_file.Writer(tmp_path / JOURNAL)
    try:
        for batch in batches:
            writer.append(batch)
    finally:
        writer.close()
    assert journal_file.read(tmp_path / JOURNAL) == [b[0] for b in batches]
    # Laid out so that a header of zeros always follows the first batch's records: the
    # next batch starts on a boundary, after no zeros or after at least 8.
    on_disk = (tmp_path / JOURNAL).read_bytes()
    ends, starts = len(records(batches[0])), on_disk.find(records(batches[1]))
    assert starts % BLOCK == 0 and starts - ends >= 8


def older_journal(*batches: list[bytes]) -> bytes:
    """BATCHES laid out as the writer did before batches were kept from ending 1-7 bytes
    short of a boundary: each from a boundary, then zeros up to the next, however few."""
    out = b""
    for batch in batches:
        data = records(batch)
        out += data + bytes(-len(data) % BLOCK)
    return out


@pytest.mark.parametrize("next_size", [100, 70_000])
@pytest.mark.parametrize("short", range(1, 8))
def test_a_journal_the_older_writer_left_reads_whole(
        tmp_path: Path, short: int, next_size: int) -> None:
    """A standby upgraded after a SIGKILL finds its journal as the older writer left it:
    its entries are all read, though a batch ends 1-7 bytes short of a boundary."""
    first, second = short_of_a_block(1, short), entry_of_size(2, next_size)
    # A record of a batch may start a few bytes short of a boundary too, its first bytes
    # zeros (a small length): it is read as a record, not skipped as zeros.
    third, fourth = entry_of_size(3, BLOCK - 8 - 2), entry_of_size(4, 100)
    assert records([fourth])[:2] == bytes(2)
    path = tmp_path / JOURNAL
    path.write_bytes(older_journal([first], [second], [third, fourth],
                                   [entry_of_size(5, 100)]) + bytes(BLOCK))
    assert journal_file.read(path) == [first, second, third, fourth, entry_of_size(5, 100)]


def test_a_standby_killed_after_a_batch_short_of_a_boundary_keeps_the_batches_after_it(
        tmp_path: Path) -> None:
    data, standby = new_standby(tmp_path)
    assert standby.position() == (0, 0)
    standby.close()
    batches = [[short_of_a_block(1, 4)], [entry_of_size(2, 100)], [entry_of_size(3, 100)]]
    take_and_die(data, *batches)  # each confirmed; none applied
    promoted = MetadataStore(data / "metadata.lmdb", map_size=MAP)  # as active.py opens it
    try:
        assert promoted.log_position() == (3, 1)
        with promoted.transaction() as tx:
            assert all(tx.txn.get(b"padding-%d" % seq, db=tx.db.meta) for seq in (1, 2, 3))
    finally:
        promoted.close()


# -- entries LMDB cannot store ---------------------------------------------------------------

def unstorable(seq: int, key: bytes, *, delete: bool = False) -> bytes:
    entry = replication_pb2.LogEntry(seq=seq, epoch=1)
    entry.ops.add(db=0, key=b"fine", value=b"v")
    entry.ops.add(db=0, key=key, value=b"" if delete else b"v", delete=delete)
    return entry.SerializeToString()


@pytest.mark.parametrize("key,delete", [(b"", False), (b"", True), (b"k" * 512, False),
                                        (b"k" * 512, True)])
def test_an_entry_lmdb_cannot_store_is_refused_before_it_is_journaled(
        tmp_path: Path, key: bytes, delete: bool) -> None:
    """docs/standby.md: a malformed entry is refused, nothing of its batch taken (and so
    nothing confirmed): applied later, it would fail at every open of the directory."""
    data, standby = new_standby(tmp_path)
    try:
        with pytest.raises(InvalidArgument, match=f"a key of {len(key)} bytes"):
            standby.take([entry_of_size(1, 100), unstorable(2, key, delete=delete)])
        assert standby.position() == (0, 0) and not standby.unsettled
        assert journal_file.read(data / "metadata.lmdb" / JOURNAL) == []
        assert standby.take([entry_of_size(1, 100)]) == 1  # it goes on
    finally:
        standby.close()
    Standby(data, map_size=MAP).close()


def test_a_journaled_entry_lmdb_cannot_store_is_set_aside_and_the_directory_opens(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A journal an older version confirmed such an entry into."""
    data, standby = new_standby(tmp_path)
    standby.close()
    journal = records([entry_of_size(1, 100)]) + records([unstorable(2, b"")])
    standby = reopened(data, journal, caplog)
    try:
        assert standby.position() == (1, 1)
        assert len(list((data / "metadata.lmdb").glob(f"{JOURNAL}.unapplied-*"))) == 1
        assert "entries from entry 2 on cannot be applied" in caplog.text
        assert "a key of 0 bytes" in caplog.text
    finally:
        standby.close()

