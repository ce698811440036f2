"""Garbage collection racing the walks over a benefactor's chunk directory (inventory and
scrub), and puts racing the removal of the fan-out directories GC empties.

Real FileChunkStores in tmp_path, real threads, no mocks: each round deletes (and puts back)
chunks while another thread walks the store, so a chunk or a whole fan-out directory
disappears between the walk's readdir and its stat/open. Before the fix the walk raised
FileNotFoundError ("bug in the scrub pass" in a benefactor's log).
"""

from __future__ import annotations

import os
import queue
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import blake3
import pytest

from mosafs.benefactor.chunkstore import FileChunkStore
from mosafs.benefactor.garbage import GarbageRounds
from mosafs.benefactor.scrub import Scrubber
from mosafs.benefactor.store import CORRUPT, GONE, SOUND
from mosafs.ids import chunk_id
from tests import harness

DENSE = 500  # ids in one top fan-out dir: ~2 a leaf dir, so a walk finds siblings
SPARSE = 300  # ids spread out: ~1 a leaf dir, so deletions empty (and remove) dirs
ROUNDS = 3


def blob(seed: str, size: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=size)


class RecordingStore(FileChunkStore):
    """The real store, noting every scrub verdict (what the scrubber checked)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.verdicts: dict[bytes, str] = {}
        self.last: bytes = b""

    def scrub(self, raw_id: bytes) -> tuple[str, int]:
        verdict, size = super().scrub(raw_id)
        self.verdicts[raw_id] = verdict
        self.last = raw_id
        return verdict, size


def run_threads(*work: Callable[[], None]) -> None:
    """Run WORK in parallel threads (released at once); re-raise the first failure."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(work))

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                start.wait()
                fn()
            except BaseException as exc:  # re-raised below, in the test's thread
                errors.append(exc)
        return run

    threads = [threading.Thread(target=wrap(fn)) for fn in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a racing thread hung"
    if errors:
        raise errors[0]


def chunk_files(root: Path) -> set[bytes]:
    return {bytes.fromhex(p.name) for p in harness.chunk_files(root)}


def empty_fanout_dirs(root: Path) -> list[Path]:
    """Empty leaf fan-out directories (the 256 top ones are made at open and stay)."""
    dirs = [p for p in (root / "chunks").glob("*/*") if p.is_dir()]
    return [d for d in dirs if not any(d.iterdir())]


@pytest.fixture(scope="module")
def chunks() -> dict[bytes, bytes]:
    """DENSE chunks whose ids share their first byte, and SPARSE others."""
    out: dict[bytes, bytes] = {}
    n = 0
    while len(out) < DENSE:
        data = blob(f"dense-{n}", 64 + n % 200)
        n += 1
        if chunk_id(data)[0] == 0x5A:
            out[chunk_id(data)] = data
    for i in range(SPARSE):
        data = blob(f"sparse-{i}", 64 + i % 200)
        out[chunk_id(data)] = data
    return out


def test_gc_deleting_while_scrub_walks(tmp_path: Path, chunks: dict[bytes, bytes]) -> None:
    """A throttled scrub pass and GC in two threads. Each time the scrub pauses (its rate
    limit), GC deletes chunks next to the one just checked: the rest of its leaf dir (which
    the walk has listed but not yet looked at) and others under its top dir (emptying, so
    removing, leaf dirs the walk has listed), and puts some back. That is the window, hit on
    purpose every time instead of by luck."""
    root = tmp_path / "data"
    rng = random.Random(15)
    with RecordingStore(root) as store:
        for rnd in range(ROUNDS):
            scrub_round(store, chunks, rng, rnd)
            assert not empty_fanout_dirs(root)  # GC removed what it emptied; puts remade
            assert store.usage().chunks == len(chunk_files(root))
    with FileChunkStore(root) as store:  # a fresh scan agrees with the counters
        assert store.usage().chunks == len(chunk_files(root))


def scrub_round(store: RecordingStore, chunks: dict[bytes, bytes], rng: random.Random,
                rnd: int) -> None:
    ids = sorted(chunks)
    for cid in ids:
        store.put(cid, chunks[cid])
    before = {item.id: item.touched_ns for item in store.inventory()}
    assert set(before) == set(ids)
    doomed = set(rng.sample(ids, len(ids) // 2))
    back = set(rng.sample(sorted(doomed), len(doomed) // 8))  # put again meanwhile
    deleted: set[bytes] = set()
    reput: set[bytes] = set()
    store.verdicts.clear()
    paused: queue.Queue[bytes | None] = queue.Queue(maxsize=1)
    resumed: queue.Queue[None] = queue.Queue(maxsize=1)
    finals = []

    def collect() -> None:
        while (current := paused.get()) is not None:
            near = [c for c in sorted(doomed - deleted) if c[:1] == current[:1]]
            for cid in [c for c in near if c[:2] == current[:2]] + near[:3]:
                if cid not in deleted and store.delete(cid, touched_ns=before[cid]):
                    deleted.add(cid)
                    if cid in back:  # a writer stores it again: dirs come back
                        store.put(cid, chunks[cid])
                        reput.add(cid)
            resumed.put(None)
        for cid in sorted(doomed - deleted):  # the rest, once the walk is over
            if store.delete(cid, touched_ns=before[cid]):
                deleted.add(cid)

    def throttle(seconds: float) -> bool:
        paused.put(store.last)  # GC runs while the scrub waits out its rate
        resumed.get()
        return False

    def walk() -> None:
        try:
            finals.append(Scrubber(store).run_pass(rate=0, wait=throttle))
        finally:
            paused.put(None)

    run_threads(collect, walk)

    stable = set(ids) - doomed  # present all along: the walk must check each
    assert {c: v for c, v in store.verdicts.items() if c in stable} == \
        dict.fromkeys(stable, SOUND), f"round {rnd}"
    assert CORRUPT not in store.verdicts.values()
    gone = {c for c, v in store.verdicts.items() if v == GONE}
    assert gone <= deleted  # a deleted chunk may be GONE, never corrupt or missing
    (final,) = finals
    assert final is not None and final.done and not final.corrupt_ids
    assert final.checked_chunks == len(store.verdicts) - len(gone)
    assert len(deleted & set(store.verdicts)) > 0  # GC did race the walk
    on_disk = chunk_files(store.data_dir)
    assert on_disk == (set(ids) - deleted) | reput
    assert store.usage().stored_bytes == sum(len(chunks[c]) for c in on_disk)


def test_gc_deleting_while_inventory_walks(tmp_path: Path,
                                          chunks: dict[bytes, bytes]) -> None:
    """Free-running: GC deletes and puts back in two threads while a third walks the
    inventory again and again; every chunk present all along is seen by every walk."""
    root = tmp_path / "data"
    rng = random.Random(16)
    with FileChunkStore(root) as store:
        for _ in range(ROUNDS):
            inventory_round(store, chunks, rng)
            assert store.usage().chunks == len(chunk_files(root))


def inventory_round(store: FileChunkStore, chunks: dict[bytes, bytes],
                    rng: random.Random) -> None:
    ids = sorted(chunks)
    for cid in ids:
        store.put(cid, chunks[cid])
    doomed = rng.sample(ids, len(ids) // 2)
    back = rng.sample(doomed, len(doomed) // 4)
    stable = set(ids) - set(doomed)
    done = threading.Event()
    walks: list[set[bytes]] = []

    def collect() -> None:
        try:
            for cid in doomed:
                store.delete(cid, touched_ns=1 << 62)
        finally:
            done.set()

    def put_back() -> None:
        for cid in back:
            store.put(cid, chunks[cid])

    def walk() -> None:
        while not done.is_set() or not walks:
            walks.append({item.id for item in store.inventory()})

    run_threads(collect, put_back, walk)
    assert all(stable <= seen for seen in walks)
    assert stable <= chunk_files(store.data_dir)


def test_gc_round_while_scrubbing_logs_no_bug(tmp_path: Path, chunks: dict[bytes, bytes],
                                             caplog: pytest.LogCaptureFixture) -> None:
    """The benefactor's own loops: a GC round releasing everything while the background
    scrub loop runs passes back to back. A failing pass logs 'bug in the scrub pass'."""
    from mosafs.benefactor.scrub import ScrubLoop

    root = tmp_path / "data"
    with FileChunkStore(root) as store:
        rounds = GarbageRounds(store, lambda page: ([item.id for item in page], 0))
        loop = ScrubLoop(Scrubber(store), rate=1 << 40, pause=0.0)
        loop.start()
        try:
            for _ in range(2):
                for cid, data in chunks.items():
                    store.put(cid, data)
                result = rounds.run()
                assert result.deleted_chunks == len(chunks)
                assert not chunk_files(root) and not empty_fanout_dirs(root)
        finally:
            loop.stop()
        assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]
        assert store.usage().chunks == 0
        # Only the 256 top fan-out directories stay, empty.
        tops = list((root / "chunks").iterdir())
        assert len(tops) == 256 and not any(any(d.iterdir()) for d in tops)


def same_dir_ids(prefix_len: int, count: int, seed: str) -> Iterator[tuple[bytes, bytes]]:
    """COUNT chunks whose ids start with the same PREFIX_LEN bytes: one fan-out directory
    (2: one leaf dir; 1: one top dir, leaves apart)."""
    want: bytes | None = None
    found = 0
    n = 0
    while found < count:
        data = f"{seed}-{n}".encode()
        n += 1
        cid = chunk_id(data)
        if want is None:
            want = cid[:prefix_len]
        if cid[:prefix_len] == want:
            found += 1
            yield cid, data


@pytest.mark.parametrize("shared", [1, 2], ids=["one-top-dir", "one-leaf-dir"])
def test_puts_race_gc_removing_fanout_dirs(tmp_path: Path, shared: int) -> None:
    """Puts and deletes of ids that share fan-out directories, in parallel: a put must never
    lose its directory to a removal (os.replace into a vanished dir), and every put that
    returned leaves a chunk unless a later delete took it."""
    group = dict(same_dir_ids(shared, 4 if shared == 2 else 12, f"fanout-{shared}"))
    root = tmp_path / "data"
    with FileChunkStore(root) as store:
        def churn(cid: bytes) -> Callable[[], None]:
            def run() -> None:
                for _ in range(150):
                    store.put(cid, group[cid])
                    assert store.get(cid) == group[cid]
                    assert store.delete(cid, touched_ns=1 << 62) == len(group[cid])
                    assert not store.has(cid)
            return run

        run_threads(*(churn(cid) for cid in group))
        assert not chunk_files(root) and not empty_fanout_dirs(root)
        assert store.usage().chunks == 0 and store.usage().stored_bytes == 0
        for cid, data in group.items():  # and the directories come back for new puts
            assert store.put(cid, data) is False
        assert chunk_files(root) == set(group)
    with FileChunkStore(root) as store:
        assert store.usage().chunks == len(group)


def test_walk_skips_a_fanout_dir_removed_under_it(tmp_path: Path) -> None:
    """Deterministic version of the window: the walk has listed a directory, then GC
    empties and removes it before the walk reads it."""
    root = tmp_path / "data"
    datas = [blob(f"skip-{i}", 100) for i in range(50)]
    with FileChunkStore(root) as store:
        for d in datas:
            store.put(chunk_id(d), d)
        walk = store.inventory()
        first = next(walk)
        victims = [chunk_id(d) for d in datas if chunk_id(d) != first.id]
        for cid in victims[: len(victims) // 2]:
            assert store.delete(cid, touched_ns=1 << 62)
        rest = [first.id, *(item.id for item in walk)]
        kept = set(victims[len(victims) // 2:]) | {first.id}
        assert kept <= set(rest) and len(rest) == len(set(rest))
        assert set(rest) <= {chunk_id(d) for d in datas}
        assert os.path.isdir(root / "chunks")
