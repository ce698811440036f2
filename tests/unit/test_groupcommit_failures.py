"""Group commit when things fail (docs/metadata.md, "Group commit"): a group whose local
commit fails after its entry was shipped is replayed before any other write transaction
may run (one took the writer lock in between, committed as N+1 and was then overwritten
by the replay of N); and a bug in one planned body fails its call only after the bodies
committed with it are done with (their unreferenced chunks told). Real LMDB; the commit
failure is injected as a DiskError."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import lmdb
import pytest

from mosafs.manager.core import Manager, ManagerConfig
from mosafs.manager.metadata import ROOT_INODE, MetadataStore, Planned
from mosafs.manager.metadata.namespace import NamespaceOps
from mosafs.manager.replog import ReplicationLog
from tests.unit.managers import Clock, cid, commit, new_file, register


class _Txn:
    def __init__(self, real: Any, owner: _Env) -> None:
        self.real, self.owner = real, owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def commit(self) -> None:
        if self.owner.fail_next:
            self.owner.fail_next = False
            raise lmdb.DiskError("injected: the disk refused the group's commit")
        self.real.commit()


class _Env:
    """The committer's environment, whose next group commit fails (as EIO/ENOSPC/EFBIG
    make it fail)."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.fail_next = False

    def begin(self, write: bool = False, parent: Any = None) -> Any:
        if parent is not None:
            return self.env.begin(write=write, parent=getattr(parent, "real", parent))
        return _Txn(self.env.begin(write=write), self)


def test_replay_after_a_failed_group_commit_does_not_overwrite_a_later_entry(
        tmp_path: Path) -> None:
    store = MetadataStore(tmp_path / "db", map_size=1 << 30)
    try:
        seq, epoch = store.log_position()
        journal = ReplicationLog(epoch=epoch + 1, last_seq=seq, last_epoch=epoch,
                                 standbys=0)
        store.attach_log(journal)
        journal.serve()
        ino = store.create(ROOT_INODE, "f", 0o644).inode
        env = _Env(store._committer._env)
        store._committer._env = env

        in_body = threading.Event()
        go = threading.Event()

        def body(tx: Any) -> None:  # a group body: a chmod
            in_body.set()
            assert go.wait(10)
            rec = tx.inode(ino)
            rec.mode = 0o600
            tx.put_inode(ino, rec)

        group_error: list[BaseException] = []

        def group() -> None:
            try:
                store._grouped(body)
            except BaseException as exc:
                group_error.append(exc)

        def inline() -> None:  # an inline write transaction: a chown
            with store.transaction(write=True) as tx:
                rec = tx.inode(ino)
                rec.uid = 42
                tx.put_inode(ino, rec)
            inline_done.set()

        # The interleaving made deterministic: the inline writer, blocked on LMDB's
        # writer lock during the group, gets it at the group's abort, before the replay's
        # own transaction does (it mostly does so by itself: the replay first reads the
        # map's figures).
        inline_done = threading.Event()
        real = store._committer.journal
        assert real is not None
        real_replay = real.replay

        def replay(seq: int, ops: list[Any]) -> None:
            inline_done.wait(1)  # (with the fix it cannot: it waits for the replay)
            real_replay(seq, ops)

        real.replay = replay  # type: ignore[method-assign]
        g = threading.Thread(target=group)
        g.start()
        assert in_body.wait(10)
        env.fail_next = True
        w = threading.Thread(target=inline)  # waits for LMDB's writer lock
        w.start()
        time.sleep(0.3)
        go.set()
        g.join(20)
        w.join(20)
        assert not g.is_alive() and not w.is_alive()
        # The group's change was replayed, so its caller was told it is stored.
        assert group_error == []
        attr = store.getattr(ino)
        # The inline chown was acknowledged and comes after the group in the log (the
        # order every standby applies): it must stand here too.
        position = (store.log_position()[0], journal.last_seq)
        assert attr.uid == 42, (attr, position)
        assert store.log_position()[0] == journal.last_seq, (
            store.log_position(), journal.last_seq)
    finally:
        store.close()




def test_a_bug_in_one_plan_loses_the_unreferenced_chunks_of_the_committed_ones(
        tmp_path: Path) -> None:
    store = MetadataStore(tmp_path / "db", map_size=1 << 30)
    try:
        mgr = Manager(store, ManagerConfig(), clock=Clock())
        register(mgr, "b1")
        ino = new_file(store, "f")
        commit(mgr, ino, [(cid(1), 100)])
        told: list[bytes] = []
        store.on_unreferenced = told.extend

        def bug(tx: Any) -> None:
            raise RuntimeError("a bug in a body")

        def unlink(tx: Any) -> None:  # unlink's body: the file's last name
            NamespaceOps.remove_name(tx, ROOT_INODE, b"f", ino, time.time_ns())

        with pytest.raises(RuntimeError):
            store.run_planned([Planned(bug), Planned(unlink)])
        # The unlink was committed (its group's commit is durable) ...
        assert [n for n, _ in store.readdir(ROOT_INODE)[0]] == []
        assert store.chunk(cid(1)) is None or store.chunk(cid(1)).refcount == 0
        # ... so garbage collection must be told of the chunk it left unreferenced.
        assert told == [cid(1)]
    finally:
        store.close()
