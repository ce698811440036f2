"""The client's metadata caches: attributes by inode, names by (parent, name), directory
listings. Entries live for the attribute timeout (what the kernel is told too), and every
change this mount makes updates or drops what it touches, so this mount always sees its own
changes at once and other mounts' changes within the timeout. A file's version is
revalidated on every open (close-to-open), see FileSystem.open.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

from mosafs._proto import manager_pb2 as mpb

K = TypeVar("K")
V = TypeVar("V")

MAX_ENTRIES = 100_000
# Entries of one listing whose names and attributes are cached one by one: the kernel has
# every entry's attributes from the listing (readdirplus) for its entry timeout anyway,
# and inserting 100,000 of them into the TTL caches was half the mount's CPU of an
# `ls -l` of that directory (py-spy, docs/benchmarks.md, "Metadata").
LISTING_ENTRIES = 10_000


class TtlDict(Generic[K, V]):
    """A dict whose entries live TTL seconds, holding at most MAXSIZE: past it, it is
    emptied (entries live about a second, so it refills at once). cachetools' TTLCache
    kept a time-ordered link and an LRU order per entry: a get cost about 1 us and a put
    several, a sixth of the mount's CPU in a listing of 100,000 entries (py-spy,
    docs/benchmarks.md "Metadata"). Single-threaded, as the mount's trio loop is."""

    def __init__(self, maxsize: int, ttl: float,
                 timer: Callable[[], float] = time.monotonic) -> None:
        self._data: dict[K, tuple[V, float]] = {}
        self._maxsize = maxsize
        self._ttl = ttl
        self._timer = timer

    def get(self, key: K) -> V | None:
        item = self._data.get(key)
        if item is None:
            return None
        if self._timer() >= item[1]:
            del self._data[key]
            return None
        return item[0]

    def __setitem__(self, key: K, value: V) -> None:
        if len(self._data) >= self._maxsize and key not in self._data:
            self._data.clear()
        self._data[key] = (value, self._timer() + self._ttl)

    def pop(self, key: K, default: V | None = None) -> V | None:
        item = self._data.pop(key, None)
        return default if item is None else item[0]

    def __len__(self) -> int:
        return len(self._data)


class AttrCache:
    def __init__(self, ttl: float) -> None:
        self._attrs: TtlDict[int, mpb.Attr] = TtlDict(MAX_ENTRIES, ttl)
        self._names: TtlDict[tuple[int, str], int] = TtlDict(MAX_ENTRIES, ttl)
        self._listings: TtlDict[int, list[mpb.DirEntry]] = TtlDict(MAX_ENTRIES // 10, ttl)
        # Inodes with open handles keep their newest attributes without expiry: a file
        # unlinked while open still has attributes until its last close.
        self._pinned: dict[int, mpb.Attr] = {}

    def pin(self, inode: int, attr: mpb.Attr) -> None:
        self._pinned.setdefault(inode, attr)

    def unpin(self, inode: int) -> None:
        self._pinned.pop(inode, None)

    def last(self, inode: int) -> mpb.Attr | None:
        """The newest attributes seen of a pinned inode, however old."""
        return self._pinned.get(inode)

    def attr(self, inode: int) -> mpb.Attr | None:
        return self._attrs.get(inode)

    def child(self, parent: int, name: str) -> int | None:
        return self._names.get((parent, name))

    def listing(self, inode: int) -> list[mpb.DirEntry] | None:
        return self._listings.get(inode)

    def put(self, attr: mpb.Attr) -> mpb.Attr:
        self._attrs[attr.inode] = attr
        if attr.inode in self._pinned:
            self._pinned[attr.inode] = attr
        return attr

    def put_entry(self, parent: int, name: str, attr: mpb.Attr) -> mpb.Attr:
        self._names[(parent, name)] = attr.inode
        return self.put(attr)

    def put_listing(self, inode: int, entries: list[mpb.DirEntry]) -> None:
        """The listing of directory INODE, and the names and attributes of its first
        LISTING_ENTRIES entries."""
        self._listings[inode] = entries
        for entry in entries[:LISTING_ENTRIES]:
            self.put_entry(inode, entry.name, entry.attr)

    def drop(self, inode: int) -> None:
        self._attrs.pop(inode, None)

    def entry_made(self, parent: int, name: str, attr: mpb.Attr, *, subdir: bool) -> mpb.Attr:
        """NAME in PARENT was just made as ATTR (a create, mkdir, symlink, mknod or link).
        The manager set the parent's mtime and ctime to ATTR's ctime in the same
        transaction (and one more link for a SUBDIR), so a cached copy of the parent is
        brought up to date rather than dropped: the kernel, which drops its own copy
        after a create, asks again at its next path walk, and that need not be a manager
        call. An ATTR no newer than the
        copy (a create that found the file there, which changes nothing) drops it as
        drop_entry does."""
        parent_attr = self._attrs.get(parent)
        self.drop_entry(parent, name)
        if parent_attr is not None and \
                attr.ctime_ns > max(parent_attr.mtime_ns, parent_attr.ctime_ns):
            updated = mpb.Attr()
            updated.CopyFrom(parent_attr)
            updated.mtime_ns = updated.ctime_ns = attr.ctime_ns
            updated.nlink += int(subdir)
            self.put(updated)
        return self.put_entry(parent, name, attr)

    def drop_entry(self, parent: int, name: str) -> None:
        """A name changed in PARENT: forget the name, its inode's attributes (nlink and
        ctime change), the listing and the parent's attributes (mtime, nlink)."""
        child = self._names.pop((parent, name), None)
        if child is not None:
            self._attrs.pop(child, None)
        self._listings.pop(parent, None)
        self._attrs.pop(parent, None)
