"""A synthetic manager data directory, written straight into LMDB, for the manager's
scale benchmark: how much CPU an idle manager burns, how fast it reacts to a benefactor's
failure, and how quickly GetClusterStatus answers with 10 million chunk records in its
index. Building such a store through real writes would take hours of client and
benefactor work (and terabytes of disk); this writes the records those writes would have
left, in seconds per million.

What `generate` writes into an empty DATA_DIR (the directory `mosafs manager --data-dir`
takes, with the same DATA_DIR/metadata.lmdb opened by the same MetadataStore):

- FILES regular files /synthetic/dNNNNN/fNNNNNN (the file number is global, so file i is
  in directory i // PER_DIR), at most PER_DIR entries in any directory;
- each file with one committed version, as a fresh write's CommitVersion leaves it: its
  block-map names CHUNKS // FILES chunks (the first CHUNKS % FILES files one more), every
  chunk named exactly once in the whole store (refcount 1), each CHUNK_SIZE bytes long;
- one chunk record per chunk, with REPLICATION whole copies on distinct benefactors,
  chosen round-robin over BENEFACTORS (in the chunk ids' order), and the holdings index
  entry (benefactor id + NUL + chunk id) of every copy;
- a registration for every benefactor id (address 127.0.0.1:N, pool "default", large
  capacity), so the ids are known, and the default pool's replication set to REPLICATION.
  No benefactor is alive after a (re)start until one with that id sends a heartbeat: the
  benchmark starts benefactors under these ids (or measures a cluster of dead ones).

Chunk ids are BLAKE3's extendable output for SEED, 32 bytes each: deterministic,
uniformly spread like real content hashes, but hashes of no data. No benefactor holds the
bytes.

Everything goes through the store's own code: MetadataStore opens the environment as the
manager does, records are the store's protobuf messages, keys and block-maps use its
encoders (Tx.put_inode, Tx.link, Tx.allocate_inode, VersionOps._add_version,
schema.holding_key, the store's benefactor and pool operations), and write transactions
are the store's, so its map grows as it does for the manager. Two shortcuts keep 10
million records fast: many records share one write transaction (the store's fsync per
commit would otherwise dominate), and chunk records and holdings entries are written in
key order with LMDB's append mode (cursor putmulti), which fills each page instead of
splitting it: those two sub-databases are denser than ones grown by random inserts. The
namespace is written in key order without append, as a manager creating files one after
the other grows it. 10 million chunks and 1 million files: about 32 s on 2 CPUs, 2.4 GB
of LMDB file, 1 GB of memory at the peak.

Run it as `python -m mosafs.bench.synthetic --chunks 10000000 --files 1000000
--benefactors syn-b0,syn-b1,syn-b2 --replication 2 DATA_DIR`; it prints its figures as
JSON. mosafs.manager.fsck checks the result (tests/unit/test_bench_synthetic.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import numpy as np

from mosafs._proto import metadata_pb2
from mosafs.argtypes import MiB, bounded_int, byte_size
from mosafs.errors import ConfigError, InvalidArgument, MosafsError
from mosafs.ids import ID_LEN
from mosafs.manager.mapsize import MapGrown
from mosafs.manager.metadata import (
    DIRECTORY,
    MAX_CHUNK_BYTES,
    MAX_FILE_SIZE,
    REGULAR,
    ROOT_INODE,
    ChunkEntry,
    MetadataStore,
    Tx,
    check_benefactor_id,
)
from mosafs.manager.metadata.schema import DEFAULT_MAP_SIZE, holding_key, holding_prefix
from mosafs.manager.metadata.versions import VersionOps
from mosafs.manager.pools import DEFAULT_POOL
from mosafs.procutil import exclusive
from mosafs.redundancy import MAX_REPLICATION

TOP = b"synthetic"  # /synthetic holds the generated tree: nothing else is in the store
DIR_MODE = 0o755
FILE_MODE = 0o644
# Records per write transaction: large enough that the fsync of each commit is noise,
# small enough that LMDB's dirty pages of one transaction stay in memory (no spilling).
FILES_PER_BATCH = 10_000  # 4 records each (inode, entry, version, block-map)
CHUNKS_PER_BATCH = 50_000
CAPACITY = 1 << 50  # 1 PiB per benefactor: placement never finds one full
_ID_KEY = b"mosafs synthetic chunk ids v1".ljust(32, b".")  # BLAKE3 keys are 32 bytes


@dataclass(frozen=True)
class _Plan:
    """What to generate, and where each file's chunks and name come from."""

    chunks: int
    files: int
    per_dir: int
    chunk_size: int
    replication: int
    benefactors: tuple[str, ...]
    now: int  # every time stamp: one instant, as if written at once

    @property
    def directories(self) -> int:
        return -(-self.files // self.per_dir)

    def chunk_range(self, i: int) -> tuple[int, int]:
        """(first chunk number, count) of file I: CHUNKS // FILES each, the first
        CHUNKS % FILES files one more."""
        q, r = divmod(self.chunks, self.files)
        return i * q + min(i, r), q + (i < r)

    def dir_name(self, d: int) -> bytes:
        return f"d{d:0{max(5, len(str(self.directories - 1)))}d}".encode()

    def file_name(self, i: int) -> bytes:
        return f"f{i:0{max(6, len(str(self.files - 1)))}d}".encode()

    def holders(self, rank: int) -> list[str]:
        """The benefactors of the chunk at RANK in key order: round-robin, distinct."""
        n = len(self.benefactors)
        return [self.benefactors[(rank + j) % n] for j in range(self.replication)]

    def ranks_on(self, index: int) -> np.ndarray:
        """The ranks (in key order) of the chunks benefactor number INDEX holds, as
        holders() assigns them, ascending."""
        n = len(self.benefactors)
        residues = {(index - j) % n for j in range(self.replication)}
        return np.sort(np.concatenate([np.arange(r, self.chunks, n) for r in residues]))

    def copies_on(self, index: int) -> int:
        """How many chunk copies benefactor number INDEX holds."""
        n = len(self.benefactors)
        q, r = divmod(self.chunks, n)
        return sum(q + ((index - j) % n < r) for j in range(self.replication))


def generate(data_dir: Path, *, chunks: int, files: int, benefactors: Sequence[str],
             replication: int = 2, chunk_size: int = 1 * MiB, per_dir: int = 1000,
             seed: int = 0, map_size: int = DEFAULT_MAP_SIZE,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write the synthetic store (module docstring) into DATA_DIR, which must be missing
    or empty (ConfigError otherwise, and for arguments out of range). MAP_SIZE: the
    store's ceiling, as the manager's --map-size (the default is the manager's). Returns
    the figures: counts, seconds, bytes of the LMDB data file."""
    started = time.monotonic()
    say = progress or (lambda _: None)
    plan = _plan(chunks=chunks, files=files, benefactors=benefactors,
                 replication=replication, chunk_size=chunk_size, per_dir=per_dir)
    data_dir = Path(data_dir)
    _check_empty(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    ids = _chunk_ids(seed, chunks)
    # The manager's own lock: no manager may open the store while it is being written.
    with exclusive(data_dir / "manager.lock", f"a manager is running on {data_dir}"), \
            MetadataStore(data_dir / "metadata.lmdb", map_size=map_size) as store:
        _register(store, plan)
        dirs = _write_directories(store, plan)
        say(f"{len(dirs)} directories written ({time.monotonic() - started:.1f} s)")
        _write_files(store, plan, ids, dirs, say)
        ordered = _sorted_ids(ids)
        _write_chunk_index(store, plan, ordered, say)
        _write_holdings(store, plan, ordered, say)
        with store.transaction() as tx:
            inodes = int(tx.txn.stat(tx.db.inodes)["entries"])
    return {
        "data_dir": str(data_dir),
        "chunks": chunks,
        "files": files,
        "directories": len(dirs) + 1,  # /synthetic and its subdirectories
        "inodes": inodes,
        "benefactors": list(plan.benefactors),
        "replication": replication,
        "chunk_size": chunk_size,
        "seconds": round(time.monotonic() - started, 3),
        "lmdb_bytes": (data_dir / "metadata.lmdb" / "data.mdb").stat().st_size,
    }


def _plan(*, chunks: int, files: int, benefactors: Sequence[str], replication: int,
          chunk_size: int, per_dir: int) -> _Plan:
    """The checked arguments (ConfigError names the first that is out of range)."""
    bids = tuple(benefactors)
    for bid in bids:
        try:
            check_benefactor_id(bid)
        except InvalidArgument as exc:
            raise ConfigError(str(exc)) from None
    if len(set(bids)) != len(bids) or not bids:
        raise ConfigError(f"benefactor ids must be distinct, and at least one: {list(bids)}")
    if not 1 <= replication <= min(len(bids), MAX_REPLICATION):
        raise ConfigError(f"replication must be 1..{min(len(bids), MAX_REPLICATION)} (the "
                          f"copies of a chunk are on distinct benefactors), got {replication}")
    if files < 1 or chunks < 0 or per_dir < 1:
        raise ConfigError(f"need files >= 1, chunks >= 0, per_dir >= 1; got files={files}, "
                          f"chunks={chunks}, per_dir={per_dir}")
    if not 1 <= chunk_size <= MAX_CHUNK_BYTES:
        raise ConfigError(f"chunk size must be 1..{MAX_CHUNK_BYTES} bytes, got {chunk_size}")
    plan = _Plan(chunks, files, per_dir, chunk_size, replication, bids, time.time_ns())
    if plan.directories > per_dir:
        raise ConfigError(f"{files} files in directories of {per_dir} take {plan.directories} "
                          f"directories, more than {per_dir} in /synthetic: raise per_dir")
    if plan.chunk_range(0)[1] * chunk_size > MAX_FILE_SIZE:
        raise ConfigError(f"files of {plan.chunk_range(0)[1]} chunks of {chunk_size} bytes "
                          f"are over the largest file mosafs stores ({MAX_FILE_SIZE} bytes)")
    return plan


def _check_empty(data_dir: Path) -> None:
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        raise ConfigError(f"{data_dir} is not an empty directory: the synthetic store is "
                          f"generated into a new one (remove it first)")


def _chunk_ids(seed: int, count: int) -> bytes:
    """COUNT ids, chunk n's at bytes 32n..32n+32: BLAKE3's extendable output keyed by
    SEED. One call makes all of them (320 MB for 10 million, in a fraction of a second)."""
    hasher = blake3.blake3(seed.to_bytes(8, "big", signed=True), key=_ID_KEY)
    return hasher.digest(length=ID_LEN * count)


def _sorted_ids(ids: bytes) -> bytes:
    """IDS in key order (LMDB compares keys bytewise, as numpy compares S32 values), so
    that the chunk index can be appended. A repeated id would break the refcounts: 256
    random bits make it impossible in practice, and this makes sure."""
    ordered = np.sort(np.frombuffer(ids, dtype=f"S{ID_LEN}"))
    if len(ordered) > 1 and bool((ordered[1:] == ordered[:-1]).any()):
        raise ConfigError("two synthetic chunk ids are equal: try another seed")
    return ordered.tobytes()


def _in_transaction(store: MetadataStore, body: Callable[[Tx], None]) -> None:
    """BODY in one write transaction of the store. A transaction that found the map full
    was aborted whole and the map has grown since (MapGrown): BODY runs again."""
    while True:
        try:
            with store.transaction(write=True) as tx:
                body(tx)
            return
        except MapGrown:
            continue


def _register(store: MetadataStore, plan: _Plan) -> None:
    """Every benefactor id registered (as a benefactor's first registration), and the
    default pool's replication the chunks' number of copies, so that the manager finds
    them fully replicated (once their holders are alive)."""
    for i, bid in enumerate(plan.benefactors):
        copies = plan.copies_on(i)
        store.register_benefactor(bid, address=f"127.0.0.1:{i + 1}", pool=DEFAULT_POOL,
                                  capacity_bytes=CAPACITY,
                                  free_bytes=max(0, CAPACITY - copies * plan.chunk_size),
                                  chunks=copies)
    store.update_pool(DEFAULT_POOL, replication=plan.replication)


def _write_directories(store: MetadataStore, plan: _Plan) -> list[int]:
    """/synthetic and its subdirectories, as Mkdir makes them; their inode numbers."""
    dirs: list[int] = []

    def body(tx: Tx) -> None:
        dirs.clear()  # a rerun starts over
        top = _mkdir(tx, ROOT_INODE, TOP, plan.now, subdirs=plan.directories)
        for d in range(plan.directories):
            dirs.append(_mkdir(tx, top, plan.dir_name(d), plan.now, subdirs=0))
    _in_transaction(store, body)
    return dirs


def _mkdir(tx: Tx, parent: int, name: bytes, now: int, *, subdirs: int) -> int:
    """Directory NAME in PARENT with SUBDIRS subdirectories to come (its nlink counts
    them, as their Mkdirs would); the parent's nlink and times as Mkdir leaves them."""
    ino = tx.allocate_inode()
    tx.put_inode(ino, metadata_pb2.InodeRecord(
        kind=DIRECTORY, mode=DIR_MODE, nlink=2 + subdirs, atime_ns=now, mtime_ns=now,
        ctime_ns=now, parent=parent, name=name))
    tx.link(parent, name, ino)
    if parent == ROOT_INODE:  # the subdirectories' parent is counted where it is made
        root = tx.directory(ROOT_INODE)
        root.nlink += 1
        root.mtime_ns = root.ctime_ns = now
        tx.put_inode(ROOT_INODE, root)
    return ino


def _write_files(store: MetadataStore, plan: _Plan, ids: bytes, dirs: list[int],
                 say: Callable[[str], None]) -> None:
    """Every file, FILES_PER_BATCH per write transaction, in inode order (so inodes,
    entries, versions and block-maps are all written in key order)."""
    versions: dict[int, metadata_pb2.VersionRecord] = {}  # by chunk count: 2 kinds
    started = time.monotonic()
    for first in range(0, plan.files, FILES_PER_BATCH):
        last = min(first + FILES_PER_BATCH, plan.files)

        def body(tx: Tx, first: int = first, last: int = last) -> None:
            for i in range(first, last):
                _create_file(tx, plan, ids, dirs[i // plan.per_dir], i, versions)
        _in_transaction(store, body)
        say(f"files: {last}/{plan.files} ({time.monotonic() - started:.1f} s)")


def _create_file(tx: Tx, plan: _Plan, ids: bytes, parent: int, i: int,
                 versions: dict[int, metadata_pb2.VersionRecord]) -> None:
    """File I as Create and then CommitVersion of a fresh write leave it."""
    name = plan.file_name(i)
    ino = tx.allocate_inode()
    rec = metadata_pb2.InodeRecord(kind=REGULAR, mode=FILE_MODE, nlink=1,
                                   atime_ns=plan.now, mtime_ns=plan.now, ctime_ns=plan.now,
                                   parent=parent, name=name)
    tx.link(parent, name, ino)
    start, count = plan.chunk_range(i)
    entries: list[ChunkEntry] = [(ids[o:o + ID_LEN], plan.chunk_size)
                                 for o in range(start * ID_LEN, (start + count) * ID_LEN,
                                                ID_LEN)]
    vrec = versions.get(count)
    if vrec is None:
        vrec = versions[count] = _version_record(plan, count)
    # The commit's own writer: version record, block-map, inode (newest_version, size,
    # mtime, ctime) in one go.
    VersionOps._add_version(tx, ino, rec, vrec, entries)


def _version_record(plan: _Plan, count: int) -> metadata_pb2.VersionRecord:
    """The VersionRecord a commit of COUNT chunks that this write stored (no base, every
    chunk new to the cluster, each sent once) writes."""
    size = count * plan.chunk_size
    return metadata_pb2.VersionRecord(
        size=size, chunks=count, new_bytes=size, commit_time_ns=plan.now,
        mtime_ns=plan.now, stored_chunks=count, stored_bytes=size)


def _write_chunk_index(store: MetadataStore, plan: _Plan, ordered: bytes,
                       say: Callable[[str], None]) -> None:
    """One record per chunk, in key order, CHUNKS_PER_BATCH per write transaction,
    appended (the index is empty before, and each batch starts past the last)."""
    n = len(plan.benefactors)
    # Records differ only by their holders, which repeat every n ranks: n values, each
    # serialised once (the record a commit's _reference_chunk writes: pool "" = default).
    values = [metadata_pb2.ChunkRecord(length=plan.chunk_size, refcount=1,
                                       benefactor_ids=plan.holders(rank)).SerializeToString()
              for rank in range(n)]
    started = time.monotonic()
    for first in range(0, plan.chunks, CHUNKS_PER_BATCH):
        last = min(first + CHUNKS_PER_BATCH, plan.chunks)

        def body(tx: Tx, first: int = first, last: int = last) -> None:
            pairs = ((ordered[k * ID_LEN:(k + 1) * ID_LEN], values[k % n])
                     for k in range(first, last))
            _, added = tx.txn.cursor(db=tx.db.chunks).putmulti(pairs, append=True)
            if added != last - first:
                raise RuntimeError(f"chunk index: {added} of {last - first} records appended")
        _in_transaction(store, body)
        say(f"chunk records: {last}/{plan.chunks} ({time.monotonic() - started:.1f} s)")


def _write_holdings(store: MetadataStore, plan: _Plan, ordered: bytes,
                    say: Callable[[str], None]) -> None:
    """The holdings index (what each benefactor holds: holding_key(benefactor, chunk) for
    every copy a record names), one benefactor after the other in key order, appended,
    CHUNKS_PER_BATCH entries per write transaction."""
    started = time.monotonic()
    done = 0
    by_key = sorted(range(len(plan.benefactors)),
                    key=lambda i: holding_prefix(plan.benefactors[i]))
    for index in by_key:
        bid = plan.benefactors[index]
        ranks = plan.ranks_on(index)
        for first in range(0, len(ranks), CHUNKS_PER_BATCH):
            part: list[int] = ranks[first:first + CHUNKS_PER_BATCH].tolist()

            def body(tx: Tx, bid: str = bid, part: list[int] = part) -> None:
                pairs = ((holding_key(bid, ordered[k * ID_LEN:(k + 1) * ID_LEN]), b"")
                         for k in part)
                _, added = tx.txn.cursor(db=tx.db.holdings).putmulti(pairs, append=True)
                if added != len(part):
                    raise RuntimeError(f"holdings index: {added} of {len(part)} entries "
                                       f"appended")
            _in_transaction(store, body)
            done += len(part)
            say(f"holdings: {done}/{plan.chunks * plan.replication} "
                f"({time.monotonic() - started:.1f} s)")


# -- command line -----------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mosafs.bench.synthetic",
        description="Generate a synthetic manager data directory (files, versions, chunk "
                    "records, benefactor registrations) straight into LMDB, for the "
                    "manager's scale benchmark. Prints its figures as JSON.")
    count = bounded_int(0)
    parser.add_argument("--chunks", type=count, required=True, help="chunk records")
    parser.add_argument("--files", type=bounded_int(1), required=True, help="regular files")
    parser.add_argument("--benefactors", required=True, metavar="ID,ID,...",
                        help="benefactor ids that hold the copies, comma-separated")
    parser.add_argument("--replication", type=bounded_int(1, MAX_REPLICATION), default=2,
                        help="copies of each chunk, on distinct benefactors (default 2)")
    parser.add_argument("--chunk-size", type=byte_size(1, MAX_CHUNK_BYTES), default=MiB,
                        metavar="SIZE", help="length of every chunk (default 1M)")
    parser.add_argument("--per-dir", type=bounded_int(1), default=1000,
                        help="at most this many entries in a directory (default 1000)")
    parser.add_argument("--seed", type=count, default=0, help="seed of the chunk ids")
    parser.add_argument("--map-size", type=byte_size(MiB), default=DEFAULT_MAP_SIZE,
                        metavar="SIZE", help="the store's ceiling, as mosafs manager "
                        "--map-size (default 16G)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("data_dir", type=Path, metavar="DATA_DIR",
                        help="a new or empty directory (mosafs manager --data-dir)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)
    try:
        figures = generate(args.data_dir, chunks=args.chunks, files=args.files,
                           benefactors=[b for b in args.benefactors.split(",") if b],
                           replication=args.replication, chunk_size=args.chunk_size,
                           per_dir=args.per_dir, seed=args.seed, map_size=args.map_size,
                           progress=None if args.quiet else progress)
    except MosafsError as exc:
        parser.error(str(exc))  # one line, exit code 2
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
