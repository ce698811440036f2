"""Helpers of the manager's unit tests: a test clock, chunk ids, and one-call versions of
registering a benefactor, creating a file and committing a write session (the fixtures that
use them are in conftest.py)."""

from __future__ import annotations

import time

from mosafs._proto import benefactor_pb2
from mosafs.ids import chunk_id
from mosafs.manager.core import Manager, ManagerConfig
from mosafs.manager.metadata import ROOT_INODE, MetadataStore, schema

MiB = 1 << 20
# The kinds of inode, by short names.
DIR, REG, LNK = schema.DIRECTORY, schema.REGULAR, schema.SYMLINK
FIFO, SOCK, BLK, CHR = schema.FIFO, schema.SOCKET, schema.BLOCK_DEVICE, schema.CHAR_DEVICE


class Wall:
    """A wall clock in ns (garbage collection's), moved by hand."""

    def __init__(self) -> None:
        self.ns = time.time_ns()

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cid(n: int) -> bytes:
    return chunk_id(f"chunk {n}".encode())


def register(mgr: Manager, bid: str, *, free: int = 10**12, capacity: int = 2 * 10**12,
             port: int = 7000) -> None:
    mgr.registry.register(benefactor_pb2.BenefactorInfo(
        id=bid, address=f"127.0.0.1:{port}", capacity_bytes=capacity, free_bytes=free))


def two_benefactors(store: MetadataStore, *, gc_grace_s: float) -> Manager:
    """A manager on STORE with a test clock and two registered benefactors, b1 and b2, as
    the garbage-collection tests start from."""
    mgr = Manager(store, ManagerConfig(gc_grace_s=gc_grace_s), clock=Clock())
    register(mgr, "b1")
    register(mgr, "b2", port=7001)
    return mgr


def new_file(store: MetadataStore, name: str, parent: int = ROOT_INODE) -> int:
    return store.create(parent, name, 0o644).inode


def commit(mgr: Manager, inode: int, chunks: list[tuple[bytes, int]],
           place_on: str = "b1") -> int:
    """One write session: open, place every chunk the index lacks on PLACE_ON, commit."""
    lease = mgr.open_write(inode, "test")
    missing = [c for c, _ in chunks if mgr.store.chunk(c) is None]
    version, _ = mgr.commit_version(lease.lease_id, inode, chunks,
                                    [(c, [place_on]) for c in missing])
    return version


def refcount(store: MetadataStore, c: bytes) -> int:
    rec = store.chunk(c)
    assert rec is not None
    return rec.refcount


def consistent(store: MetadataStore) -> bool:
    """Every invariant the store can check over itself holds."""
    return (store.refcount_mismatches() == {} and store.nlink_mismatches() == {}
            and store.xattr_orphans() == [])
