"""mosafs.bench.synthetic: the synthetic store it writes straight into LMDB is one the
manager's own checker finds sound (fsck), its files, block-maps and chunk records are the
ones asked for, a real `mosafs manager` serves it, and it refuses to write over anything."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mosafs._proto import manager_pb2 as pb
from mosafs._proto import manager_pb2_grpc as pb_grpc
from mosafs._proto import metadata_pb2
from mosafs.bench import synthetic
from mosafs.errors import ConfigError
from mosafs.manager.fsck import fsck
from mosafs.manager.metadata import ROOT_INODE, MetadataStore
from mosafs.manager.metadata.schema import holding_prefix
from mosafs.rpc.channels import channel
from mosafs.rpc.errors import call
from tests import harness

CHUNKS, FILES, PER_DIR = 5_000, 700, 100
BIDS = ["syn-b0", "syn-b1", "syn-b2"]
CHUNK_SIZE = 1 << 20
MiB = 1 << 20


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One store for the whole module: (data directory, the figures generate returned)."""
    data_dir = tmp_path_factory.mktemp("synthetic") / "data"
    lines: list[str] = []
    figures = synthetic.generate(data_dir, chunks=CHUNKS, files=FILES, benefactors=BIDS,
                                 replication=2, per_dir=PER_DIR, seed=7,
                                 progress=lines.append)
    assert lines, "progress is reported"
    return data_dir, figures


@pytest.fixture
def store(generated: tuple[Path, dict[str, Any]]) -> Iterator[MetadataStore]:
    """The generated store opened as the manager opens it."""
    with MetadataStore(generated[0] / "metadata.lmdb", map_size=256 * MiB) as s:
        yield s


def test_figures(generated: tuple[Path, dict[str, Any]]) -> None:
    data_dir, figures = generated
    assert figures["chunks"] == CHUNKS and figures["files"] == FILES
    assert figures["directories"] == 1 + FILES // PER_DIR
    assert figures["inodes"] == 1 + 1 + FILES // PER_DIR + FILES  # root, /synthetic, ...
    assert figures["lmdb_bytes"] == (data_dir / "metadata.lmdb" / "data.mdb").stat().st_size
    assert figures["seconds"] >= 0


def test_fsck_finds_nothing(store: MetadataStore) -> None:
    result = fsck(store)
    assert result.findings == []
    assert result.chunks == CHUNKS and result.versions == FILES
    assert result.inodes == 2 + FILES // PER_DIR + FILES


def test_paths_attributes_and_block_maps(store: MetadataStore) -> None:
    top = store.lookup(ROOT_INODE, "synthetic")
    assert top.nlink == 2 + FILES // PER_DIR
    assert store.getattr(ROOT_INODE).nlink == 3
    # 5000 chunks over 700 files: 7 each, the first 5000 % 700 = 100 files one more.
    for i, count in ((5, 8), (99, 8), (100, 7), (345, 7), (FILES - 1, 7)):
        folder = store.lookup(top.inode, f"d{i // PER_DIR:05d}")
        assert folder.nlink == 2
        attr = store.lookup(folder.inode, f"f{i:06d}")
        assert (attr.kind, attr.nlink, attr.size) == (pb.FILE_KIND_REGULAR, 1,
                                                      count * CHUNK_SIZE)
        bmap = store.block_map(attr.inode)
        assert bmap.version == 1 and bmap.size == attr.size
        assert [c.length for c in bmap.chunks] == [CHUNK_SIZE] * count
        assert all(len(set(loc.benefactor_ids)) == 2 for loc in bmap.locations)
        stats = store.version_stats(attr.inode)
        assert (stats.chunks, stats.stored_chunks, stats.stored_bytes, stats.new_bytes) == (
            count, count, attr.size, attr.size)
        assert stats.sources_known and stats.base_version == 0
    entries, more = store.readdir(top.inode, limit=1000)
    assert len(entries) == FILES // PER_DIR and not more


