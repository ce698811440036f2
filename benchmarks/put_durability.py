"""How a group of chunk puts could be made durable, on this machine's disk: the benefactor's
own way (mosafs.benefactor.puts.Puts.group into a FileChunkStore: each blob verified,
written, fsynced, renamed, its directory fsynced; in parallel threads) against batched
alternatives, in MiB/s of blobs stored.

    .venv/bin/python benchmarks/put_durability.py [--stores 3] [--mib 683] [--group 8]
        [--dir /tmp]   (PYTHONPATH=. python3 ... where mosafs is not installed)

Modes, each over STORES stores (one thread each, as benefactors on one host) of MIB
distinct blobs of 1 MiB, put in groups of GROUP blobs; every mode verifies each blob's
BLAKE3 id first, as a benefactor does:
- file: the benefactor's Puts.group (its THREADS threads);
- syncfs: a group's blobs written (8 threads), one syncfs, renamed, one syncfs;
- fdatasync: a group's blobs written, each fdatasynced, renamed, each directory fsynced
  once;
- nosync: written and renamed, nothing synced (the page cache's speed: not durable).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from mosafs import ids
from mosafs.benefactor.chunkstore import FileChunkStore
from mosafs.benefactor.puts import Outcome, Puts
from mosafs.procutil import fsync_dir
from mosafs.rpc.chunkwire import PutChunk

MiB = 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)
_BASE = os.urandom(MiB - 8)


def blob(n: int) -> PutChunk:
    """Blob N: 1 MiB, distinct from every other one, with its id."""
    data = n.to_bytes(8, "little") + _BASE
    return PutChunk(id=ids.chunk_id(data), data=data)


def syncfs(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc.syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), "syncfs")
    finally:
        os.close(fd)


class Files:
    """The file store's layout (DIR/tmp, DIR/chunks/ab/), for the batched modes."""

    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(f"{root}/tmp")
        for i in range(256):
            os.makedirs(f"{root}/chunks/{i:02x}")
        self.pool = ThreadPoolExecutor(8)

    def tmp(self, b: PutChunk) -> str:
        return f"{self.root}/tmp/{b.id.hex()}"

    def final(self, b: PutChunk) -> str:
        return f"{self.root}/chunks/{b.id[0]:02x}/{b.id.hex()}"

    def write(self, b: PutChunk) -> None:
        ids.verify(b.id, b.data)
        with open(self.tmp(b), "xb") as f:
            f.write(b.data)

    def close(self) -> None:
        self.pool.shutdown()


def put_syncfs(files: Files, blobs: list[PutChunk]) -> None:
    list(files.pool.map(files.write, blobs))
    syncfs(files.root)
    for b in blobs:
        os.replace(files.tmp(b), files.final(b))
    syncfs(files.root)


def put_fdatasync(files: Files, blobs: list[PutChunk]) -> None:
    def write(b: PutChunk) -> None:
        files.write(b)
        fd = os.open(files.tmp(b), os.O_RDONLY)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
    list(files.pool.map(write, blobs))
    for b in blobs:
        os.replace(files.tmp(b), files.final(b))
    list(files.pool.map(fsync_dir, {os.path.dirname(files.final(b)) for b in blobs}))


def put_nosync(files: Files, blobs: list[PutChunk]) -> None:
    def one(b: PutChunk) -> None:
        files.write(b)
        os.replace(files.tmp(b), files.final(b))
    list(files.pool.map(one, blobs))


BATCHED: dict[str, Callable[[Files, list[PutChunk]], None]] = {
    "syncfs": put_syncfs, "fdatasync": put_fdatasync, "nosync": put_nosync}
MODES = ("file", *BATCHED)


def feeder(mode: str, root: str) -> tuple[Callable[[list[PutChunk]], None], Callable[[], None]]:
    """(put a group, close) for MODE in ROOT."""
    if mode == "file":
        store = FileChunkStore(root)
        puts = Puts(store)

        def close() -> None:
            puts.close()
            store.close()
        return lambda group: _checked(puts.group(group)), close
    files = Files(root)
    return lambda group: BATCHED[mode](files, group), files.close


def _checked(outcomes: list[Outcome]) -> None:
    refused = [o.error for o in outcomes if o.error is not None]
    if refused:
        raise RuntimeError(f"a put was refused: {refused[0]}")


def run(mode: str, stores: int, mib: int, group: int, parent: str) -> float:
    """MiB/s of blobs made durable (or not: nosync) by MODE."""
    root = tempfile.mkdtemp(prefix="put-durability-", dir=parent)
    try:
        blobs = [[blob(n * mib + i) for i in range(mib)] for n in range(stores)]
        feeders = [feeder(mode, f"{root}/s{n}") for n in range(stores)]
        os.sync()

        def feed(n: int) -> None:
            put = feeders[n][0]
            for start in range(0, mib, group):
                put(blobs[n][start:start + group])

        started = time.perf_counter()
        threads = [threading.Thread(target=feed, args=(n,)) for n in range(stores)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rate = stores * mib / (time.perf_counter() - started)
        for _, close in feeders:
            close()
        return rate
    finally:
        shutil.rmtree(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--stores", type=int, default=3)
    parser.add_argument("--mib", type=int, default=683)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for _ in range(args.rounds):
        for mode in MODES:
            rate = run(mode, args.stores, args.mib, args.group, args.dir)
            print(f"{mode:>10}: {rate:7.0f} MiB/s ({args.stores} stores x {args.mib} MiB, "
                  f"groups of {args.group})", flush=True)


if __name__ == "__main__":
    main()
