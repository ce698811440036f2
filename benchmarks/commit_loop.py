"""Commits of small files through a mount, by N processes at once: each writes FILES
new files of 64 `os.write` calls of 4 KiB (random bytes) and closes them, close() timed
(it returns once the chunks' copies are stored and the version committed). Prints
commits/s and close() p50 / p99. The quickest look at the commit phase of `mosafs bench
metadata` (which runs it on a cluster with `--chunker fixed:4096`, 64 chunks per file).

    python3 benchmarks/commit_loop.py MOUNT/DIR FILES_PER_PROCESS PROCESSES
"""

from __future__ import annotations

import os
import statistics
import sys
import time

WRITES = 64
WRITE_BYTES = 4096


def _writer(folder: str, p: int, files: int, out: int) -> None:
    lat = []
    for i in range(files):
        fd = os.open(os.path.join(folder, f"p{p}-{i}"), os.O_CREAT | os.O_WRONLY | os.O_EXCL,
                     0o644)
        for _ in range(WRITES):
            os.write(fd, os.urandom(WRITE_BYTES))
        started = time.monotonic()
        os.close(fd)
        lat.append(time.monotonic() - started)
    os.write(out, (" ".join(f"{x:.6f}" for x in lat) + "\n").encode())


def main() -> int:
    folder, files, processes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.makedirs(folder, exist_ok=True)
    r, w = os.pipe()
    started = time.monotonic()
    pids = []
    for p in range(processes):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _writer(folder, p, files, w)
            os._exit(0)
        pids.append(pid)
    os.close(w)
    with os.fdopen(r) as f:
        lat = sorted(float(x) for x in f.read().split())
    failed = sum(os.waitpid(pid, 0)[1] != 0 for pid in pids)
    elapsed = time.monotonic() - started
    if not lat:
        print("no commit finished")
        return 1
    p99 = lat[max(0, int(0.99 * len(lat)) - 1)]
    print(f"{len(lat) / elapsed:.1f} commits/s, close p50 {1e3 * statistics.median(lat):.1f} "
          f"ms p99 {1e3 * p99:.1f} ms" + (f", {failed} processes FAILED" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
