"""A benefactor store's own cost per put, in process (docs/benchmarks.md, "A put's own
cost"): `FileChunkStore.put` of COUNT distinct blobs of SIZE bytes, one thread, in a
temporary store under DIR (tmpfs or a disk), after 50 puts to warm it; then the same blobs
again (each found present). No RPC: what a put costs the benefactor's process itself.

    .venv/bin/python benchmarks/put_cost.py [--size 4096] [--count 3000] [--dir /dev/shm]

Prints one JSON object: wall and CPU microseconds per new put, and per present put.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mosafs.benefactor.chunkstore import FileChunkStore
from mosafs.ids import chunk_id

WARM = 50


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--dir", default="/dev/shm")
    args = ap.parse_args()
    base = os.urandom(args.size)
    blobs = []
    for i in range(args.count + WARM):
        blob = i.to_bytes(8, "little") + base[8:]
        blobs.append((chunk_id(blob), memoryview(blob)))
    with tempfile.TemporaryDirectory(dir=args.dir) as work, FileChunkStore(work) as store:
        for raw, view in blobs[:WARM]:
            store.put(raw, view)
        new = timed(store, blobs[WARM:])
        present = timed(store, blobs[WARM:])
    print(json.dumps({"size": args.size, "count": args.count, "dir": args.dir,
                      "new_us": new, "present_us": present}))


def timed(store: FileChunkStore, blobs: list[tuple[bytes, memoryview]]) -> dict[str, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for raw, view in blobs:
        store.put(raw, view)
    n = len(blobs)
    return {"wall": round((time.perf_counter() - wall) / n * 1e6, 1),
            "cpu": round((time.process_time() - cpu) / n * 1e6, 1)}


if __name__ == "__main__":
    main()
