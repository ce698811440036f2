"""The mount's attribute cache (mosafs.client.files.attrcache): a listing keeps all its
entries, and the names and attributes of its first LISTING_ENTRIES one by one (the kernel
has the others from the listing itself); entries live long only while the cache is
coherent, and an answer during which changes were listed lives the attribute timeout."""

from __future__ import annotations

import pytest

from mosafs._proto import manager_pb2 as mpb
from mosafs.client.files import attrcache
from mosafs.client.files.attrcache import AttrCache


def _entries(n: int) -> list[mpb.DirEntry]:
    return [mpb.DirEntry(name=f"f{i}", attr=mpb.Attr(inode=100 + i, size=i)) for i in range(n)]


def test_a_large_listing_caches_its_first_entries_one_by_one() -> None:
    cache = AttrCache(60.0)
    entries = _entries(attrcache.LISTING_ENTRIES + 5)
    cache.put_listing(7, entries, cache.mark())
    assert cache.listing(7) == entries  # the whole listing
    last = attrcache.LISTING_ENTRIES - 1
    assert cache.child(7, f"f{last}") == 100 + last
    kept = cache.attr(100 + last)
    assert kept is not None and kept.size == last
    assert cache.child(7, f"f{last + 1}") is None  # asked of the manager when needed
    assert cache.attr(100 + last + 1) is None


def test_a_small_listing_caches_every_entry() -> None:
    cache = AttrCache(60.0)
    cache.put_listing(7, _entries(3), cache.mark())
    assert [cache.child(7, f"f{i}") for i in range(3)] == [100, 101, 102]


def test_ttl_dict_expires_entries_and_empties_itself_when_full() -> None:
    from mosafs.client.files.attrcache import TtlDict

    now = [100.0]
    d: TtlDict[str, int] = TtlDict(3, 1.0, timer=lambda: now[0])
    d["a"] = 1
    now[0] += 0.5
    d["b"] = 2
    assert (d.get("a"), d.get("b")) == (1, 2)
    now[0] += 0.6  # a is 1.1 s old, b 0.6 s
    assert (d.get("a"), d.get("b")) == (None, 2)
    assert d.pop("b") == 2 and d.pop("b") is None and d.pop("x", 7) == 7
    for i, key in enumerate("cde"):
        d[key] = i
    d["c"] = 9  # a key it holds: no room needed
    assert len(d) == 3 and d.get("c") == 9
    d["f"] = 5  # full: emptied, then F
    assert len(d) == 1 and d.get("f") == 5 and d.get("c") is None


def test_entries_live_long_only_while_coherent_and_not_across_a_listed_change() -> None:
    now = [0.0]
    cache = AttrCache(1.0, 60.0, timer=lambda: now[0])
    coherent = [False]
    cache.coherent = lambda: coherent[0]
    cache.put_entry(1, "a", mpb.Attr(inode=10), cache.generation)
    assert cache.left(10) == 1.0  # not coherent: the attribute timeout
    coherent[0] = True
    cache.put_entry(1, "a", mpb.Attr(inode=10), cache.generation)
    assert cache.left(10) == 60.0
    asked = cache.generation
    cache.invalidate([11], [])  # a change listed while an answer about it was on its way
    cache.invalidate([99], [(1, "c")])  # and changes of others
    cache.put_entry(1, "b", mpb.Attr(inode=11), asked)
    assert cache.left(11) == 1.0
    cache.put_entry(1, "e", mpb.Attr(inode=12), asked)  # nothing listed of it
    assert cache.left(12) == 60.0
    cache.put_listing(1, [], cache.mark())  # lives 1 s, coherent or not
    assert cache.listing(1) is not None
    now[0] += 1.5
    assert cache.listing(1) is None and cache.attr(12) is not None
    now[0] -= 1.5
    now[0] += 2.0
    assert cache.child(1, "b") is None and cache.attr(11) is None
    assert cache.child(1, "a") == 10 and cache.attr(10) is not None


