"""A Batch RPC's operations (mosafs.manager.batches) against a real store: its creates are
announced to the group committer and share one durable commit; an operation refused
before it writes does not hold the others' commit back; each is answered on its own."""

from __future__ import annotations

import time
from typing import Any

import pytest

from mosafs._proto import manager_pb2 as pb
from mosafs.errors import InvalidArgument
from mosafs.manager.batches import ANNOUNCED_MAX, Batches
from mosafs.manager.metadata import ROOT_INODE, MetadataStore


def _batches(store: MetadataStore) -> Batches:
    def create(request: pb.CreateRequest) -> Any:
        return store.create(request.parent, request.name, request.mode)

    def lookup(request: pb.LookupRequest) -> Any:
        return store.lookup(request.parent, request.name)

    return Batches({"lookup": lookup}, {"create": create}, announce=store.announce_write)


def _creates(names: list[str]) -> list[pb.BatchOp]:
    return [pb.BatchOp(create=pb.CreateRequest(parent=ROOT_INODE, name=n, mode=0o644))
            for n in names]


def test_a_batchs_creates_share_one_commit_and_a_refused_one_holds_nothing_back(
        store: MetadataStore) -> None:
    batches = _batches(store)
    store._committer.gather_s = 30.0  # the test's own bound, never reached here
    groups = store._committer.groups
    ops = _creates([f"f{i}" for i in range(12)] + ["bad/name"])
    ops.append(pb.BatchOp(lookup=pb.LookupRequest(parent=ROOT_INODE, name="f0")))
    started = time.monotonic()
    out = batches.run(ops)
    assert time.monotonic() - started < 15
    assert len({a.inode for a in out[:12]}) == 12
    assert isinstance(out[12], InvalidArgument)  # refused before writing, alone
    assert store._committer.groups - groups == 1  # twelve creates, one durable commit
    assert store._committer._awaited == 0
    batches.close()


def test_a_batch_announces_no_more_writes_than_can_run_at_once(store: MetadataStore) -> None:
    batches = _batches(store)
    names = [f"g{i}" for i in range(ANNOUNCED_MAX + 8)]
    out = batches.run(_creates(names))
    assert [store.lookup(ROOT_INODE, n).inode for n in names] == [a.inode for a in out]
    assert store._committer._awaited == 0
    batches.close()


def test_writes_that_cannot_start_leave_no_announcement_behind(store: MetadataStore) -> None:
    """A batch that arrives as the manager stops (its threads shut down) is refused, and
    the committer waits for none of its writes afterwards."""
    batches = _batches(store)
    batches.close()
    with pytest.raises(RuntimeError):
        batches.run(_creates(["late-0", "late-1"]))
    assert store._committer._awaited == 0
    assert store.create(ROOT_INODE, "after", 0o644).inode > 0
