"""Randomized model-based test of file contents through a real mount.

Thousands of random operations (writes inside, at and beyond EOF, O_APPEND writes,
truncate/ftruncate down and up, reads crossing chunk boundaries and EOF, rename over
existing files, unlink of open files, fsync, close/reopen, O_TRUNC reopen) run against the
mount and against an in-memory model (name -> file object -> bytearray). Every read is
compared byte for byte with the model; a few files stay open at once through several
descriptors. Afterwards every descriptor is closed, the cluster is stopped and started
again on the same data dir, and every file must still hold the model's bytes.

The model is plain POSIX on one machine: all descriptors of a file see the same bytes at
once, and an unlinked file lives on (readable and writable) through the descriptors still
open on it until the last one is closed.

Reproducible: the seed is in the test id (`test_fuse_model[cdc4k-seed2]`). On a failure
the message has the seed, the failing operation and the last operations. Rerun one case
with more or fewer operations with, e.g.,
`MOSAFS_MODEL_SEED=7 MOSAFS_MODEL_OPS=5000 pytest tests/fuse/test_fuse_model.py`.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

KiB = 1 << 10
MiB = 1 << 20

CHUNKERS = {
    "default": (),
    "cdc4k": ("--chunker", "cdc:4096:16384:65536"),
}
SEEDS = ([int(os.environ["MOSAFS_MODEL_SEED"])] if os.environ.get("MOSAFS_MODEL_SEED")
         else [1, 2])
OPS = int(os.environ.get("MOSAFS_MODEL_OPS", "1500"))
MAX_SIZE = 3 * MiB  # files stay below this (every op still crosses many 16 KiB chunks)
MAX_FDS = 8
NAMES = ["a", "b", "c", "d/e", "d/f", "d/g"]
TAIL = int(os.environ.get("MOSAFS_MODEL_TAIL", "40"))  # operations shown on a failure
# Diagnosis only: MOSAFS_MODEL_ORPHANS=0 never unlinks or renames over a file that is open,
# to tell failures of unlinked-but-open files from the rest.
ORPHANS = os.environ.get("MOSAFS_MODEL_ORPHANS", "1") != "0"


@dataclass(eq=False)
class MFile:
    """One file (an inode) of the model."""

    label: str
    data: bytearray = field(default_factory=bytearray)


@dataclass(eq=False)
class MFd:
    fd: int
    file: MFile
    readable: bool
    writable: bool
    append: bool

    def __str__(self) -> str:
        mode = ("r" if self.readable else "") + ("w" if self.writable else "") + (
            "a" if self.append else "")
        return f"fd{self.fd}({self.file.label},{mode})"


def first_difference(got: bytes, want: bytes) -> str:
    n = min(len(got), len(want))
    at = next((i for i in range(n) if got[i] != want[i]), n)
    return (f"got {len(got)} bytes, expected {len(want)}; first difference at +{at}: "
            f"got {got[at:at + 16].hex()} expected {want[at:at + 16].hex()}")


class Model:
    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.names: dict[str, MFile] = {}
        self.fds: list[MFd] = []
        self.log: collections.deque[str] = collections.deque(maxlen=TAIL)
        self.step = 0
        self._serial = 0

    # -- helpers ---------------------------------------------------------------------------

    def path(self, name: str) -> Path:
        return self.root / name

    def note(self, text: str) -> None:
        self.log.append(f"#{self.step} {text}")

    def new_file(self) -> MFile:
        self._serial += 1
        return MFile(f"F{self._serial}")

    def where(self, f: MFile) -> str:
        names = [n for n, g in self.names.items() if g is f]
        return names[0] if names else "<unlinked>"

    def random_bytes(self, n: int) -> bytes:
        return self.rng.randbytes(n)

    def size(self) -> int:
        """A write or read size: mostly small or around a chunk, sometimes large."""
        r = self.rng.random()
        if r < 0.3:
            return self.rng.randint(1, 300)
        if r < 0.8:
            return self.rng.randint(1, 80 * KiB)
        return self.rng.randint(80 * KiB, 768 * KiB)

    def offset(self, length: int) -> int:
        r = self.rng.random()
        if r < 0.5 or length == 0:
            return self.rng.randint(0, length)  # inside (or at EOF)
        if r < 0.75:
            return length  # at EOF
        return length + self.rng.randint(1, 300 * KiB)  # beyond EOF: a hole

    def check(self, got: bytes, want: bytes | bytearray, what: str) -> None:
        if got != want:
            raise AssertionError(f"{what}: {first_difference(got, bytes(want))}")

    @staticmethod
    def check_size(got: int, want: int, what: str) -> None:
        if got != want:
            raise AssertionError(f"{what}: {got}, expected {want}")

    def pick_fd(self, *, readable: bool = False, writable: bool = False,
                append: bool | None = None) -> MFd | None:
        choices = [d for d in self.fds if (d.readable or not readable)
                   and (d.writable or not writable)
                   and (append is None or d.append == append)]
        return self.rng.choice(choices) if choices else None

    def drop_name(self, name: str) -> None:
        self.names.pop(name, None)

    def is_open(self, name: str) -> bool:
        return name in self.names and any(d.file is self.names[name] for d in self.fds)

    # -- operations ------------------------------------------------------------------------

    def op_open(self) -> None:
        if len(self.fds) >= MAX_FDS:
            return self.op_close()
        name = self.rng.choice(NAMES)
        exists = name in self.names
        acc = self.rng.choice([os.O_RDONLY, os.O_WRONLY, os.O_RDWR, os.O_RDWR])
        flags = acc
        append = acc != os.O_RDONLY and self.rng.random() < 0.25
        if append:
            flags |= os.O_APPEND
        trunc = acc != os.O_RDONLY and self.rng.random() < 0.12
        if trunc:
            flags |= os.O_TRUNC
        if not exists:
            if acc == os.O_RDONLY:
                flags = os.O_RDWR | (flags & os.O_APPEND)
                acc = os.O_RDWR
            flags |= os.O_CREAT | (os.O_EXCL if self.rng.random() < 0.5 else 0)
        self.note(f"open {name} flags={flags:#o}{' (new)' if not exists else ''}")
        fd = os.open(self.path(name), flags, 0o644)
        if not exists:
            self.names[name] = self.new_file()
        f = self.names[name]
        if trunc:
            del f.data[:]
        d = MFd(fd, f, readable=acc != os.O_WRONLY, writable=acc != os.O_RDONLY,
                append=append)
        self.fds.append(d)
        self.note(f"  -> {d} at {name}")

    def op_close(self) -> None:
        d = self.pick_fd()
        if d is None:
            return None
        self.note(f"close {d}")
        os.close(d.fd)
        self.fds.remove(d)
        return None

    def op_pwrite(self) -> None:
        d = self.pick_fd(writable=True, append=False)
        if d is None:
            return self.op_open()
        data = d.file.data
        off = self.offset(len(data))
        n = min(self.size(), MAX_SIZE - off)
        if n <= 0:
            return self.op_ftruncate()
        buf = self.random_bytes(n)
        self.note(f"pwrite {d} off={off} n={n} (size {len(data)})")
        self.check_size(os.pwrite(d.fd, buf, off), n, "bytes written")
        if off > len(data):
            data.extend(bytes(off - len(data)))
        data[off:off + n] = buf
        return None

    def op_append(self) -> None:
        d = self.pick_fd(writable=True, append=True)
        if d is None:
            return self.op_open()
        data = d.file.data
        n = min(self.size(), MAX_SIZE - len(data))
        if n <= 0:
            return self.op_ftruncate()
        buf = self.random_bytes(n)
        self.note(f"append {d} n={n} (size {len(data)})")
        self.check_size(os.write(d.fd, buf), n, "bytes written")
        data.extend(buf)
        return None

    def op_pread(self) -> None:
        d = self.pick_fd(readable=True)
        if d is None:
            return self.op_open()
        data = d.file.data
        r = self.rng.random()
        if r < 0.2 and data:
            off = max(0, len(data) - self.rng.randint(1, 100 * KiB))  # across EOF
        elif r < 0.3:
            off = len(data) + self.rng.randint(0, 10 * KiB)  # at or past EOF
        else:
            off = self.rng.randint(0, len(data))
        n = self.size()
        self.note(f"pread {d} off={off} n={n} (size {len(data)})")
        self.check(os.pread(d.fd, n, off), data[off:off + n],
                   f"pread {d} off={off} n={n}")
        return None

    def op_fstat(self) -> None:
        d = self.pick_fd()
        if d is None:
            return None
        self.note(f"fstat {d}")
        self.check_size(os.fstat(d.fd).st_size, len(d.file.data), f"fstat {d}")
        return None

    def op_read_path(self) -> None:
        if not self.names:
            return self.op_open()
        name = self.rng.choice(sorted(self.names))
        f = self.names[name]
        self.note(f"read whole {name} ({f.label}, size {len(f.data)})")
        self.check_size(os.stat(self.path(name)).st_size, len(f.data), f"stat {name}")
        self.check(self.path(name).read_bytes(), f.data, f"read whole {name}")
        return None

    def op_truncate(self) -> None:
        if not self.names:
            return self.op_open()
        name = self.rng.choice(sorted(self.names))
        f = self.names[name]
        size = self.new_size(len(f.data))
        self.note(f"truncate {name} ({f.label}) {len(f.data)} -> {size}")
        os.truncate(self.path(name), size)
        self.resize(f, size)
        return None

    def op_ftruncate(self) -> None:
        d = self.pick_fd(writable=True)
        if d is None:
            return self.op_truncate()
        size = self.new_size(len(d.file.data))
        self.note(f"ftruncate {d} {len(d.file.data)} -> {size}")
        os.ftruncate(d.fd, size)
        self.resize(d.file, size)
        return None

    def new_size(self, length: int) -> int:
        r = self.rng.random()
        if r < 0.1:
            return 0
        if r < 0.55:
            return self.rng.randint(0, length)  # down
        return min(MAX_SIZE, length + self.rng.randint(1, 400 * KiB))  # up: a hole

    @staticmethod
    def resize(f: MFile, size: int) -> None:
        if size < len(f.data):
            del f.data[size:]
        else:
            f.data.extend(bytes(size - len(f.data)))

    def op_rename(self) -> None:
        if not self.names:
            return self.op_open()
        src = self.rng.choice(sorted(self.names))
        dst = self.rng.choice([n for n in NAMES if n != src])
        if not ORPHANS and self.is_open(dst):
            return None
        self.note(f"rename {src} ({self.names[src].label}) -> {dst}"
                  + (f" (replacing {self.names[dst].label})" if dst in self.names else ""))
        os.rename(self.path(src), self.path(dst))
        self.names[dst] = self.names.pop(src)
        return None

    def op_unlink(self) -> None:
        if not self.names:
            return self.op_open()
        name = self.rng.choice(sorted(self.names))
        f = self.names[name]
        if not ORPHANS and self.is_open(name):
            return None
        still = [str(d) for d in self.fds if d.file is f]
        self.note(f"unlink {name} ({f.label}); open: {', '.join(still) or 'none'}")
        os.unlink(self.path(name))
        self.drop_name(name)
        return None

    def op_fsync(self) -> None:
        d = self.pick_fd()
        if d is None:
            return None
        self.note(f"fsync {d}")
        os.fsync(d.fd)
        return None

    def op_listdir(self) -> None:
        self.note("listdir")
        top = sorted(n for n in os.listdir(self.root) if n != "d")
        sub = sorted(os.listdir(self.root / "d"))
        want_top = sorted(n for n in self.names if "/" not in n)
        want_sub = sorted(n[2:] for n in self.names if n.startswith("d/"))
        if (top, sub) != (want_top, want_sub):
            raise AssertionError(f"listdir: {top, sub} != {want_top, want_sub}")

    OPS = [  # (operation, weight)
        ("op_open", 10), ("op_close", 8), ("op_pwrite", 20), ("op_append", 8),
        ("op_pread", 22), ("op_fstat", 4), ("op_read_path", 4), ("op_truncate", 4),
        ("op_ftruncate", 4), ("op_rename", 4), ("op_unlink", 3), ("op_fsync", 4),
        ("op_listdir", 1),
    ]

    def run(self, count: int) -> None:
        names = [n for n, _ in self.OPS]
        weights = [w for _, w in self.OPS]
        for self.step in range(count):
            getattr(self, self.rng.choices(names, weights)[0])()

    def close_all(self) -> None:
        while self.fds:
            d = self.fds.pop()
            self.note(f"close {d}")
            os.close(d.fd)

    def verify_all(self, root: Path, when: str) -> None:
        self.root = root
        self.note(f"verify every file ({when})")
        self.op_listdir()
        for name, f in sorted(self.names.items()):
            self.check(self.path(name).read_bytes(), f.data, f"{when}: {name} ({f.label})")


@pytest.mark.parametrize("seed", [pytest.param(s, id=f"seed{s}") for s in SEEDS])
@pytest.mark.parametrize("chunker", list(CHUNKERS))
def test_fuse_model(start_cluster, chunker: str, seed: int) -> None:
    cluster = start_cluster(*CHUNKERS[chunker])
    model = Model(cluster.mountpoint, seed)
    (cluster.mountpoint / "d").mkdir()

    def failed(exc: BaseException, phase: str) -> AssertionError:
        tail = "\n".join(model.log)
        return AssertionError(
            f"model test failed ({phase}): chunker={chunker} seed={seed} at op #{model.step}:"
            f" {exc!r}\nlast operations:\n{tail}\n"
            f"rerun: MOSAFS_MODEL_SEED={seed} MOSAFS_MODEL_OPS={OPS} pytest "
            f"'tests/fuse/test_fuse_model.py::test_fuse_model[{chunker}-seed{seed}]'")

    try:
        model.run(OPS)
        model.close_all()
        model.verify_all(cluster.mountpoint, "after closing every descriptor")
    except (AssertionError, OSError) as exc:
        for d in model.fds:
            with contextlib.suppress(OSError):
                os.close(d.fd)
        raise failed(exc, "random operations") from exc

    cluster.stop()
    again = start_cluster(*CHUNKERS[chunker], data_dir=cluster.data_dir, name="up-again")
    try:
        model.verify_all(again.mountpoint, "after a restart")
    except (AssertionError, OSError) as exc:
        raise failed(exc, "after restart") from exc
