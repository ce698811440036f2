"""A Batch RPC's operations (mosafs.manager.batches) against a real store: its creates are
planned in the calling thread and share one durable commit; an operation refused while
planned or while run holds nothing back; each is answered on its own; a batch that fills
the map grows it and goes on."""

from __future__ import annotations

import threading
from pathlib import Path

from mosafs._proto import manager_pb2 as pb
from mosafs.errors import AlreadyExists, InvalidArgument, NoSpace, NotFound
from mosafs.manager.batches import Batches
from mosafs.manager.fsck import fsck
from mosafs.manager.metadata import ROOT_INODE, MetadataStore, Planned

MiB = 1 << 20


def _batches(store: MetadataStore) -> Batches:
    def plan_create(request: pb.CreateRequest) -> Planned[pb.Attr]:
        return store.plan_create(request.parent, request.name, request.mode,
                                 exclusive=request.exclusive)

    def lookup(request: pb.LookupRequest) -> pb.Attr:
        return store.lookup(request.parent, request.name)

    return Batches({"lookup": lookup}, {"create": plan_create}, store.run_planned)


def _creates(names: list[str], *, exclusive: bool = False) -> list[pb.BatchOp]:
    return [pb.BatchOp(create=pb.CreateRequest(parent=ROOT_INODE, name=n, mode=0o644,
                                               exclusive=exclusive))
            for n in names]


def test_a_batchs_creates_share_one_commit_and_a_refused_one_holds_nothing_back(
        store: MetadataStore) -> None:
    batches = _batches(store)
    store.create(ROOT_INODE, "there", 0o644)
    groups = store._committer.groups
    threads = threading.active_count()
    ops = _creates([f"f{i}" for i in range(12)] + ["bad/name"])
    ops += _creates(["there"], exclusive=True)  # refused by its body, inside the group
    ops.append(pb.BatchOp(lookup=pb.LookupRequest(parent=ROOT_INODE, name="there")))
    out = batches.run(ops)
    assert len({a.inode for a in out[:12]}) == 12
    assert [store.lookup(ROOT_INODE, f"f{i}").inode for i in range(12)] == \
        [a.inode for a in out[:12]]
    assert isinstance(out[12], InvalidArgument)  # refused while planned
    assert isinstance(out[13], AlreadyExists)  # refused while run: rolled back alone
    assert out[14].inode == store.lookup(ROOT_INODE, "there").inode
    assert store._committer.groups - groups == 1  # thirteen creates, one durable commit
    assert threading.active_count() == threads  # no thread of its own for any write
    assert fsck(store).findings == []


def test_a_batch_read_refuses_its_writes_alone(store: MetadataStore) -> None:
    batches = _batches(store)
    missing = pb.BatchOp(lookup=pb.LookupRequest(parent=ROOT_INODE, name="missing"))
    ops = [*_creates(["w"]), missing]
    out = batches.run(ops, writes=False)
    assert isinstance(out[0], InvalidArgument) and "BatchRead" in str(out[0])
    assert isinstance(out[1], NotFound)
    assert store.readdir(ROOT_INODE) == ([], False)


def test_batches_that_fill_the_map_grow_it_then_get_no_space_one_by_one(
        tmp_path: Path) -> None:
    """The first batch's creates that find the map full run again alone once it grew;
    at the ceiling each create is refused with NoSpace as its own outcome, and the store
    stays whole."""
    with MetadataStore(tmp_path / "m.lmdb", map_size=2 * MiB) as store:
        batches = _batches(store)
        assert store.map_size == MiB
        made: list[str] = []
        refused: list[NoSpace] = []
        for b in range(400):
            names = [f"{b:03d}-{i:02d}-" + "n" * 200 for i in range(64)]
            for name, answer in zip(names, batches.run(_creates(names)), strict=True):
                if isinstance(answer, NoSpace):
                    refused.append(answer)
                else:
                    assert answer.inode > 0
                    made.append(name)
            if refused:
                break
        assert refused and store.map_size == 2 * MiB  # grew, to the ceiling
        assert len(made) > 64 * 2
        listed: list[str] = []
        more = True
        while more:
            page, more = store.readdir(ROOT_INODE, listed[-1] if listed else "")
            listed += [name for name, _ in page]
        assert listed == sorted(made)
        assert fsck(store).findings == []
