"""The file-system backend of ChunkStore: one file per chunk, named by its id.

Filesystem layout of a data directory (docs/benefactor.md):

    DIR/benefactor.json           {"id": ..., "created": ...}: the stable benefactor id
    DIR/lock                      flock()ed while a process uses DIR
    DIR/chunks/ab/cd/<64-hex id>  exactly the chunk's bytes (b3sum FILE prints its name)
    DIR/tmp/                      writes in progress; emptied at start

Chunks come and go while the directory is walked (inventory, scrub): a put adds files and
fan-out directories, garbage collection deletes files and the fan-out directories it
empties. The walk takes whatever vanishes under it as deleted, never as an error; puts and
removals of one fan-out directory are serialised by the stripe lock of its first byte.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from mosafs import ids
from mosafs.benefactor.chunkstore import (
    CORRUPT,
    GONE,
    SOUND,
    Buffer,
    ChunkStore,
    InventoryItem,
    Mapper,
    PutOutcome,
    Usage,
    check_content,
)
from mosafs.errors import ConfigError, IntegrityError, MosafsError, NoSpace, NotFound
from mosafs.ids import check_id, chunk_id
from mosafs.procutil import fsync_dir, write_json_atomic

log = logging.getLogger(__name__)

IDENTITY_FILE = "benefactor.json"
LOCK_FILE = "lock"
CHUNKS_DIR = "chunks"
TMP_DIR = "tmp"
_HEX_NAME = re.compile(r"[0-9a-f]{64}")
_FANOUT_NAME = re.compile(r"[0-9a-f]{2}")


def _listing(path: str | Path, *, missing_ok: bool = True) -> list[os.DirEntry[str]]:
    """The entries of a directory, read at once (no descriptor is held while a slow walk,
    such as a throttled scrub, looks at them). With MISSING_OK, none when the directory
    has gone: garbage collection removes the fan-out directories it empties."""
    try:
        with os.scandir(path) as entries:
            return list(entries)
    except FileNotFoundError:
        if missing_ok:
            return []
        raise


def load_or_create_identity(data_dir: Path) -> str:
    """The benefactor id kept in DATA_DIR/benefactor.json, generated on first use.

    The manager knows a benefactor by this id across restarts and address changes, so it is
    written once, atomically and durably, and never changed.
    """
    path = data_dir / IDENTITY_FILE
    if path.exists():
        return _read_identity(path)
    write_json_atomic(path, {
        "id": uuid.uuid4().hex,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    })
    fsync_dir(data_dir)
    return _read_identity(path)


def _read_identity(path: Path) -> str:
    try:
        record = json.loads(path.read_text())
        ident = record["id"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"cannot read the benefactor id from {path}: {exc}") from None
    if not isinstance(ident, str) or not ident:
        raise ConfigError(f"{path} holds no usable benefactor id: {ident!r}")
    return ident


@dataclass(frozen=True, slots=True)
class _Staged:
    """A blob of a group put written to TMP and synced, not yet named."""

    raw_id: bytes
    tmp: Path
    path: Path
    size: int


class FileChunkStore(ChunkStore):
    """One file per chunk under DIR/chunks/ab/cd/, written via DIR/tmp/ + fsync + rename.

    Counts and stored bytes are scanned once at open and kept in memory. CAPACITY (bytes)
    caps what this store may hold (donated space); None means the whole file system.
    """

    def __init__(self, data_dir: str | os.PathLike[str], *, capacity: int | None = None) -> None:
        if capacity is not None and capacity <= 0:
            raise ConfigError(f"capacity must be a positive number of bytes, got {capacity}")
        self.data_dir = Path(data_dir)
        self.capacity = capacity
        self._chunks_dir = self.data_dir / CHUNKS_DIR
        self._tmp_dir = self.data_dir / TMP_DIR
        # Stripes, not one lock: puts of different ids rename and fsync in parallel, while
        # two puts of one id agree on which of them stored it.
        self._stripes = [threading.Lock() for _ in range(256)]
        self._stats_lock = threading.Lock()
        self._chunks = 0
        self._stored = 0
        self._reserved = 0  # bytes of puts in progress, so concurrent puts respect capacity
        # Ids that get() found corrupt: has() denies them and put() replaces them, so the
        # chunk gets repaired when a good copy arrives.
        self._corrupt: set[bytes] = set()
        # Ids renamed into place whose directory is not yet fsynced (a group put syncs
        # each directory once, after all its renames): a put that finds one of them
        # stored syncs its directory itself before it answers "present". Guarded by the
        # id's stripe lock.
        self._unsynced: set[bytes] = set()
        self._lock_fd: int | None = None
        self._open()

    # -- opening ------------------------------------------------------------------------

    def _open(self) -> None:
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = self._take_lock()
            self._chunks_dir.mkdir(exist_ok=True)
            self._make_top_dirs()
            self._tmp_dir.mkdir(exist_ok=True)
            self._clean_tmp()
            self._scan()
        except OSError as exc:
            self.close()
            raise ConfigError(f"cannot use data directory {self.data_dir}: {exc}") from None
        except BaseException:
            self.close()
            raise

    def _make_top_dirs(self) -> None:
        """The 256 top fan-out directories (chunks/00 .. chunks/ff), made once and kept:
        the first put into each otherwise made it and fsynced chunks/ under the stripe
        lock, 256 directory syncs of one directory that the first large write of a new
        store paid (docs/benchmarks.md, "GPU-native checkpoints")."""
        made = 0
        for byte in range(256):
            top = self._chunks_dir / f"{byte:02x}"
            if not top.is_dir():
                top.mkdir()
                made += 1
        if made:
            fsync_dir(self._chunks_dir)

    def _take_lock(self) -> int:
        """Two processes on one data dir would share an id and race on files: refuse."""
        path = self.data_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(
                f"data directory {self.data_dir} is in use by another process (pid {holder})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _clean_tmp(self) -> None:
        """Writes in progress when the last process died never became chunks: drop them."""
        removed = 0
        for entry in os.scandir(self._tmp_dir):
            with contextlib.suppress(FileNotFoundError):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed += 1
        if removed:
            log.info("removed %d unfinished writes from %s", removed, self._tmp_dir)

    def _scan(self) -> None:
        started = time.monotonic()
        chunks = stored = 0
        stray: list[str] = []
        for size in self._chunk_sizes(stray):
            chunks += 1
            stored += size
        with self._stats_lock:
            self._chunks, self._stored = chunks, stored
        if stray:
            log.warning("ignoring %d stray entries under %s (not chunks), e.g. %s",
                        len(stray), self._chunks_dir, stray[0])
        log.info("%d chunks, %d bytes in %s (scanned in %.2fs)",
                 chunks, stored, self._chunks_dir, time.monotonic() - started)

    def _chunk_sizes(self, stray: list[str]) -> Iterator[int]:
        """The size of every chunk file; anything else is appended to STRAY."""
        for _, st in self._chunk_stats(stray):
            yield st.st_size

    def _chunk_stats(self, stray: list[str]) -> Iterator[tuple[str, os.stat_result]]:
        """(hex id, lstat) of every chunk file still there when its turn comes; anything
        else is appended to STRAY."""
        for entry in self._chunk_entries(stray):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted since its directory was read (garbage collection)
            yield entry.name, st

    def _chunk_entries(self, stray: list[str]) -> Iterator[os.DirEntry[str]]:
        """Every chunk file; anything else is appended to STRAY."""
        for top in _listing(self._chunks_dir, missing_ok=False):  # never removed: an error
            if not (top.is_dir(follow_symlinks=False) and _FANOUT_NAME.fullmatch(top.name)):
                stray.append(top.path)
                continue
            yield from self._leaf_entries(top, stray)

    def _leaf_entries(self, top: os.DirEntry[str], stray: list[str],
                      ) -> Iterator[os.DirEntry[str]]:
        for mid in _listing(top.path):
            if not (mid.is_dir(follow_symlinks=False) and _FANOUT_NAME.fullmatch(mid.name)):
                stray.append(mid.path)
                continue
            for leaf in _listing(mid.path):
                name = leaf.name
                if (leaf.is_file(follow_symlinks=False) and _HEX_NAME.fullmatch(name)
                        and name[:2] == top.name and name[2:4] == mid.name):
                    yield leaf
                elif os.path.lexists(leaf.path):  # is_file() is False for a vanished file
                    stray.append(leaf.path)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    # -- paths --------------------------------------------------------------------------

    def path_of(self, raw_id: bytes) -> Path:
        """Where a chunk lives; RAW_ID must have passed check_id (the name is its hex)."""
        name = raw_id.hex()
        return self._chunks_dir / name[:2] / name[2:4] / name

    def _stripe(self, raw_id: bytes) -> threading.Lock:
        return self._stripes[raw_id[0]]

    # -- operations ---------------------------------------------------------------------

    def put(self, raw_id: bytes, data: Buffer) -> bool:
        outcome = self.put_many([(raw_id, data)])[0]
        if isinstance(outcome, MosafsError):
            raise outcome
        return outcome

    def put_many(self, blobs: Sequence[tuple[bytes, Buffer]], *,
                 parallel: Mapper = map) -> list[PutOutcome]:
        """A group put made durable at once: every new blob is written to tmp/ and
        fdatasynced (in PARALLEL), then each is renamed into place, then each directory
        that got a name is fsynced once (in PARALLEL). A name is only ever given to a
        whole, synced file, and nothing is answered before its rename is durable; what
        the group saves is the per-blob directory sync and journal commit (docs/benefactor.md,
        "Put")."""
        staged: list[PutOutcome | _Staged | BaseException] = list(
            parallel(self._stage_caught, blobs))
        try:
            outcomes = self._install_all(staged, parallel)
        finally:
            for item in staged:
                if isinstance(item, _Staged):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(item.tmp)  # a rename that happened left nothing here
                    self._release(item.size)
        for item in staged:
            if isinstance(item, BaseException) and not isinstance(item, MosafsError):
                raise item  # a bug, raised once every other blob's temp file is gone
        return outcomes

    def _stage_caught(self, blob: tuple[bytes, Buffer]) -> PutOutcome | _Staged | BaseException:
        """_stage, with its error as a value: a group cleans up every blob before raising."""
        try:
            return self._stage(*blob)
        except Exception as exc:  # re-raised by put_many once the group is cleaned up
            return exc

    def _stage(self, raw_id: bytes, data: Buffer) -> bool | _Staged:
        """True when a sound copy is stored (a use: its mtime is set), else the blob
        written and synced under tmp/ with its size reserved."""
        check_id(raw_id)
        check_content(raw_id, data)
        path = self.path_of(raw_id)
        if self._present(raw_id, path, len(data)):
            return True
        size = len(data)
        self._reserve(size)
        try:
            return _Staged(raw_id, self._write_temp(raw_id, data), path, size)
        except BaseException:
            self._release(size)
            raise

    def _present(self, raw_id: bytes, path: Path, size: int) -> bool:
        """Whether a sound copy is stored and durable; if so, the put is a use."""
        # Under the stripe lock: a copy another put is still installing counts as present
        # only once its rename is done.
        with self._stripe(raw_id):
            if not self._holds(raw_id, path, size):
                return False
            # A put of a stored chunk is a use: garbage collection spares a chunk put
            # after its inventory (a write may be about to commit a reference to it).
            os.utime(path)
            unsynced = raw_id in self._unsynced
        if unsynced:
            self._sync_name(path)  # its group's syncs may still be running: not yet durable
        return True

    def _holds(self, raw_id: bytes, path: Path, size: int) -> bool:
        """Whether a sound copy is stored. A copy of the wrong size is damaged: replace it."""
        try:
            stored_size = path.stat().st_size
        except FileNotFoundError:
            return False
        if stored_size != size:
            log.warning("chunk %s is stored with %d bytes, not %d: replacing the damaged copy",
                        raw_id.hex(), stored_size, size)
            return False
        return raw_id not in self._corrupt

    def _reserve(self, size: int) -> None:
        """Count SIZE bytes as taken, so concurrent puts respect the capacity."""
        with self._stats_lock:
            if self.capacity is not None:
                used = self._stored + self._reserved
                if used + size > self.capacity:
                    raise NoSpace(
                        f"benefactor capacity is full: {used} of {self.capacity} bytes used, "
                        f"cannot take {size} more"
                    )
            self._reserved += size

    def _release(self, size: int) -> None:
        with self._stats_lock:
            self._reserved -= size

    def _write_temp(self, raw_id: bytes, data: Buffer) -> Path:
        tmp = self._tmp_dir / f"{raw_id.hex()}.{uuid.uuid4().hex}"
        try:
            with open(tmp, "xb") as f:
                f.write(data)
                f.flush()
                # The data and the size; the name comes with the directory's sync later.
                os.fdatasync(f.fileno())
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NoSpace(f"benefactor file system is full: {exc}") from None
            raise
        return tmp

    def _install_all(self, staged: Sequence[PutOutcome | _Staged | BaseException],
                     parallel: Mapper) -> list[PutOutcome]:
        """Rename every staged blob into place, then sync once each directory that got a
        name (a blob's, or a fan-out directory made for one); the outcomes of STAGED (an
        exception that is not a MosafsError: False, the caller raises it)."""
        outcomes: list[PutOutcome] = []
        renamed: list[_Staged] = []
        changed: set[Path] = set()
        for item in staged:
            if isinstance(item, _Staged):
                present = self._install(item, changed)
                if not present:
                    renamed.append(item)
                outcomes.append(present)
            elif isinstance(item, bool | MosafsError):
                outcomes.append(item)
            else:
                outcomes.append(False)
        # Sorted: the same directories in the same order, for tests and for the disk.
        list(parallel(fsync_dir, sorted(changed)))
        for item in renamed:
            with self._stripe(item.raw_id):
                self._unsynced.discard(item.raw_id)
        return outcomes

    def _install(self, item: _Staged, changed: set[Path]) -> bool:
        """Rename ITEM into place unless a sound copy appeared meanwhile; False: named now,
        durable once the directories added to CHANGED are synced."""
        raw_id, path = item.raw_id, item.path
        with self._stripe(raw_id):
            if self._holds(raw_id, path, item.size):
                unsynced = raw_id in self._unsynced
            else:
                changed.update(self._rename(item))
                return False
        if unsynced:
            self._sync_name(path)
        return True

    def _rename(self, item: _Staged) -> list[Path]:
        """Give ITEM its name (under its stripe lock) and count it; the directories whose
        entries changed, to be synced."""
        raw_id, path, size = item.raw_id, item.path, item.size
        changed = [*self._make_dirs(path.parent), path.parent]
        try:
            old_size: int | None = path.stat().st_size
        except FileNotFoundError:
            old_size = None
        os.replace(item.tmp, path)
        self._unsynced.add(raw_id)
        self._corrupt.discard(raw_id)
        # The counters hold what the scan found on disk (or puts added), so a replaced
        # damaged copy adjusts them by its size on disk.
        with self._stats_lock:
            if old_size is None:
                self._chunks += 1
                self._stored += size
            else:
                self._stored += size - old_size
        return changed

    @staticmethod
    def _sync_name(path: Path) -> None:
        """Make a chunk's name durable: its directory, and that directory's own entry (it
        may have been made for the chunk by a group whose syncs are still running)."""
        fsync_dir(path.parent)
        fsync_dir(path.parent.parent)

    def _make_dirs(self, leaf_dir: Path) -> list[Path]:
        """Create the missing fan-out directories; the parents that got an entry (the
        caller syncs them, with the chunk's own directory, before answering).

        Called under the stripe lock of the id; every id under chunks/ab/ shares that
        stripe, so no other put creates these directories concurrently.
        """
        made = []
        for d in (leaf_dir.parent, leaf_dir):
            if not d.is_dir():
                d.mkdir()
                made.append(d.parent)
        return made

    def get(self, raw_id: bytes, *, verify: bool = True) -> bytes:
        check_id(raw_id)
        path = self.path_of(raw_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise NotFound(f"chunk {raw_id.hex()} is not stored here") from None
        if not verify:
            if raw_id in self._corrupt:
                raise IntegrityError(f"chunk {raw_id.hex()} is corrupt here (needs repair)")
            return data
        try:
            ids.verify(raw_id, data)
        except IntegrityError as exc:
            # Once per chunk: readers retrying a corrupt chunk must not flood the log.
            level = logging.DEBUG if raw_id in self._corrupt else logging.WARNING
            self._corrupt.add(raw_id)
            log.log(level, "corrupt chunk %s in %s (not served; needs repair): %s",
                    raw_id.hex(), path, exc)
            raise
        return data

    def inventory(self) -> Iterator[InventoryItem]:
        for name, st in self._chunk_stats([]):
            yield InventoryItem(bytes.fromhex(name), st.st_mtime_ns, st.st_size)

    def delete(self, raw_id: bytes, *, touched_ns: int) -> int:
        check_id(raw_id)
        path = self.path_of(raw_id)
        with self._stripe(raw_id):
            try:
                st = path.stat()
            except FileNotFoundError:
                return 0
            if st.st_mtime_ns > touched_ns:
                return 0  # put again since the inventory: in use
            self._remove(raw_id, path)
        self._forget_size(st.st_size)
        return st.st_size

    def _remove(self, raw_id: bytes, path: Path) -> None:
        """Unlink a chunk file durably, and the fan-out directories that leaves empty (under
        its stripe lock, which every put creating directories under chunks/ab/ holds too: a
        put never installs into a directory removed under it)."""
        path.unlink()
        fsync_dir(path.parent)
        self._corrupt.discard(raw_id)
        self._remove_empty_dirs(path.parent)

    @staticmethod
    def _remove_empty_dirs(leaf_dir: Path) -> None:
        """Remove LEAF_DIR while empty: without it a store that once held many chunks
        keeps up to 65,536 empty directories for every walk to read (the 256 top ones
        stay: _make_top_dirs). Not fsynced: an empty directory back after a crash is
        harmless."""
        try:
            leaf_dir.rmdir()
        except FileNotFoundError:
            return  # removed by someone else
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise  # else other chunks live here

    def _forget_size(self, size: int) -> None:
        """The counters after a chunk file of SIZE bytes was removed."""
        with self._stats_lock:
            self._chunks -= 1
            self._stored -= size

    def has(self, raw_id: bytes) -> bool:
        check_id(raw_id)
        return raw_id not in self._corrupt and self.path_of(raw_id).is_file()

    def scrub(self, raw_id: bytes) -> tuple[str, int]:
        check_id(raw_id)
        path = self.path_of(raw_id)
        try:
            with open(path, "rb") as f:
                read = os.fstat(f.fileno())
                data = f.read()
        except FileNotFoundError:
            return GONE, 0
        if chunk_id(data) == raw_id:
            return SOUND, len(data)
        with self._stripe(raw_id):
            try:
                st = path.stat()
            except FileNotFoundError:
                return GONE, len(data)
            if (st.st_ino, st.st_dev) != (read.st_ino, read.st_dev):
                return SOUND, len(data)  # a put replaced the copy meanwhile: that one is new
            self._remove(raw_id, path)
        self._forget_size(st.st_size)
        log.warning("corrupt chunk %s in %s: %d bytes that do not match the id; deleted "
                    "(a good replica is copied back)", raw_id.hex(), path, len(data))
        return CORRUPT, len(data)

    def usage(self) -> Usage:
        st = os.statvfs(self.data_dir)
        fs_size = st.f_blocks * st.f_frsize
        fs_free = st.f_bavail * st.f_frsize
        with self._stats_lock:
            chunks, stored = self._chunks, self._stored
        if self.capacity is None:
            return Usage(chunks, stored, fs_size, fs_free)
        capacity = min(self.capacity, fs_size)
        free = max(0, min(fs_free, self.capacity - stored))
        return Usage(chunks, stored, capacity, free)
