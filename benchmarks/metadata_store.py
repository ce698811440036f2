"""Creates per second of the manager's metadata store alone, in process (docs/benchmarks.md,
"Metadata"): THREADS threads each creating FILES empty files in a directory of its own,
through `MetadataStore.create` (real LMDB, sync and metasync on, in a temporary directory
on the disk given), once with group commit (the store as it is) and once with each create
in a write transaction of its own (what the store did before), for comparison. No RPC, no
mount: what the store can give the layers above it.

    .venv/bin/python benchmarks/metadata_store.py [--threads 1,8,16] [--files 300] [--dir /tmp]

Prints one JSON object: per mode and thread count, creates/s, latency p50/p99 in ms, and
the commits (groups) the committer made.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mosafs.manager.metadata import MetadataStore, base
from mosafs.manager.metadata.tx import Tx

GROUPED = base.StoreBase._grouped


def _inline(self: base.StoreBase, body: Callable[[Tx], Any], *, grows: bool = False) -> Any:
    """One write transaction per operation, in the caller's thread."""
    with self._write(grows=grows) as tx:
        return body(tx)


def run(mode: str, threads_list: list[int], files: int, where: str) -> list[dict[str, Any]]:
    base.StoreBase._grouped = GROUPED if mode == "group_commit" else _inline  # type: ignore[method-assign]
    out = []
    with tempfile.TemporaryDirectory(dir=where) as tmp, MetadataStore(Path(tmp) / "m") as store:
        for threads in threads_list:
            dirs = [store.mkdir(1, f"d{threads}-{i}", 0o755).inode for i in range(threads)]
            groups = store._committer.groups

            def work(i: int, dirs: list[int] = dirs) -> list[float]:
                lat = []
                for k in range(files):
                    t = time.perf_counter()
                    store.create(dirs[i], f"f{k}", 0o644)
                    lat.append(time.perf_counter() - t)
                return lat

            started = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                lats = sorted(x for one in pool.map(work, range(threads)) for x in one)
            elapsed = time.perf_counter() - started
            out.append({"mode": mode, "threads": threads, "creates": len(lats),
                        "creates_per_s": round(len(lats) / elapsed),
                        "p50_ms": round(lats[len(lats) // 2] * 1e3, 3),
                        "p99_ms": round(lats[int(len(lats) * 0.99)] * 1e3, 3),
                        "commits": store._committer.groups - groups})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,8,16")
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    counts = [int(x) for x in args.threads.split(",")]
    rows = run("one_per_operation", counts, args.files, args.dir)
    rows += run("group_commit", counts, args.files, args.dir)
    print(json.dumps({"benchmark": "metadata store creates", "files_per_thread": args.files,
                      "dir": args.dir, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
