"""The file store's group put: the order of its syncs and renames (a name is only ever
given to a whole, synced file; nothing is answered before its rename is durable), a
concurrent put of an id whose group is still syncing, and a bug in one blob of a group.

The system calls are observed, not replaced: each wrapper records the call and makes it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import blake3
import pytest

from mosafs.benefactor import filestore
from mosafs.benefactor.filestore import FileChunkStore
from mosafs.ids import chunk_id


def blob(seed: str, size: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=size)


class Calls:
    """Records (what, path) of the syncs and renames a store makes, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        real_fdatasync, real_replace = os.fdatasync, os.replace
        real_fsync_dir = filestore.fsync_dir

        def fdatasync(fd: int) -> None:
            self._add("fdatasync", os.readlink(f"/proc/self/fd/{fd}"))
            real_fdatasync(fd)

        def replace(src: Any, dst: Any) -> None:
            real_replace(src, dst)
            self._add("rename", f"{src} -> {dst}")

        def fsync_dir(path: Any) -> None:
            self.before_dir_sync(str(path))
            real_fsync_dir(path)
            self._add("dirsync", str(path))

        self.before_dir_sync: Callable[[str], None] = lambda path: None
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(filestore, "fsync_dir", fsync_dir)

    def _add(self, what: str, path: str) -> None:
        with self._lock:
            self.log.append((what, path))

    def index(self, what: str, contains: str) -> int:
        return next(i for i, (w, p) in enumerate(self.log) if w == what and contains in p)


def test_unit_filestore_group_syncs_each_file_before_its_name_and_each_dir_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with FileChunkStore(tmp_path / "d") as store:
        # Two blobs whose ids share a leaf directory, found among the first ones made.
        made = [blob(f"order-{i}", 3000) for i in range(3000)]
        by_dir: dict[Path, list[bytes]] = {}
        for data in made:
            by_dir.setdefault(store.path_of(chunk_id(data)).parent, []).append(data)
        shared = next(group for group in by_dir.values() if len(group) >= 2)[:2]
        others = [d for d in made[:6] if d not in shared]
        group = [*shared, *others]
        calls = Calls(monkeypatch)
        with ThreadPoolExecutor(4) as pool:
            outcomes = store.put_many([(chunk_id(d), d) for d in group], parallel=pool.map)
        assert outcomes == [False] * len(group)
        # The leaf directories were made for the group: they and their parents are synced.
        leaves = {store.path_of(chunk_id(d)).parent for d in group}
        dirs = {str(d) for d in leaves} | {str(d.parent) for d in leaves}
        synced = [p for w, p in calls.log if w == "dirsync"]
        assert sorted(synced) == sorted(dirs)  # each directory once, the shared one too
        last_rename = max(i for i, (w, _) in enumerate(calls.log) if w == "rename")
        for data in group:
            name = chunk_id(data).hex()
            synced_at = calls.index("fdatasync", f"/tmp/{name}.")
            named_at = calls.index("rename", f"/{name}")
            assert synced_at < named_at  # the name goes to a synced file only
            dir_synced_at = calls.index("dirsync", str(store.path_of(chunk_id(data)).parent))
            assert dir_synced_at > last_rename  # after every name of the group
        assert list((tmp_path / "d" / "tmp").iterdir()) == []


def test_unit_filestore_put_of_an_id_whose_group_is_syncing_waits_for_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A put that finds a copy its group renamed but has not yet made durable answers
    "present" only after syncing that directory itself."""
    data = blob("syncing", 10_000)
    raw = chunk_id(data)
    with FileChunkStore(tmp_path / "d") as store:
        leaf = str(store.path_of(raw).parent)
        os.makedirs(leaf)  # only the group's syncs count
        calls = Calls(monkeypatch)
        group_thread = threading.Event()
        release = threading.Event()

        def hold_the_group(path: str) -> None:
            if path == leaf and threading.current_thread().name == "group":
                group_thread.set()
                assert release.wait(10)

        calls.before_dir_sync = hold_the_group
        outcome: list[object] = []
        group = threading.Thread(
            target=lambda: outcome.extend(store.put_many([(raw, data)])), name="group")
        group.start()
        try:
            assert group_thread.wait(10)
            assert store.put(raw, data) is True
            assert ("dirsync", leaf) in calls.log  # synced by the second put, group held
        finally:
            release.set()
            group.join(10)
        assert outcome == [False]
        top = str(Path(leaf).parent)
        assert [p for w, p in calls.log if w == "dirsync"] == [leaf, top, leaf]
        # Once the group's own sync is done, a put of the id syncs nothing.
        calls.log.clear()
        assert store.put(raw, data) is True
        assert [w for w, _ in calls.log] == []


def test_unit_filestore_a_bug_in_one_blob_leaves_the_group_clean(tmp_path: Path) -> None:
    """A blob that is not bytes is a caller's bug: raised, after the rest of its group is
    stored, with no temp file left behind and no capacity held."""
    good = [blob(f"clean-{i}", 4000) for i in range(3)]
    with FileChunkStore(tmp_path / "d", capacity=12_000) as store:
        group: list[tuple[bytes, Any]] = [(chunk_id(d), d) for d in good]
        group.insert(1, (chunk_id(b"x"), 12345))
        with ThreadPoolExecutor(4) as pool, pytest.raises(TypeError):
            store.put_many(group, parallel=pool.map)
        assert all(store.get(chunk_id(d)) == d for d in good)
        assert list((tmp_path / "d" / "tmp").iterdir()) == []
        usage = store.usage()
        assert (usage.chunks, usage.stored_bytes, usage.free_bytes) == (3, 12_000, 0)
