"""Chunk storage of a benefactor: the file-system backend of the ChunkStore interface
(mosafs.benefactor.store).

Domain code: no gRPC here (an import-linter contract enforces it). Every method validates
its ids and raises mosafs.errors classes; the servicer maps them to status codes.

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
from datetime import UTC, datetime
from pathlib import Path

from mosafs import ids
from mosafs.benefactor.store import (
    CORRUPT,
    GONE,
    SOUND,
    Buffer,
    ChunkStore,
    InventoryItem,
    Usage,
    check_content,
)
from mosafs.errors import ConfigError, IntegrityError, NoSpace, NotFound
from mosafs.ids import check_id, chunk_id
from mosafs.procutil import fsync_dir, write_json_atomic

log = logging.getLogger(__name__)

IDENTITY_FILE = "benefactor.json"
LOCK_FILE = "lock"
CHUNKS_DIR = "chunks"
TMP_DIR = "tmp"
_HEX_NAME = re.compile(r"[0-9a-f]{64}")
_FANOUT_NAME = re.compile(r"[0-9a-f]{2}")


@contextlib.contextmanager
def _full_is_no_space() -> Iterator[None]:
    """Around a put's steps that touch the disk: a full file system or quota (ENOSPC,
    EDQUOT) raises NoSpace, which the writer answers by trying another benefactor; any
    other OSError goes on as it is (a failing disk, or a bug)."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f" ({exc.filename})" if exc.filename else ""
            raise NoSpace(f"benefactor file system is full: {exc.strerror}{where}; "
                          "chunk not stored") from None
        raise


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
        self._chunks_str, self._tmp_str = str(self._chunks_dir), str(self._tmp_dir)
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
        return Path(self._where(raw_id))

    def _where(self, raw_id: bytes) -> str:
        # Strings, not Paths, on every put and get: pathlib's parsing and joining was a
        # third of a small chunk's put (docs/benchmarks.md, "A put's own cost").
        name = raw_id.hex()
        return f"{self._chunks_str}/{name[:2]}/{name[2:4]}/{name}"

    def _stripe(self, raw_id: bytes) -> threading.Lock:
        return self._stripes[raw_id[0]]

    # -- operations ---------------------------------------------------------------------

    def put(self, raw_id: bytes, data: Buffer) -> bool:
        check_id(raw_id)
        check_content(raw_id, data)
        path = self._where(raw_id)
        size = memoryview(data).nbytes
        # Under the stripe lock: a copy another put is still installing counts as present
        # only once its rename is durable.
        with self._stripe(raw_id):
            if self._holds(raw_id, path, size)[0]:
                # A put of a stored chunk is a use: garbage collection spares a chunk put
                # after its inventory (a write may be about to commit a reference to it).
                os.utime(path)
                return True
        with self._reservation(size):
            tmp = self._write_temp(raw_id, data)
            try:
                return self._install(raw_id, tmp, path, size)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def _holds(self, raw_id: bytes, path: str, size: int) -> tuple[bool, int | None]:
        """(whether a sound copy is stored, the size of the file there or None). A copy of
        the wrong size is damaged: replace it."""
        try:
            stored_size = os.stat(path).st_size
        except FileNotFoundError:
            return False, None
        if stored_size != size:
            log.warning("chunk %s is stored with %d bytes, not %d: replacing the damaged copy",
                        raw_id.hex(), stored_size, size)
            return False, stored_size
        return raw_id not in self._corrupt, stored_size

    @contextlib.contextmanager
    def _reservation(self, size: int) -> Iterator[None]:
        with self._stats_lock:
            if self.capacity is not None:
                used = self._stored + self._reserved
                if used + size > self.capacity:
                    raise NoSpace(
                        f"benefactor capacity is full: {used} of {self.capacity} bytes used, "
                        f"cannot take {size} more"
                    )
            self._reserved += size
        try:
            yield
        finally:
            with self._stats_lock:
                self._reserved -= size

    def _write_temp(self, raw_id: bytes, data: Buffer) -> str:
        tmp = f"{self._tmp_str}/{raw_id.hex()}.{uuid.uuid4().hex}"
        with _full_is_no_space():
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                try:
                    view = memoryview(data).cast("B")
                    while view:  # a write may store less than asked
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        return tmp

    def _install(self, raw_id: bytes, tmp: str, path: str, size: int) -> bool:
        """Rename TMP into place unless a sound copy appeared meanwhile; False: stored now."""
        with self._stripe(raw_id):
            present, old_size = self._holds(raw_id, path, size)
            if present:
                return True
            # The temp file took the room it needs; making a fan-out directory, growing
            # one by the rename or syncing it can still find the file system full (PUT
            # removes the temp file).
            with _full_is_no_space():
                try:
                    os.replace(tmp, path)
                except FileNotFoundError:  # the fan-out directories are not there yet
                    self._make_dirs(os.path.dirname(path))
                    os.replace(tmp, path)
                try:
                    fsync_dir(os.path.dirname(path))  # the rename must survive a power loss
                except OSError:
                    # Not durable, so not stored: a copy the answer does not promise must
                    # not be there for a later put or HasChunks to count on.
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    if old_size is not None:  # the damaged copy it replaced is gone too
                        with self._stats_lock:
                            self._chunks -= 1
                            self._stored -= old_size
                    raise
            self._corrupt.discard(raw_id)
        # The counters hold what the scan found on disk (or puts added), so a replaced
        # damaged copy adjusts them by its size on disk.
        with self._stats_lock:
            if old_size is None:
                self._chunks += 1
                self._stored += size
            else:
                self._stored += size - old_size
        return False

    @staticmethod
    def _make_dirs(leaf_dir: str) -> None:
        """Create the fan-out directories, each durable in its parent.

        Called under the stripe lock of the id; every id under chunks/ab/ shares that
        stripe, so no other put creates these directories concurrently.
        """
        for d in (os.path.dirname(leaf_dir), leaf_dir):
            if not os.path.isdir(d):
                os.mkdir(d)
                try:
                    fsync_dir(os.path.dirname(d))
                except OSError:
                    # A later put finding it would not sync its parent again: remove it.
                    with contextlib.suppress(OSError):
                        os.rmdir(d)
                    raise

    def get(self, raw_id: bytes, *, verify: bool = True) -> bytes:
        check_id(raw_id)
        path = self._where(raw_id)
        try:
            with open(path, "rb", buffering=0) as f:
                data = f.readall()
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

    def refresh(self, items: Sequence[InventoryItem]) -> list[InventoryItem]:
        out = []
        for item in items:
            try:
                st = os.stat(self._where(item.id))
            except FileNotFoundError:
                continue  # deleted since the listing (garbage collection, scrub)
            out.append(InventoryItem(item.id, st.st_mtime_ns, st.st_size))
        return out

    def delete(self, raw_id: bytes, *, touched_ns: int) -> int:
        check_id(raw_id)
        path = self._where(raw_id)
        with self._stripe(raw_id):
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return 0
            if st.st_mtime_ns > touched_ns:
                return 0  # put again since the inventory: in use
            self._remove(raw_id, path)
        self._forget_size(st.st_size)
        return st.st_size

    def _remove(self, raw_id: bytes, path: str) -> None:
        """Unlink a chunk file durably, and the fan-out directories that leaves empty (under
        its stripe lock, which every put creating directories under chunks/ab/ holds too: a
        put never installs into a directory removed under it)."""
        os.unlink(path)
        fsync_dir(os.path.dirname(path))
        self._corrupt.discard(raw_id)
        self._remove_empty_dirs(os.path.dirname(path))

    @staticmethod
    def _remove_empty_dirs(leaf_dir: str) -> None:
        """Remove LEAF_DIR while empty: without it a store that once held many chunks
        keeps up to 65,536 empty directories for every walk to read (the 256 top ones
        stay: _make_top_dirs). Not fsynced: an empty directory back after a crash is
        harmless."""
        try:
            os.rmdir(leaf_dir)
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
        return raw_id not in self._corrupt and os.path.isfile(self._where(raw_id))

    def scrub(self, raw_id: bytes) -> tuple[str, int]:
        check_id(raw_id)
        path = self._where(raw_id)
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
                st = os.stat(path)
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