def test_invalidate_drops_the_inodes_the_names_and_their_directories() -> None:
    cache = AttrCache(60.0)
    cache.put_listing(7, _entries(3), cache.mark())
    cache.put(mpb.Attr(inode=7, nlink=2), cache.generation)
    cache.put(mpb.Attr(inode=55), cache.generation)
    cache.invalidate([101], [(7, "f2")])
    assert cache.attr(101) is None  # listed inode
    assert cache.child(7, "f2") is None and cache.attr(102) is None  # listed name
    assert cache.listing(7) is None and cache.attr(7) is None  # its directory
    assert cache.child(7, "f0") == 100 and cache.attr(55) is not None  # the rest stays
    cache.clear()
    assert cache.attr(55) is None and cache.child(7, "f0") is None


def _dir(inode: int) -> mpb.Attr:
    return mpb.Attr(inode=inode, kind=mpb.FILE_KIND_DIRECTORY, nlink=2)


def test_a_directory_this_mount_made_is_known_whole_while_coherent() -> None:
    """Its names are known: what it does not hold is absent, and the names this mount
    makes in it join it. Anything else that changes a name in it ends that."""
    now = [0.0]
    cache = AttrCache(1.0, 60.0, timer=lambda: now[0])
    coherent = [True]
    cache.coherent = lambda: coherent[0]
    cache.entry_made(1, "d", _dir(20), subdir=True, since=cache.generation)
    assert cache.absent(20, "x")
    cache.entry_made(20, "x", mpb.Attr(inode=21), subdir=False, since=cache.generation)
    assert not cache.absent(20, "x") and cache.absent(20, "y")
    assert not cache.absent(1, "anything")  # the root was not made here: not known
    # A name in it listed by the manager (another mount's create): no longer known whole.
    cache.invalidate([], [(20, "y")])
    assert not cache.absent(20, "z")
    # Known whole for the coherent timeout, not beyond.
    cache.entry_made(1, "e", _dir(30), subdir=True, since=cache.generation)
    coherent[0] = False  # the lease lapsed, the cache not yet cleared
    assert not cache.absent(30, "x")
    coherent[0] = True
    assert cache.absent(30, "x")
    now[0] += 61.0
    assert not cache.absent(30, "x")
    # Its attributes listed as changed, this mount's own removal, a client beside the
    # mount resolving it (mosafs.checkpoint), coherence lost.
    for end in (lambda: cache.invalidate([40], []), lambda: cache.drop_entry(40, "x"),
                lambda: cache.forget_whole(40), cache.clear):
        cache.entry_made(1, "f", _dir(40), subdir=True, since=cache.generation)
        assert cache.absent(40, "x")
        end()
        assert not cache.absent(40, "x")


def test_a_directory_is_not_known_whole_across_a_listed_change_or_without_coherence() -> None:
    cache = AttrCache(1.0, 60.0)
    coherent = [False]
    cache.coherent = lambda: coherent[0]
    cache.entry_made(1, "d", _dir(20), subdir=True, since=cache.generation)
    assert not cache.absent(20, "x")  # not coherent: names come and go unseen
    coherent[0] = True
    asked = cache.generation
    cache.invalidate([], [(21, "x")])  # a change in the new directory, listed meanwhile
    cache.invalidate([21], [])
    cache.entry_made(1, "e", _dir(21), subdir=True, since=asked)
    assert not cache.absent(21, "y")
    # A name made in a known-whole directory while something in it was listed changed.
    cache.entry_made(1, "g", _dir(22), subdir=True, since=cache.generation)
    asked = cache.generation
    cache.invalidate([], [(22, "other")])
    cache.entry_made(22, "mine", mpb.Attr(inode=23), subdir=False, since=asked)
    assert not cache.absent(22, "other") and not cache.absent(22, "y")


