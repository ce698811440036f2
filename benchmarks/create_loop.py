"""Creates of empty files through a mount, by N processes, each in a directory of its own
(or all in one, with `shared`): the quickest A/B of a change on the create path (`mosafs
bench metadata` is the full benchmark). Prints creates/s, and how many processes failed
(an errno, say).

    python3 benchmarks/create_loop.py MOUNT/DIR FILES_PER_PROCESS PROCESSES [shared]
"""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    folder, files, processes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    shared = sys.argv[4:] == ["shared"]
    os.makedirs(folder, exist_ok=True)
    pids = []
    started = time.monotonic()
    for p in range(processes):
        pid = os.fork()
        if pid == 0:
            mine = os.path.join(folder, "shared" if shared else f"p{p}")
            os.makedirs(mine, exist_ok=True)
            for i in range(files):
                os.close(os.open(os.path.join(mine, f"f{p}-{i}"),
                                 os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            os._exit(0)
        pids.append(pid)
    failed = sum(os.waitpid(pid, 0)[1] != 0 for pid in pids)
    rate = files * processes / (time.monotonic() - started)
    print(f"{rate:.0f} creates/s" + (f", {failed} processes FAILED" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
