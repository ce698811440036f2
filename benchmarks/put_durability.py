"""How a group of chunk puts could be made durable, on this machine's disk: the benefactor's
way (each blob written, fsynced, renamed, its directory fsynced; in parallel threads)
against batched alternatives, in MiB/s of blobs stored.

    python benchmarks/put_durability.py [--stores 3] [--mib 683] [--group 8] [--dir /tmp]

Modes, each over STORES stores (one thread each, as benefactors on one host) of MIB blobs
of 1 MiB, put in groups of GROUP blobs (8 worker threads per store):
- file: the benefactor's ChunkStore.put (write, fsync, rename, fsync the directory);
- syncfs: a group's blobs written, one syncfs, renamed, one syncfs;
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

MiB = 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)
BLOBS = [os.urandom(MiB) for _ in range(16)]


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def syncfs(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc.syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), "syncfs")
    finally:
        os.close(fd)


class Store:
    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(f"{root}/tmp")
        for i in range(256):
            os.makedirs(f"{root}/chunks/{i:02x}")

    def tmp(self, i: int) -> str:
        return f"{self.root}/tmp/{i}"

    def final(self, i: int) -> str:
        return f"{self.root}/chunks/{i % 256:02x}/{i}"

    def write(self, i: int, sync: bool) -> None:
        with open(self.tmp(i), "xb") as f:
            f.write(BLOBS[i % len(BLOBS)])
            if sync:
                f.flush()
                os.fsync(f.fileno())


def put_file(store: Store, ids: list[int], pool: ThreadPoolExecutor) -> None:
    def one(i: int) -> None:
        store.write(i, sync=True)
        os.replace(store.tmp(i), store.final(i))
        fsync_dir(os.path.dirname(store.final(i)))
    list(pool.map(one, ids))


def put_syncfs(store: Store, ids: list[int], pool: ThreadPoolExecutor) -> None:
    list(pool.map(lambda i: store.write(i, sync=False), ids))
    syncfs(store.root)
    for i in ids:
        os.replace(store.tmp(i), store.final(i))
    syncfs(store.root)


def put_fdatasync(store: Store, ids: list[int], pool: ThreadPoolExecutor) -> None:
    def write(i: int) -> None:
        store.write(i, sync=False)
        fd = os.open(store.tmp(i), os.O_RDONLY)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
    list(pool.map(write, ids))
    for i in ids:
        os.replace(store.tmp(i), store.final(i))
    list(pool.map(fsync_dir, {os.path.dirname(store.final(i)) for i in ids}))


def put_nosync(store: Store, ids: list[int], pool: ThreadPoolExecutor) -> None:
    def one(i: int) -> None:
        store.write(i, sync=False)
        os.replace(store.tmp(i), store.final(i))
    list(pool.map(one, ids))


MODES: dict[str, Callable[[Store, list[int], ThreadPoolExecutor], None]] = {
    "file": put_file, "syncfs": put_syncfs, "fdatasync": put_fdatasync,
    "nosync": put_nosync}


def run(mode: str, stores: int, mib: int, group: int, parent: str) -> float:
    """MiB/s of blobs made durable (or not: nosync) by MODE."""
    root = tempfile.mkdtemp(prefix="put-durability-", dir=parent)
    try:
        made = [Store(f"{root}/s{n}") for n in range(stores)]
        os.sync()

        def feed(store: Store) -> None:
            with ThreadPoolExecutor(8) as pool:
                for start in range(0, mib, group):
                    MODES[mode](store, list(range(start, min(mib, start + group))), pool)

        started = time.perf_counter()
        threads = [threading.Thread(target=feed, args=(s,)) for s in made]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return stores * mib / (time.perf_counter() - started)
    finally:
        shutil.rmtree(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
