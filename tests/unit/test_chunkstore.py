"""The ChunkStore contract, run against every storage backend (one shared suite), plus the
filesystem backend's own promises (layout, tmp clean-up, identity, locking).

Real files in tmp_path; nothing is mocked.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import blake3
import pytest

from mosafs.benefactor.chunkstore import FileChunkStore, load_or_create_identity
from mosafs.benefactor.store import MAX_HAS_BATCH, ChunkStore
from mosafs.errors import ConfigError, IntegrityError, InvalidArgument, NoSpace, NotFound
from mosafs.ids import chunk_id


def blob(seed: str, size: int) -> bytes:
    """Deterministic pseudo-random bytes."""
    return blake3.blake3(seed.encode()).digest(length=size)


# -- backends ---------------------------------------------------------------------------


@dataclass
class Backend:
    """How the shared suite drives one storage backend.

    open: a store over the same storage each call (so closing and reopening is a restart).
    corrupt: damage the stored copy of a chunk in place, flipping the byte at an offset.
    """

    name: str
    open: Callable[..., ChunkStore]
    corrupt: Callable[[ChunkStore, bytes, int], None]


def file_backend(tmp_path: Path) -> Backend:
    root = tmp_path / "data"

    def open_store(capacity: int | None = None) -> ChunkStore:
        return FileChunkStore(root, capacity=capacity)

    def corrupt(store: ChunkStore, raw_id: bytes, offset: int) -> None:
        assert isinstance(store, FileChunkStore)
        path = store.path_of(raw_id)
        data = bytearray(path.read_bytes())
        data[offset] ^= 0x01
        path.write_bytes(bytes(data))

    return Backend("file", open_store, corrupt)


BACKENDS: dict[str, Callable[[Path], Backend]] = {"file": file_backend}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return BACKENDS[request.param](tmp_path)


@pytest.fixture
def store(backend: Backend) -> Iterator[ChunkStore]:
    s = backend.open()
    try:
        yield s
    finally:
        s.close()


BAD_IDS = [b"", b"../x", b"\x00" * 31, b"\x00" * 33, b"../../../../etc/passwd"]


# -- the shared suite -------------------------------------------------------------------


def test_unit_chunkstore_put_get_has_round_trip(store: ChunkStore) -> None:
    data = blob("round-trip", 100_000)
    raw = chunk_id(data)
    assert not store.has(raw)
    assert store.put(raw, data) is False
    assert store.has(raw)
    assert store.get(raw) == data


def test_unit_chunkstore_put_of_stored_chunk_is_already_present(store: ChunkStore) -> None:
    data = blob("twice", 4096)
    raw = chunk_id(data)
    assert store.put(raw, data) is False
    assert store.put(raw, memoryview(data)) is True
    usage = store.usage()
    assert (usage.chunks, usage.stored_bytes) == (1, 4096)


def test_unit_chunkstore_inventory_lists_every_chunk_with_its_last_put(
        store: ChunkStore) -> None:
    chunks = {chunk_id(d): d for d in (blob(f"inv{i}", 1000 + i) for i in range(5))}
    for raw, data in chunks.items():
        store.put(raw, data)
    items = {item.id: item for item in store.inventory()}
    assert set(items) == set(chunks)
    assert all(items[raw].length == len(data) for raw, data in chunks.items())
    first = next(iter(chunks))
    before = items[first].touched_ns
    time.sleep(0.02)
    assert store.put(first, chunks[first]) is True  # a put of a present chunk is a use
    again = {item.id: item for item in store.inventory()}
    assert again[first].touched_ns > before


def test_unit_chunkstore_refresh_drops_what_went_and_updates_what_was_put_again(
        store: ChunkStore) -> None:
    chunks = {chunk_id(d): d for d in (blob(f"refresh{i}", 700 + i) for i in range(3))}
    for raw, data in chunks.items():
        store.put(raw, data)
    listed = sorted(store.inventory(), key=lambda item: item.id)
    gone, again, same = listed
    assert store.delete(gone.id, touched_ns=gone.touched_ns) == gone.length
    time.sleep(0.02)
    assert store.put(again.id, chunks[again.id]) is True
    now = {item.id: item for item in store.refresh(listed)}
    assert set(now) == {again.id, same.id}, "a chunk deleted since the listing is not reported"
    assert now[again.id].touched_ns > again.touched_ns
    assert now[same.id] == same


def test_unit_chunkstore_delete_spares_a_chunk_put_since_the_inventory(
        store: ChunkStore) -> None:
    data = blob("delete", 5000)
    raw = chunk_id(data)
    store.put(raw, data)
    (item,) = list(store.inventory())
    assert store.delete(raw, touched_ns=item.touched_ns - 1) == 0  # touched later: kept
    assert store.get(raw) == data
    assert store.delete(raw, touched_ns=item.touched_ns) == 5000
    assert not store.has(raw)
    assert (store.usage().chunks, store.usage().stored_bytes) == (0, 0)
    assert store.delete(raw, touched_ns=item.touched_ns) == 0  # already gone
    with pytest.raises(InvalidArgument):
        store.delete(b"../x", touched_ns=0)
    assert store.put(raw, data) is False  # stored anew


def test_unit_chunkstore_empty_chunk_is_a_chunk(store: ChunkStore) -> None:
    raw = chunk_id(b"")
    assert store.put(raw, b"") is False
    assert store.get(raw) == b""
    assert store.usage().chunks == 1


def test_unit_chunkstore_mismatching_bytes_refused_and_nothing_stored(store: ChunkStore) -> None:
    good = blob("good", 1000)
    raw = chunk_id(good)
    bad = good[:-1] + bytes([good[-1] ^ 0xFF])
    with pytest.raises(InvalidArgument, match="does not match its id"):
        store.put(raw, bad)
    assert not store.has(raw)
    with pytest.raises(NotFound):
        store.get(raw)
    assert store.usage().chunks == 0
    assert store.usage().stored_bytes == 0


@pytest.mark.parametrize("bad_id", BAD_IDS, ids=["empty", "dotdot", "31", "33", "traversal"])
def test_unit_chunkstore_invalid_ids_refused(store: ChunkStore, bad_id: bytes) -> None:
    with pytest.raises(InvalidArgument, match="32 bytes"):
        store.put(bad_id, b"x")
    with pytest.raises(InvalidArgument, match="32 bytes"):
        store.get(bad_id)
    with pytest.raises(InvalidArgument, match="32 bytes"):
        store.has(bad_id)
    assert store.usage().chunks == 0


def test_unit_chunkstore_id_bytes_never_reach_a_path(store: ChunkStore) -> None:
    # 32 bytes of path characters are a valid id: only its hex names a file.
    raw = b"../../../../../../../etc/passwd/"
    assert len(raw) == 32
    assert not store.has(raw)
    with pytest.raises(NotFound):
        store.get(raw)


def test_unit_chunkstore_get_missing_is_not_found(store: ChunkStore) -> None:
    raw = chunk_id(b"never stored")
    with pytest.raises(NotFound, match=raw.hex()):
        store.get(raw)


@pytest.mark.parametrize("offset", [0, 4321, -1], ids=["first", "middle", "last"])
def test_unit_chunkstore_corruption_detected_never_wrong_bytes(
    backend: Backend, store: ChunkStore, offset: int, caplog: pytest.LogCaptureFixture
) -> None:
    data = blob("corrupt-me", 10_000)
    raw = chunk_id(data)
    store.put(raw, data)
    backend.corrupt(store, raw, offset)
    with caplog.at_level(logging.WARNING), pytest.raises(IntegrityError, match=raw.hex()):
        store.get(raw)
    assert any(raw.hex() in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)
    # A copy known to be corrupt is not offered (so it gets re-sent) ...
    assert not store.has(raw)
    assert store.has_many([raw]) == [False]
    caplog.clear()
    with caplog.at_level(logging.WARNING), pytest.raises(IntegrityError):
        store.get(raw)
    assert not caplog.records  # warned once per chunk, not once per read


def test_unit_chunkstore_put_repairs_a_chunk_found_corrupt(
    backend: Backend, store: ChunkStore, caplog: pytest.LogCaptureFixture
) -> None:
    data = blob("repair-me", 5000)
    raw = chunk_id(data)
    store.put(raw, data)
    backend.corrupt(store, raw, 17)
    with caplog.at_level(logging.CRITICAL), pytest.raises(IntegrityError):
        store.get(raw)
    assert store.put(raw, data) is False  # rewritten, not "already present"
    assert store.get(raw) == data
    assert store.has(raw)
    usage = store.usage()
    assert (usage.chunks, usage.stored_bytes) == (1, 5000)


def test_unit_chunkstore_counts_chunks_and_bytes(store: ChunkStore) -> None:
    sizes = [1, 10, 1000, 65_536, 300_001]
    for i, size in enumerate(sizes):
        data = blob(f"count-{i}", size)
        store.put(chunk_id(data), data)
    usage = store.usage()
    assert usage.chunks == len(sizes)
    assert usage.stored_bytes == sum(sizes)


def test_unit_chunkstore_concurrent_puts_of_one_id_store_it_once(store: ChunkStore) -> None:
    data = blob("race", 1 << 20)
    raw = chunk_id(data)
    threads = 16
    barrier = threading.Barrier(threads)
    results: list[bool] = []
    errors: list[BaseException] = []

    def put() -> None:
        barrier.wait()
        try:
            results.append(store.put(raw, data))
        except BaseException as exc:  # surfaced below: a thread must not swallow failures
            errors.append(exc)

    workers = [threading.Thread(target=put) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    assert sorted(results) == [False] + [True] * (threads - 1)
    assert store.get(raw) == data
    usage = store.usage()
    assert (usage.chunks, usage.stored_bytes) == (1, len(data))


def test_unit_chunkstore_concurrent_puts_of_many_ids_count_exactly(store: ChunkStore) -> None:
    chunks = [blob(f"many-{i}", 1000 + i) for i in range(64)]
    errors: list[BaseException] = []

    def put_all(offset: int) -> None:
        try:
            for data in chunks[offset:] + chunks[:offset]:
                store.put(chunk_id(data), data)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=put_all, args=(i * 8,)) for i in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    usage = store.usage()
    assert usage.chunks == len(chunks)
    assert usage.stored_bytes == sum(len(c) for c in chunks)


def test_unit_chunkstore_restart_rescans_counts(backend: Backend) -> None:
    chunks = [blob(f"restart-{i}", 777 * (i + 1)) for i in range(10)]
    with backend.open() as first:
        for data in chunks:
            first.put(chunk_id(data), data)
    with backend.open() as second:
        usage = second.usage()
        assert usage.chunks == len(chunks)
        assert usage.stored_bytes == sum(len(c) for c in chunks)
        assert all(second.get(chunk_id(c)) == c for c in chunks)


def test_unit_chunkstore_has_many_answers_in_order(store: ChunkStore) -> None:
    stored = [blob(f"has-{i}", 50) for i in range(3)]
    for data in stored:
        store.put(chunk_id(data), data)
    absent = [chunk_id(f"absent-{i}".encode()) for i in range(2)]
    query = [chunk_id(stored[0]), absent[0], chunk_id(stored[2]), absent[1], chunk_id(stored[1])]
    assert store.has_many(query) == [True, False, True, False, True]
    assert store.has_many([]) == []


def test_unit_chunkstore_has_many_validates_every_id_and_caps_batch(store: ChunkStore) -> None:
    good = chunk_id(b"good")
    with pytest.raises(InvalidArgument, match="32 bytes"):
        store.has_many([good, b"../x", good])
    with pytest.raises(InvalidArgument, match="too many ids"):
        store.has_many([good] * (MAX_HAS_BATCH + 1))
    assert store.has_many([good] * MAX_HAS_BATCH) == [False] * MAX_HAS_BATCH


def test_unit_chunkstore_capacity_cap_limits_space(backend: Backend) -> None:
    with backend.open(capacity=1000) as store:
        usage = store.usage()
        assert (usage.capacity_bytes, usage.free_bytes) == (1000, 1000)
        data = blob("cap", 300)
        store.put(chunk_id(data), data)
        usage = store.usage()
        assert (usage.stored_bytes, usage.free_bytes) == (300, 700)
        too_big = blob("too-big", 701)
        with pytest.raises(NoSpace, match="capacity"):
            store.put(chunk_id(too_big), too_big)
        assert not store.has(chunk_id(too_big))
        assert store.usage().stored_bytes == 300
        fits = blob("fits", 700)
        assert store.put(chunk_id(fits), fits) is False
        assert store.usage().free_bytes == 0
        # A chunk already held is acknowledged even when full: nothing new is stored.
        assert store.put(chunk_id(data), data) is True


def test_unit_chunkstore_capacity_defaults_to_file_system(store: ChunkStore) -> None:
    usage = store.usage()
    assert usage.capacity_bytes > 0
    assert 0 <= usage.free_bytes <= usage.capacity_bytes


# -- the filesystem backend -------------------------------------------------------------


def test_unit_filechunkstore_layout_is_verifiable_with_any_tool(tmp_path: Path) -> None:
    data = blob("layout", 12_345)
    raw = chunk_id(data)
    with FileChunkStore(tmp_path / "d") as store:
        store.put(raw, data)
    name = raw.hex()
    path = tmp_path / "d" / "chunks" / name[:2] / name[2:4] / name
    assert path.read_bytes() == data
    assert blake3.blake3(path.read_bytes()).hexdigest() == path.name
    assert list((tmp_path / "d" / "tmp").iterdir()) == []


def test_unit_filechunkstore_tmp_cleaned_at_start(tmp_path: Path) -> None:
    root = tmp_path / "d"
    data = blob("kept", 100)
    with FileChunkStore(root) as store:
        store.put(chunk_id(data), data)
    (root / "tmp" / "half-written.1234").write_bytes(b"partial")
    (root / "tmp" / "another").write_bytes(b"x" * 10)
    (root / "tmp" / "a-dir").mkdir()
    (root / "tmp" / "a-dir" / "inside").write_bytes(b"y")
    with FileChunkStore(root) as store:
        assert list((root / "tmp").iterdir()) == []
        assert (store.usage().chunks, store.usage().stored_bytes) == (1, 100)
        assert store.get(chunk_id(data)) == data


def test_unit_filechunkstore_stray_files_not_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "d"
    data = blob("real", 64)
    with FileChunkStore(root) as store:
        store.put(chunk_id(data), data)
    name = chunk_id(data).hex()
    (root / "chunks" / "README").write_text("not a chunk")
    (root / "chunks" / name[:2] / name[2:4] / "notes.txt").write_text("nor this")
    misplaced = chunk_id(b"elsewhere").hex()
    (root / "chunks" / name[:2] / name[2:4] / misplaced).write_bytes(b"elsewhere")
    with caplog.at_level(logging.WARNING), FileChunkStore(root) as store:
        assert (store.usage().chunks, store.usage().stored_bytes) == (1, 64)
    assert any("3 stray entries" in r.getMessage() for r in caplog.records)


def test_unit_filechunkstore_replaces_copy_of_wrong_size(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = blob("truncated", 9000)
    raw = chunk_id(data)
    with FileChunkStore(tmp_path / "d") as store:
        store.put(raw, data)
        store.path_of(raw).write_bytes(data[:100])  # e.g. a torn copy from another tool
    with FileChunkStore(tmp_path / "d") as store:
        assert store.usage().stored_bytes == 100  # counted as found
        with caplog.at_level(logging.WARNING):
            assert store.put(raw, data) is False
        assert store.get(raw) == data
        assert (store.usage().chunks, store.usage().stored_bytes) == (1, 9000)
    assert any("replacing the damaged copy" in r.getMessage() for r in caplog.records)


def test_unit_filechunkstore_one_process_per_data_dir(tmp_path: Path) -> None:
    root = tmp_path / "d"
    with FileChunkStore(root), pytest.raises(ConfigError, match="in use by another process"):
        FileChunkStore(root)
    with FileChunkStore(root) as again:  # the lock went with the first store
        assert again.usage().chunks == 0


def test_unit_filechunkstore_rejects_non_positive_capacity(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="capacity"):
        FileChunkStore(tmp_path / "d", capacity=0)


def test_unit_filechunkstore_unusable_data_dir_is_config_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(ConfigError, match="cannot use data directory"):
        FileChunkStore(not_a_dir)


def test_unit_benefactor_identity_is_stable(tmp_path: Path) -> None:
    first = load_or_create_identity(tmp_path)
    assert first == load_or_create_identity(tmp_path)
    record = json.loads((tmp_path / "benefactor.json").read_text())
    assert record["id"] == first
    assert len(first) == 32 and int(first, 16) >= 0
    assert "created" in record
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_unit_benefactor_identity_unreadable_is_config_error(tmp_path: Path) -> None:
    (tmp_path / "benefactor.json").write_text("{not json")
    with pytest.raises(ConfigError, match="benefactor id"):
        load_or_create_identity(tmp_path)


# -- scrubbing -------------------------------------------------------------------------------


def test_unit_chunkstore_scrub_sound_corrupt_and_gone(backend: Backend,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    from mosafs.benefactor.store import CORRUPT, GONE, SOUND

    good, bad = blob("scrub-good", 5000), blob("scrub-bad", 7000)
    gid, bid = chunk_id(good), chunk_id(bad)
    with backend.open() as store:
        store.put(gid, good)
        store.put(bid, bad)
        backend.corrupt(store, bid, 1234)
        assert store.scrub(gid) == (SOUND, 5000)
        with caplog.at_level(logging.WARNING):
            assert store.scrub(bid) == (CORRUPT, 7000)
        assert any("corrupt chunk" in r.message and bid.hex() in r.message
                   for r in caplog.records)
        assert not store.has(bid)
        assert store.usage().chunks == 1 and store.usage().stored_bytes == 5000
        assert store.scrub(bid) == (GONE, 0)
        assert [i.id for i in store.inventory()] == [gid]
        assert store.put(bid, bad) is False  # a good copy pushed back is stored again
        assert store.get(bid) == bad
        assert store.scrub(bid) == (SOUND, 7000)
        assert store.usage().chunks == 2 and store.usage().stored_bytes == 12000
    with backend.open() as store:  # the counters agree with a fresh scan
        assert store.usage().chunks == 2 and store.usage().stored_bytes == 12000


def test_unit_chunkstore_scrub_refuses_bad_ids(store: ChunkStore) -> None:
    for bad in BAD_IDS:
        with pytest.raises(InvalidArgument):
            store.scrub(bad)


def test_unit_scrubber_reports_corrupt_copies_and_retries_failed_reports(
        backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    from mosafs.benefactor.scrub import Scrubber
    from mosafs.errors import Unavailable

    chunks = [blob(f"scrubber-{i}", 3000 + i) for i in range(10)]
    ids = [chunk_id(c) for c in chunks]
    reported: list[bytes] = []
    up = {"manager": False}

    def report(batch: object) -> None:
        if not up["manager"]:
            raise Unavailable("manager down")
        reported.extend(batch)  # type: ignore[call-overload]

    with backend.open() as store:
        for cid, data in zip(ids, chunks, strict=True):
            store.put(cid, data)
        for cid in ids[:3]:
            backend.corrupt(store, cid, 10)
        scrubber = Scrubber(store, report)
        with caplog.at_level(logging.WARNING):
            final = scrubber.run_pass()
        assert final is not None and final.done
        assert final.checked_chunks == 10 and final.total_chunks == 10
        assert sorted(final.corrupt_ids) == sorted(ids[:3])
        assert reported == []  # the manager was down: kept for later
        up["manager"] = True
        again = scrubber.run_pass()
        assert again is not None and again.checked_chunks == 7 and not again.corrupt_ids
        assert sorted(reported) == sorted(ids[:3])  # delivered with the next pass
        assert store.usage().chunks == 7


def test_unit_scrubber_holds_its_rate_and_stops_when_asked(backend: Backend) -> None:
    from mosafs.benefactor.scrub import MIN_CHARGE, Scrubber

    with backend.open() as store:
        for i in range(8):
            data = blob(f"rate-{i}", 1000)
            store.put(chunk_id(data), data)
        now = [0.0]
        waits: list[float] = []

        def wait(seconds: float) -> bool:
            waits.append(seconds)
            now[0] += seconds
            return False

        scrubber = Scrubber(store, clock=lambda: now[0], min_charge=0)
        final = scrubber.run_pass(rate=1000.0, wait=wait)  # 1000 bytes a second
        assert final is not None and final.checked_bytes == 8000
        assert now[0] == pytest.approx(8.0)  # eight chunks of 1000 bytes: eight seconds
        # By default each chunk counts as at least MIN_CHARGE bytes: small chunks are
        # paced by their number (each costs an open, a read and a close).
        now[0] = 0.0
        small = Scrubber(store, clock=lambda: now[0])
        final = small.run_pass(rate=float(MIN_CHARGE), wait=wait)
        assert final is not None and final.checked_chunks == 8
        assert now[0] == pytest.approx(8.0)  # eight chunks charged MIN_CHARGE each
        calls = [0]

        def stop_after_three(seconds: float) -> bool:
            calls[0] += 1
            return calls[0] >= 3

        assert scrubber.run_pass(rate=1000.0, wait=stop_after_three) is None
        assert calls[0] == 3


def test_unit_ingest_limit_is_a_fifo_link() -> None:
    """Each put holds the link for its bytes / rate after the puts before it."""
    from mosafs.benefactor.ingest import IngestLimiter

    now = [100.0]
    slept: list[float] = []
    limiter = IngestLimiter(1000, clock=lambda: now[0], sleep=slept.append)
    assert limiter.take(500) == 0.5
    assert limiter.take(1000) == 1.5  # queued behind the first
    now[0] = 110.0  # the link idled: no credit is saved up
    assert limiter.take(250) == 0.25
    assert slept == [0.5, 1.5, 0.25]
    with pytest.raises(ValueError):
        IngestLimiter(0)
