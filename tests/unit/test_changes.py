"""The manager's change list for the mounts' caches (mosafs.manager.changes), on a real
LMDB store: every committed change to inodes and names is listed with the mount it came
from, a mount is not told its own changes, and a position the list cannot answer from
(another manager's, trimmed, too far behind) gets RESET; the manager's own work (pruning
after a commit) is listed to every mount."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar

from mosafs.capability import ORIGIN
from mosafs.manager.changes import ChangeList
from mosafs.manager.core import Manager
from mosafs.manager.metadata import ROOT_INODE, MetadataStore
from mosafs.manager.pruning import Policy
from tests.unit.managers import cid, commit, register

T = TypeVar("T")
INODES, NAMES = 1, 2  # sub-database indexes of the ops below
U64 = (7).to_bytes(8, "big")


def as_mount(mount: str, fn: Callable[[], T]) -> T:
    """FN() in a request of MOUNT (the RPC layer sets ORIGIN so)."""
    ctx = contextvars.copy_context()

    def run() -> T:
        ORIGIN.set(mount)
        return fn()
    return ctx.run(run)


def test_changes_lists_inodes_and_names_but_not_the_askers_own() -> None:
    changes = ChangeList(INODES, NAMES)
    changes.record("a", [(INODES, U64, b"rec"), (NAMES, U64 + b"f", U64),
                         (5, b"other", b"x")])
    changes.record("b", [(NAMES, (1).to_bytes(8, "big") + b"g", None)])
    changes.record("a", [(5, b"chunks only", b"x")])  # nothing listed: no seq used
    first = changes.since("", 0, "a")
    assert first.reset and first.seq == 2
    to_a = changes.since(first.instance, 0, "a")
    assert not to_a.reset and (to_a.inodes, to_a.names) == ([], [(1, "g")])
    to_c = changes.since(first.instance, 0, "c")
    assert (to_c.inodes, to_c.names) == ([7], [(1, "g"), (7, "f")])
    assert changes.since(first.instance, 1, "c").names == [(1, "g")]
    assert changes.since(first.instance, 2, "c").names == []
    assert changes.since(first.instance, 3, "c").reset  # a position it never gave


def test_changes_reset_when_trimmed_or_too_many_to_list() -> None:
    changes = ChangeList(INODES, NAMES, max_keys=4, max_answer=3)
    for i in range(3):
        changes.record("", [(INODES, i.to_bytes(8, "big"), b"r"),
                            (INODES, (100 + i).to_bytes(8, "big"), b"r")])
    me = changes.instance
    assert changes.since(me, 0, "x").reset  # the first change was trimmed
    assert changes.since(me, 1, "x").reset  # four inodes to list, at most three
    after_two = changes.since(me, 2, "x")
    assert not after_two.reset and after_two.inodes == [2, 102]
    assert ChangeList(INODES, NAMES).instance != me


def test_changes_of_the_store_come_with_their_mount(store: MetadataStore) -> None:
    changes = store.track_changes()
    start = changes.seq
    d = as_mount("m1", lambda: store.mkdir(ROOT_INODE, "d", 0o755))
    f = as_mount("m2", lambda: store.create(d.inode, "f", 0o644))
    store.rename(d.inode, "f", d.inode, "g")  # the manager's own work: no mount
    seen = changes.since(changes.instance, start, "m3")
    assert set(seen.inodes) == {ROOT_INODE, d.inode, f.inode}
    assert set(seen.names) == {(ROOT_INODE, "d"), (d.inode, "f"), (d.inode, "g")}
    mine = changes.since(changes.instance, start, "m2")  # m2 made f, not the rename
    assert (d.inode, "g") in mine.names and (ROOT_INODE, "d") in mine.names


def test_changes_of_a_group_commit_reach_the_list_before_the_caller_returns(
        store: MetadataStore) -> None:
    changes = store.track_changes()
    start = changes.seq
    made: list[int] = []

    def create(i: int) -> None:
        attr = as_mount(f"m{i}", lambda: store.create(ROOT_INODE, f"f{i}", 0o644))
        # Listed already when the create returns: a mount that asks now is told.
        assert (ROOT_INODE, f"f{i}") in changes.since(changes.instance, start, "x").names
        made.append(attr.inode)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 8
    assert set(made) <= set(changes.since(changes.instance, start, "x").inodes)


def test_changes_pruning_after_a_commit_is_listed_to_the_committing_mount(
        mgr: Manager) -> None:
    """Pruning runs inside the commit's request, but it is the manager's own work: the
    mount that committed is told of the names it removed, or it keeps serving them from
    its cache for the coherent timeout."""
    register(mgr, "b1")
    d = mgr.store.mkdir(ROOT_INODE, "ckpt", 0o755).inode
    mgr.set_folder(d, pool=None, series_pattern=None, policy=Policy(keep_last=1),
                   clear_policy=False)
    first = mgr.store.create(d, "app.n0.1", 0o644).inode
    commit(mgr, first, [(cid(1), 10)])
    second = mgr.store.create(d, "app.n0.2", 0o644).inode
    before = mgr.changes.seq
    as_mount("m1", lambda: commit(mgr, second, [(cid(2), 10)]))  # prunes app.n0.1
    assert [n for n, _ in mgr.store.readdir(d)[0]] == ["app.n0.2"]
    told = mgr.changes.since(mgr.changes.instance, before, "m1")
    assert not told.reset and (d, "app.n0.1") in told.names
    assert second not in told.inodes  # the commit itself stays the mount's own
    assert ORIGIN.get() == ""  # and the request's origin is as it was
