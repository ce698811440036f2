"""Block-map commits of a checkpoint series through the manager, in process (docs/benchmarks.md,
"Metadata", "A commit's references"): a file of CHUNKS chunks committed once, then STEPS
versions in which CHANGED of its chunks are new and the rest references to stored chunks
(what a 90 %-unchanged checkpoint step commits). Real LMDB in a temporary directory on the
disk given (sync and metasync on), the Manager's group committer, no RPC.

    .venv/bin/python benchmarks/commit_refs.py [--chunks 1024] [--changed 0.1] [--steps 40]
        [--dir /dev/shm]

Prints one JSON object: the commits' wall time (median, p90, ms) and the process's CPU per
commit (ms: the committer thread's, nearly all of it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mosafs.manager.core import Manager, ManagerConfig
from mosafs.manager.metadata import MetadataStore
from tests.unit.managers import Clock, cid, new_file, register


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=1024)
    ap.add_argument("--changed", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--dir", default="/dev/shm")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as work, \
            MetadataStore(Path(work) / "m.lmdb", map_size=1 << 30) as store:
        mgr = Manager(store, ManagerConfig(heartbeat_interval_s=1, benefactor_lease_s=5,
                                           write_lease_s=60), clock=Clock())
        register(mgr, "b1")
        register(mgr, "b2", port=7001)
        inode = new_file(store, "f")
        base = [(cid(i), 1 << 20) for i in range(args.chunks)]
        commit(mgr, inode, base)
        new = int(args.chunks * args.changed)
        walls, cpu = [], 0.0
        for step in range(1, args.steps + 1):
            chunks = [(cid(step * 10_000_000 + i), 1 << 20) if i < new else base[i]
                      for i in range(args.chunks)]
            started = time.process_time()
            walls.append(commit(mgr, inode, chunks))
            cpu += time.process_time() - started
    walls.sort()
    print(json.dumps({
        "chunks": args.chunks, "changed": args.changed, "steps": args.steps,
        "commit_ms": {"p50": round(statistics.median(walls) * 1e3, 2),
                      "p90": round(walls[int(0.9 * (len(walls) - 1))] * 1e3, 2)},
        "cpu_ms_per_commit": round(cpu / args.steps * 1e3, 2)}))


def commit(mgr: Manager, inode: int, chunks: list[tuple[bytes, int]]) -> float:
    """One write session; the commit's wall time (the new chunks placed on b1 and b2)."""
    lease = mgr.open_write(inode, "bench")
    new = [c for c, _ in chunks if mgr.store.chunk(c) is None]
    started = time.perf_counter()
    mgr.commit_version(lease.lease_id, inode, chunks, [(c, ["b1", "b2"]) for c in new])
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
