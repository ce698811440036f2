"""Metadata backups' formats (docs/coordination.md, "Metadata backups"): the recovery
records a benefactor keeps (mosafs.benefactor.recovery) and the descriptor the manager
writes into them (mosafs.manager.backups), with what a damaged or hostile one gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mosafs.benefactor.recovery import RecoveryRecords
from mosafs.errors import InvalidArgument
from mosafs.manager.backups import Descriptor, decode, record_name


def test_records_are_kept_whole_newest_few_and_survive_a_restart(tmp_path: Path) -> None:
    records = RecoveryRecords(tmp_path, keep=3)
    for i in range(5):
        assert records.put(record_name(1000 + i, i), f"record {i}".encode()) == min(i + 1, 3)
    again = RecoveryRecords(tmp_path, keep=3)  # a restarted benefactor
    assert [name for name, _ in again.records()] == [record_name(1000 + i, i)
                                                     for i in (2, 3, 4)]
    assert again.records()[-1][1] == b"record 4"
    assert not list((tmp_path / "recovery").glob(".*"))  # no temporary file left


@pytest.mark.parametrize("name", ["", "../escape", "UPPER", "a/b", "x" * 97, ".hidden"])
def test_a_bad_record_name_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidArgument, match="recovery record's name"):
        RecoveryRecords(tmp_path).put(name, b"x")
    assert not (tmp_path / "recovery").exists() or not list((tmp_path / "recovery").iterdir())


def test_a_record_too_large_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="at most"):
        RecoveryRecords(tmp_path).put("metadata-1", bytes(9 << 20))


CHUNKS = [(bytes([i]) * 32, 1000 + i) for i in range(3)]


def test_descriptors_round_trip_and_names_sort_by_time() -> None:
    d = Descriptor(record_name(1_700_000_000_000, 42), 1_700_000_000_000, 42, 7, 99, 3,
                   sum(n for _, n in CHUNKS), CHUNKS)
    assert decode(d.encode()) == d
    assert record_name(999, 10**6) < record_name(1000, 1)


def test_counted_descriptors_round_trip_and_sort_by_counter_whatever_the_clock() -> None:
    """Version 2: the snapshot's counter orders them (a clock stepped back, a backup
    recorded late); their names sort the same way, and after every version 1 name, so a
    benefactor that keeps the newest names keeps the newest snapshots."""
    size = sum(n for _, n in CHUNKS)
    early = Descriptor(record_name(1_700_000_900_000, 0, 7), 1_700_000_900_000, 0, 0, 99, 3,
                       size, CHUNKS, 7)
    late = Descriptor(record_name(1_600_000_000_000, 0, 8), 1_600_000_000_000, 0, 0, 99, 4,
                      size, CHUNKS, 8)
    assert decode(early.encode()) == early and decode(late.encode()) == late
    assert early.order < late.order and early.name < late.name
    v1 = Descriptor(record_name(9_999_999_999_999, 10**9), 9_999_999_999_999, 10**9, 1, 99,
                    2, size, CHUNKS)
    assert decode(v1.encode()) == v1 and json.loads(v1.encode())["v"] == 1
    assert v1.order < early.order and v1.name < early.name


def test_a_counted_descriptor_whose_name_does_not_match_it_is_refused() -> None:
    d = Descriptor(record_name(1000, 1, 5), 1000, 1, 1, 2, 1, sum(n for _, n in CHUNKS),
                   CHUNKS, 5)
    body = json.loads(d.encode())
    for wrong in ({"counter": 6}, {"created_ms": 999}, {"seq": 2}, {"counter": 0}):
        with pytest.raises(InvalidArgument):
            decode(json.dumps({**body, **wrong}).encode())


@pytest.mark.parametrize("damage", [
    lambda b: b"not json",
    lambda b: json.dumps({**b, "v": 3}).encode(),
    lambda b: json.dumps({**b, "v": 2}).encode(),                      # 2 needs a counter
    lambda b: json.dumps({**b, "size": b["size"] + 1}).encode(),        # lengths disagree
    lambda b: json.dumps({**b, "chunks": [["00", 5]]}).encode(),        # a short id
    lambda b: json.dumps({**b, "name": "other-1"}).encode(),
    lambda b: json.dumps({k: v for k, v in b.items() if k != "epoch"}).encode(),
])
def test_a_damaged_descriptor_is_refused(damage) -> None:  # type: ignore[no-untyped-def]
    d = Descriptor(record_name(1, 1), 1, 1, 1, 2, 1, sum(n for _, n in CHUNKS), CHUNKS)
    body = json.loads(d.encode())
    with pytest.raises(InvalidArgument):
        decode(damage(body))
