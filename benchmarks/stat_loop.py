"""Stats of files the kernel has forgotten, through a mount, by N processes (each over the
files of its own directory, made first): the quickest A/B of a change on the mount's
lookup path (`mosafs bench metadata`'s stat_uncached phase is the full benchmark). Each
round drops the kernel's dentries and inodes first (root only), so that every stat is
one FUSE LOOKUP, which the mount answers from its cache where it holds the name. Prints
stats/s per round.

    python3 benchmarks/stat_loop.py MOUNT/DIR FILES_PER_PROCESS PROCESSES [ROUNDS] [existing]

`existing`: the files are there already and are not checked first, so that on a mount
just started (`mosafs up` stopped and started again on the same data directory) the first
round's stats are the mount's first sight of the names: each a manager call, or the
stat-ahead's listing (docs/client.md, "Stat-ahead").
"""

from __future__ import annotations

import os
import sys
import time


def _make(folder: str, files: int, processes: int) -> None:
    for p in range(processes):
        mine = os.path.join(folder, f"p{p}")
        os.makedirs(mine, exist_ok=True)
        for i in range(files):
            path = os.path.join(mine, f"f{i}")
            if not os.path.exists(path):
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def _round(folder: str, files: int, processes: int) -> float:
    if not os.path.ismount(os.path.dirname(os.path.abspath(folder))):
        raise SystemExit(f"{os.path.dirname(folder)} is not a mount point")
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")
    time.sleep(1.1)  # past the mount's attribute timeout
    pids = []
    started = time.monotonic()
    for p in range(processes):
        pid = os.fork()
        if pid == 0:
            mine = os.path.join(folder, f"p{p}")
            for i in range(files):
                os.stat(os.path.join(mine, f"f{i}"))
            os._exit(0)
        pids.append(pid)
    failed = sum(os.waitpid(pid, 0)[1] != 0 for pid in pids)
    if failed:
        raise SystemExit(f"{failed} processes failed")
    return files * processes / (time.monotonic() - started)


def main() -> int:
    folder, files, processes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    if sys.argv[5:] != ["existing"]:
        _make(folder, files, processes)
    rates = [_round(folder, files, processes) for _ in range(rounds)]
    print(" ".join(f"{r:.0f}" for r in rates), "stats/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
