"""The first close after a mount starts, against the next one, and a loop of small writes:
what a job pays for its first checkpoint after `mosafs up`, and the per-write(2) cost of
a mount. Run on a mount just started (nothing written through it yet):

    python3 benchmarks/first_close.py MOUNT/DIR [WRITES]

Prints, each file being 64 writes of 4 KiB closed at once: the first close and the second
(ms), then WRITES (default 4,000) writes of 4 KiB into one file, best of 3 (us a write).
"""

from __future__ import annotations

import os
import sys
import time

BLOCK = 4096


def _file(path: str, writes: int) -> tuple[float, float]:
    """Seconds for WRITES writes of BLOCK bytes into a new PATH, and for its close."""
    block = os.urandom(BLOCK)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    started = time.perf_counter()
    for _ in range(writes):
        os.write(fd, block)
    written = time.perf_counter()
    os.close(fd)
    return written - started, time.perf_counter() - written


def main() -> int:
    folder = sys.argv[1]
    writes = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
    os.makedirs(folder, exist_ok=True)
    first = _file(os.path.join(folder, "first"), 64)[1]
    second = _file(os.path.join(folder, "second"), 64)[1]
    loop = min(_file(os.path.join(folder, f"loop{r}"), writes)[0] for r in range(3))
    print(f"first close {1e3 * first:.1f} ms, second {1e3 * second:.1f} ms; "
          f"{1e6 * loop / writes:.1f} us a {BLOCK}-byte write")
    return 0


if __name__ == "__main__":
    sys.exit(main())
