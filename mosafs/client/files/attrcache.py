"""The client's metadata caches: attributes by inode, names by (parent, name), directory
listings. Every change this mount makes updates or drops what it touches, so this mount
always sees its own changes at once. Other mounts' changes:

- while the cache is coherent (mosafs.client.files.coherence: the manager lists every
  change since the mount last asked, a few times a second), an entry lives for the
  coherent timeout, and what the manager lists is dropped (`invalidate`); an answer about
  an inode or name of which a change was listed while the answer was on its way is kept
  for the attribute timeout only, since it may be from before that change;
- otherwise entries live for the attribute timeout, and other mounts' changes are seen
  within it.

The kernel is told an entry's remaining life (FUSE entry and attribute timeouts). A
file's version is revalidated on every open (close-to-open), see FileSystem.open.

Directories known whole: while the cache is coherent, a directory this mount made knows
every name in it (its own creates add them; anything else that changes a name in it,
here or listed by the manager, or a client beside the mount that resolves it, forgets the
directory as whole), so a lookup of a name it does not hold is answered "no such file"
without asking the manager (`absent`): a create is then one manager call, not two
(docs/client.md, "Coherent caches").

Listings fetched while this mount changes names: a listing (a readdir's pages after the
first, or stat-ahead's) is fetched in the background, and a name this mount renamed or
removed in that directory meanwhile would come back with it (git's lock files: a
`config.lock` renamed to `config`, then found again by the next `open(O_EXCL)` of
`config.lock`, which failed with EEXIST). Each name changed here counts as an edit of its
directory (`edits`); a listing whose directory was edited after its fetch began is not
cached.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, NamedTuple, TypeVar

from mosafs._proto import manager_pb2 as mpb

K = TypeVar("K")
V = TypeVar("V")

MAX_ENTRIES = 100_000
# Entries of one listing whose names and attributes are cached one by one: the kernel has
# every entry's attributes from the listing (readdirplus) for its entry timeout anyway,
# and inserting 100,000 of them into the TTL caches was half the mount's CPU of an
# `ls -l` of that directory (py-spy, docs/benchmarks.md, "Metadata").
LISTING_ENTRIES = 10_000
RECENT = 64  # change lists remembered for answers still on their way (5 per second come)
# Directories known whole at once, and the names all of them may hold together (about
# 100 MB at most). One directory may hold them all: a checkpoint step's directory, where
# every rank creates its files, is the one that needs it (at 4,096 names per directory,
# 8 processes creating 16,000 files in one directory asked the manager about 3 names in
# 4; docs/benchmarks.md, "A shared directory known whole"). A directory that does not
# fit is no longer known whole, and its missing names are asked of the manager.
WHOLE_DIRS = 256
WHOLE_NAMES = 1 << 20
EDITED_DIRS = 4096  # directories whose last edit is remembered (then all are forgotten)


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

    def put(self, key: K, value: V, ttl: float) -> bool:
        """Hold VALUE for KEY for TTL seconds; whether it is held (always, here)."""
        if len(self._data) >= self._maxsize and key not in self._data:
            self._data.clear()
        self._data[key] = (value, self._timer() + ttl)
        return True

    def left(self, key: K) -> float:
        """Seconds KEY has left (0: not held)."""
        item = self._data.get(key)
        return max(0.0, item[1] - self._timer()) if item is not None else 0.0

    def clear(self) -> None:
        self._data.clear()

    def get(self, key: K) -> V | None:
        item = self._data.get(key)
        if item is None:
            return None
        if self._timer() >= item[1]:
            self.pop(key)
            return None
        return item[0]

    def __setitem__(self, key: K, value: V) -> None:
        self.put(key, value, self._ttl)

    def pop(self, key: K, default: V | None = None) -> V | None:
        item = self._data.pop(key, None)
        return default if item is None else item[0]

    def __len__(self) -> int:
        return len(self._data)


class WholeDirs(TtlDict[int, set[str]]):
    """Directories known whole: inode -> every name in it, at most MAX_DIRS of them and
    MAX_NAMES names together; where they do not fit, the directories held longest go
    first. A set is owned here while held: the caller takes it out (`pop`) before it adds
    a name, and puts it back."""

    def __init__(self, max_dirs: int, max_names: int,
                 timer: Callable[[], float] = time.monotonic) -> None:
        super().__init__(max_dirs, 0.0, timer)
        self._max_names = max_names
        self.names = 0  # held in all sets together

    def put(self, key: int, value: set[str], ttl: float) -> bool:
        """False (nothing held) if VALUE alone is more than MAX_NAMES."""
        self.pop(key)
        if len(value) > self._max_names:
            return False
        while self._data and (len(self._data) >= self._maxsize or
                              self.names + len(value) > self._max_names):
            self.pop(next(iter(self._data)))
        self._data[key] = (value, self._timer() + ttl)
        self.names += len(value)
        return True

    def pop(self, key: int, default: set[str] | None = None) -> set[str] | None:
        item = self._data.pop(key, None)
        if item is None:
            return default
        self.names -= len(item[0])
        return item[0]

    def clear(self) -> None:
        super().clear()
        self.names = 0


class Mark(NamedTuple):
    """Where the cache stood when a listing's fetch began (`AttrCache.mark`): the change
    lists taken (generation) and the names changed (edits)."""

    generation: int
    edits: int


class AttrCache:
    """TTL: the attribute timeout; COHERENT_TTL: an entry's life while the cache is
    coherent (`coherent` says whether it is now; set by mosafs.client.files.coherence)."""

    def __init__(self, ttl: float, coherent_ttl: float | None = None,
                 timer: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.coherent_ttl = ttl if coherent_ttl is None else max(ttl, coherent_ttl)
        self.coherent: Callable[[], bool] = lambda: False
        # Counts the change lists taken: an answer asked for at generation G is kept long
        # only if no list taken since G named what it is about (`since`). The lists of the
        # last RECENT generations are kept for that; an older G is kept short.
        self.generation = 0
        self._recent: deque[tuple[int, frozenset[int], frozenset[tuple[int, str]]]] = deque()
        self._attrs: TtlDict[int, mpb.Attr] = TtlDict(MAX_ENTRIES, ttl, timer)
        self._names: TtlDict[tuple[int, str], int] = TtlDict(MAX_ENTRIES, ttl, timer)
        self._listings: TtlDict[int, list[mpb.DirEntry]] = TtlDict(MAX_ENTRIES // 10, ttl,
                                                                  timer)
        # Directory -> every name in it, for directories known whole (the module's doc).
        self._whole = WholeDirs(WHOLE_DIRS, WHOLE_NAMES, timer)
        # Inodes with open handles keep their newest attributes without expiry: a file
        # unlinked while open still has attributes until its last close.
        self._pinned: dict[int, mpb.Attr] = {}
        # Names changed (module docstring): a count, each directory's count at its last
        # change, and the count below which that is forgotten.
        self.edits = 0
        self._edited: dict[int, int] = {}
        self._edits_forgotten = 0

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

    def forget_whole(self, inode: int) -> None:
        """Directory INODE may get names this mount does not make: not known whole."""
        self._whole.pop(inode)

    def absent(self, parent: int, name: str) -> bool:
        """Whether NAME is known not to be in PARENT (a directory known whole, while the
        cache is coherent: the lease may lapse before the cache is cleared)."""
        names = self._whole.get(parent)
        return names is not None and name not in names and self.coherent()

    def life(self, since: int | None, inode: int = 0, name: tuple[int, str] | None = None,
             parent: int = 0) -> float:
        """How long an answer asked for at generation SINCE lives (None: one this mount's
        own change made, which the manager lists to others, not to it): about INODE, the
        name NAME, or the names in directory PARENT."""
        if not self.coherent():
            return self.ttl
        if since is None or since == self.generation:
            return self.coherent_ttl
        if not self._recent or since < self._recent[0][0] - 1:
            return self.ttl  # older than what is kept: it may have missed anything
        for gen, inodes, names in self._recent:
            if gen > since and (inode in inodes or name in names or parent in inodes or
                                (parent and any(p == parent for p, _ in names))):
                return self.ttl
        return self.coherent_ttl

    def left(self, inode: int) -> float:
        """Seconds INODE's attributes have left here (0: none cached)."""
        return self._attrs.left(inode)

    def put(self, attr: mpb.Attr, since: int | None = None) -> mpb.Attr:
        self._attrs.put(attr.inode, attr, self.life(since, attr.inode))
        if attr.inode in self._pinned:
            self._pinned[attr.inode] = attr
        return attr

    def put_entry(self, parent: int, name: str, attr: mpb.Attr,
                  since: int | None = None) -> mpb.Attr:
        key = (parent, name)
        self._names.put(key, attr.inode, self.life(since, attr.inode, key))
        return self.put(attr, since)

    def mark(self) -> Mark:
        """Where the cache stands now: taken before a listing is asked for, and given back
        with it to put_listing or put_entries."""
        return Mark(self.generation, self.edits)

    def put_listing(self, inode: int, entries: list[mpb.DirEntry], mark: Mark) -> None:
        """The listing of directory INODE, asked for at MARK, and the names and attributes
        of its first LISTING_ENTRIES entries; nothing if a name in INODE changed here
        since (module docstring). The listing itself lives for the attribute timeout
        only: it holds its entries' attributes, and a change list names a changed inode,
        not the directories whose listings hold it (the names and attributes cached one
        by one are dropped by inode and name)."""
        if self.edited_since(inode, mark.edits):
            return
        self._listings.put(inode, entries, self.ttl)
        self._put_entries(inode, entries, mark.generation)

    def put_entries(self, inode: int, entries: list[mpb.DirEntry], mark: Mark) -> None:
        """The names and attributes of the first LISTING_ENTRIES of ENTRIES, entries of
        directory INODE asked for at MARK (a listing's first pages); nothing if a name in
        INODE changed here since."""
        if not self.edited_since(inode, mark.edits):
            self._put_entries(inode, entries, mark.generation)

    def _put_entries(self, inode: int, entries: list[mpb.DirEntry], since: int) -> None:
        """Attributes cached already stay: they are as valid, and may be newer (this
        mount's own change since the page was read)."""
        life = self.life(since, parent=inode)
        attrs = self._attrs
        for entry in entries[:LISTING_ENTRIES]:
            self._names.put((inode, entry.name), entry.attr.inode, life)
            if attrs.get(entry.attr.inode) is None:
                attrs.put(entry.attr.inode, entry.attr, life)

    def invalidate(self, inodes: Iterable[int], names: Iterable[tuple[int, str]]) -> None:
        """Another mount, or the manager, changed INODES' attributes and NAMES."""
        inodes, names = frozenset(inodes), frozenset(names)
        self.generation += 1
        self._recent.append((self.generation, inodes, names))
        while len(self._recent) > RECENT:
            self._recent.popleft()
        for inode in inodes:
            self._attrs.pop(inode, None)
            self._listings.pop(inode, None)
            self._whole.pop(inode)
        for parent, name in names:
            self.drop_entry(parent, name)

    def clear(self) -> None:
        """Forget everything but the pinned attributes (coherence lost, or a reset)."""
        self.generation += 1
        self._recent.clear()
        self._attrs.clear()
        self._names.clear()
        self._listings.clear()
        self._whole.clear()

    def drop(self, inode: int) -> None:
        self._attrs.pop(inode, None)

    def entry_made(self, parent: int, name: str, attr: mpb.Attr, *, subdir: bool,
                   since: int | None = None) -> mpb.Attr:
        """NAME in PARENT was just made as ATTR (a create, mkdir, symlink, mknod or link).
        The manager set the parent's mtime and ctime to ATTR's ctime in the same
        transaction (and one more link for a SUBDIR), so a cached copy of the parent is
        brought up to date rather than dropped: the kernel, which drops its own copy
        after a create, asks again at its next path walk, and that need not be a manager
        call. An ATTR no newer than the
        copy (a create that found the file there, which changes nothing) drops it as
        drop_entry does."""
        parent_attr = self._attrs.get(parent)
        whole = self._whole.get(parent)
        self.drop_entry(parent, name)  # forgets PARENT as whole: known again just below
        if whole is not None:
            whole.add(name)
            self._known_whole(parent, whole, since)
        if subdir:
            self._known_whole(attr.inode, set(), since)
        if parent_attr is not None and \
                attr.ctime_ns > max(parent_attr.mtime_ns, parent_attr.ctime_ns):
            updated = mpb.Attr()
            updated.CopyFrom(parent_attr)
            updated.mtime_ns = updated.ctime_ns = attr.ctime_ns
            updated.nlink += int(subdir)
            self._attrs.put(parent, updated, self.life(since, parent))
        return self.put_entry(parent, name, attr, since)

    def _known_whole(self, inode: int, names: set[str], since: int | None) -> None:
        """Directory INODE holds NAMES. It is known whole only while the cache is coherent,
        no change list since SINCE named anything in it (a name made by another mount
        could be missing) and the names fit (WholeDirs)."""
        life = self.life(since, inode, parent=inode)
        if life > self.ttl:
            self._whole.put(inode, names, life)

    def edited_since(self, directory: int, edits: int) -> bool:
        """Whether a name in DIRECTORY changed after the edit count was EDITS (or may
        have: that far back is forgotten)."""
        if edits == self.edits:
            return False  # no name changed anywhere since
        return edits < self._edits_forgotten or self._edited.get(directory, -1) > edits

    def drop_entry(self, parent: int, name: str) -> None:
        """A name changed in PARENT: forget the name, its inode's attributes (nlink and
        ctime change), the listing and the parent's attributes (mtime, nlink), and that
        PARENT is known whole (what the change was, and whether it happened, is not
        known here: a name may have come or gone); count it as an edit of PARENT."""
        self.edits += 1
        if len(self._edited) >= EDITED_DIRS and parent not in self._edited:
            self._edited.clear()
            self._edits_forgotten = self.edits
        self._edited[parent] = self.edits
        child = self._names.pop((parent, name), None)
        if child is not None:
            self._attrs.pop(child, None)
        self._whole.pop(parent)
        self._listings.pop(parent, None)
        self._attrs.pop(parent, None)
