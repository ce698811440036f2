"""What a put pays for making its leaf fan-out directory (docs/benchmarks.md, "A put that
makes its directory").

    python3 benchmarks/put_leaf_dirs.py syscalls [ROUNDS] [DIR]
    .venv/bin/python benchmarks/put_leaf_dirs.py store N lazy|pre [DIR]

`syscalls` (no mosafs import, so it runs on any machine with Python): the system calls of
one 1 MiB put, timed, in three orders, interleaved at random each round, every put into a
directory of its own:

- made: the leaf directory exists already (write the temporary file, fsync it, rename it
  into the leaf, fsync the leaf);
- mkdir: the leaf is made by the put after the temporary file's fsync, and its entry
  synced in the parent before the rename (the order FileChunkStore uses);
- mkdir-first: the leaf is made before the temporary file is written, and the parent
  synced after the leaf (so that one journal commit may carry both).

`store`: N distinct 1 MiB blobs put into a fresh FileChunkStore under DIR, one thread,
either with every leaf directory made beforehand and synced, untimed ("pre"), or as the
puts make them ("lazy").
"""

import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

MiB = 1 << 20


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _one_put(base: str, i: int, order: str, data: bytes) -> float:
    top = f"{base}/t{i}"
    os.mkdir(top)
    leaf = f"{top}/leaf"
    if order == "made":
        os.mkdir(leaf)
        _fsync_path(top)
    started = time.perf_counter()
    if order == "mkdir-first":
        os.mkdir(leaf)
    tmp = f"{base}/tmp{i}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if order == "mkdir":
        os.mkdir(leaf)
        _fsync_path(top)
    os.replace(tmp, f"{leaf}/chunk")
    _fsync_path(leaf)
    if order == "mkdir-first":
        _fsync_path(top)
    return time.perf_counter() - started


def syscalls(rounds: int, where: str | None) -> dict[str, object]:
    data = os.urandom(MiB)
    orders = ("made", "mkdir", "mkdir-first")
    times: dict[str, list[float]] = {o: [] for o in orders}
    base = tempfile.mkdtemp(prefix="leafdirs.", dir=where)
    try:
        i = 0
        for _ in range(rounds):
            for order in random.sample(orders, len(orders)):
                i += 1
                times[order].append(_one_put(base, i, order, data))
    finally:
        shutil.rmtree(base)
    out: dict[str, object] = {"rounds": rounds, "dir": where or tempfile.gettempdir()}
    for order, spans in times.items():
        spans.sort()
        out[order] = {"mean_us": round(sum(spans) / len(spans) * 1e6),
                      "median_us": round(spans[len(spans) // 2] * 1e6)}
    return out


def store(n: int, pre: bool, where: str | None) -> dict[str, object]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from mosafs.benefactor.chunkstore import FileChunkStore
    from mosafs.ids import chunk_id

    blobs = [os.urandom(MiB) for _ in range(n)]
    ids = [chunk_id(b) for b in blobs]
    with tempfile.TemporaryDirectory(dir=where) as d, FileChunkStore(d) as chunks:
        if pre:
            for i in ids:
                os.makedirs(os.path.dirname(chunks.path_of(i)), exist_ok=True)
            os.sync()
        wall, cpu = time.perf_counter(), time.process_time()
        for i, b in zip(ids, blobs, strict=True):
            chunks.put(i, b)
        return {"puts": n, "leaves": "pre" if pre else "lazy",
                "wall_us_per_put": round((time.perf_counter() - wall) / n * 1e6),
                "cpu_us_per_put": round((time.process_time() - cpu) / n * 1e6)}


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["syscalls"]:
        result = syscalls(int(args[1]) if len(args) > 1 else 150,
                          args[2] if len(args) > 2 else None)
    elif args[:1] == ["store"] and len(args) >= 3:
        result = store(int(args[1]), args[2] == "pre", args[3] if len(args) > 3 else None)
    else:
        sys.exit(__doc__)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