def test_chunk_records(store: MetadataStore) -> None:
    copies = dict.fromkeys(BIDS, 0)
    with store.transaction() as tx:
        records = 0
        for _, raw in tx.txn.cursor(db=tx.db.chunks):
            rec = metadata_pb2.ChunkRecord.FromString(raw)
            records += 1
            assert (rec.refcount, rec.length, rec.pool) == (1, CHUNK_SIZE, "")
            assert len(set(rec.benefactor_ids)) == len(rec.benefactor_ids) == 2
            for bid in rec.benefactor_ids:
                copies[bid] += 1
        assert records == CHUNKS
        counter = tx.txn.get(b"next_inode", db=tx.db.meta)
        assert counter is not None  # u64be: the next inode number to hand out
        assert struct.unpack(">Q", counter)[0] == 3 + FILES // PER_DIR + FILES
        for bid in BIDS:  # the holdings index lists each benefactor's copies
            prefix = holding_prefix(bid)
            cursor = tx.txn.cursor(db=tx.db.holdings)
            assert cursor.set_range(prefix)
            held = sum(1 for key in cursor.iternext(values=False) if key.startswith(prefix))
            assert held == copies[bid]
    # Round-robin: 10,000 copies over 3 benefactors.
    assert sorted(copies.values()) == [3333, 3333, 3334]
    registered = store.benefactors()
    assert sorted(registered) == BIDS
    assert {bid: rec.chunks for bid, rec in registered.items()} == copies
    assert all(rec.pool == "default" for rec in registered.values())
    assert store.pool("default").replication == 2


def test_refuses_a_non_empty_directory(tmp_path: Path,
                                       generated: tuple[Path, dict[str, Any]]) -> None:
    with pytest.raises(ConfigError, match="not an empty directory"):
        synthetic.generate(generated[0], chunks=10, files=2, benefactors=BIDS)
    (tmp_path / "other").write_text("x")
    with pytest.raises(ConfigError, match="not an empty directory"):
        synthetic.generate(tmp_path, chunks=10, files=2, benefactors=BIDS)


@pytest.mark.parametrize("kwargs, message", [
    ({"replication": 4}, "replication must be 1..3"),
    ({"benefactors": ["a", "a"]}, "distinct"),
    ({"benefactors": ["bad/id"]}, "bad benefactor id"),
    ({"files": 10_001, "per_dir": 100}, "raise per_dir"),
])
def test_refuses_bad_arguments(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"chunks": 10, "files": 2, "benefactors": BIDS, **kwargs}
    with pytest.raises(ConfigError, match=message):
        synthetic.generate(tmp_path / "data", **args)
    assert not (tmp_path / "data").exists()


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert synthetic.main(["--chunks", "30", "--files", "4", "--benefactors", "x1,x2",
                           "--replication", "2", "--quiet", str(tmp_path / "d")]) == 0
    assert '"chunks": 30' in capsys.readouterr().out
    for argv in (["--chunks", "-1", "--files", "4", "--benefactors", "x1", "d"],
                 ["--chunks", "3", "--files", "4", "--benefactors", "x1",
                  str(tmp_path / "d")]):  # not empty now
        with pytest.raises(SystemExit) as info:
            synthetic.main(argv)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("python -m")


def test_a_manager_serves_it(tmp_path: Path, generated: tuple[Path, dict[str, Any]]) -> None:
    proc = harness.start("manager", ["manager", "--data-dir", str(generated[0])],
                         tmp_path / "procs", timeout=30)
    try:
        with channel(proc.address) as chan:
            status = call(pb_grpc.ManagerStub(chan).GetClusterStatus,
                          pb.ClusterStatusRequest(), timeout=10)
        assert sorted(b.info.id for b in status.benefactors) == BIDS
        assert not any(b.alive for b in status.benefactors)  # none has sent a heartbeat
    finally:
        proc.stop()