def test_directories_known_whole_are_bounded_by_their_names_together(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One directory may hold the whole budget of names (a checkpoint step's directory,
    where every rank creates); past it, it is no longer known whole (its missing names are
    asked of the manager). Directories known whole share the budget: the one held longest
    goes first. At most WHOLE_DIRS are known whole at once."""
    monkeypatch.setattr(attrcache, "WHOLE_NAMES", 100)
    monkeypatch.setattr(attrcache, "WHOLE_DIRS", 8)
    cache = AttrCache(1.0, 60.0)
    cache.coherent = lambda: True
    cache.entry_made(1, "d", _dir(20), subdir=True, since=cache.generation)
    for i in range(100):
        cache.entry_made(20, f"f{i}", mpb.Attr(inode=1000 + i), subdir=False,
                         since=cache.generation)
    assert cache.absent(20, "missing") and not cache.absent(20, "f99")
    cache.entry_made(20, "one-more", mpb.Attr(inode=999), subdir=False,
                     since=cache.generation)
    assert not cache.absent(20, "missing")
    # Two directories of 60 names: the second's growth past the budget drops the first.
    for d in (30, 31):
        cache.entry_made(1, f"d{d}", _dir(d), subdir=True, since=cache.generation)
        for i in range(60):
            cache.entry_made(d, f"g{i}", mpb.Attr(inode=2000 + 100 * d + i), subdir=False,
                             since=cache.generation)
    assert not cache.absent(30, "missing") and cache.absent(31, "missing")
    for d in range(9):
        cache.entry_made(1, f"dir{d}", _dir(5000 + d), subdir=True, since=cache.generation)
    known = [cache.absent(5000 + d, "x") for d in range(9)]
    assert known == [False] + [True] * 8  # the oldest of nine went


def test_whole_dirs_count_their_names_through_every_change() -> None:
    now = [0.0]
    dirs = attrcache.WholeDirs(4, 10, timer=lambda: now[0])
    assert dirs.put(1, {"a", "b"}, 5.0) and dirs.put(2, {"c"}, 1.0) and dirs.names == 3
    names = dirs.pop(1)
    assert names == {"a", "b"} and dirs.names == 1
    names.add("z")
    assert dirs.put(1, names, 5.0) and dirs.names == 4
    now[0] = 2.0  # directory 2's entry expired: found so, and no longer counted
    assert dirs.get(2) is None and dirs.names == 3
    assert not dirs.put(3, {str(i) for i in range(11)}, 5.0) and dirs.names == 3
    assert dirs.put(3, {str(i) for i in range(8)}, 5.0)  # directory 1 made room
    assert dirs.get(1) is None and dirs.names == 8
    dirs.clear()
    assert dirs.names == 0 and dirs.get(3) is None


def test_a_listing_fetched_across_a_change_here_in_its_directory_is_not_cached() -> None:
    """git's lock files: `config.lock` renamed to `config` while a listing of the directory
    that still held `config.lock` was on its way; cached after the rename, it answered
    the next open(O_EXCL) of `config.lock` with EEXIST. A change in another directory
    leaves a listing alone."""
    cache = AttrCache(1.0, 60.0)
    cache.coherent = lambda: True
    before = [mpb.DirEntry(name="config.lock", attr=mpb.Attr(inode=50)),
              mpb.DirEntry(name="HEAD", attr=mpb.Attr(inode=51))]
    mark = cache.mark()  # the fetch begins
    cache.drop_entry(7, "config.lock")  # this mount renames it (both names change)
    cache.drop_entry(7, "config")
    cache.put_listing(7, before, mark)  # the fetch ends
    assert cache.listing(7) is None
    assert cache.child(7, "config.lock") is None and cache.child(7, "HEAD") is None
    cache.put_entries(7, before, mark)
    assert cache.child(7, "config.lock") is None

    mark = cache.mark()
    cache.drop_entry(8, "elsewhere")
    cache.put_listing(7, before, mark)
    assert cache.child(7, "HEAD") == 51 and cache.listing(7) == before


def test_edits_of_more_directories_than_remembered_forget_conservatively() -> None:
    cache = AttrCache(1.0)
    edits = cache.edits
    for d in range(attrcache.EDITED_DIRS + 1):
        cache.drop_entry(1000 + d, "x")
    assert cache.edited_since(5, edits)  # 5 was never edited, but that far back is forgotten
    now = cache.edits
    assert not cache.edited_since(5, now)
    cache.drop_entry(5, "y")
    assert cache.edited_since(5, now) and not cache.edited_since(6, now)
