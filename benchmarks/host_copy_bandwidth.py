"""The host's memory bandwidth for copies made by its CPUs: N threads, each copying its own
256 MiB array into another (numpy, which releases the GIL), 8 times. Prints one JSON
object: GB/s of bytes read plus bytes written, all threads together, per thread count.

    python benchmarks/host_copy_bandwidth.py [--threads 1,2,4,8,16,24]

What it is for: telling whether a save's copies (a chunk's bytes cross host memory
several times between the GPU and a benefactor's file, docs/benchmarks.md "Two GPUs") are
bound by the host's memory.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np

SIZE = 256 << 20
REPS = 8


def _copies(src: np.ndarray, dst: np.ndarray, out: list[float], index: int) -> None:
    started = time.perf_counter()
    for _ in range(REPS):
        np.copyto(dst, src)
    out[index] = REPS * SIZE * 2 / (time.perf_counter() - started) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2,4,8,16,24")
    args = parser.parse_args()
    result: dict[str, float] = {}
    for count in (int(t) for t in args.threads.split(",")):
        pairs = [(np.ones(SIZE, np.uint8), np.zeros(SIZE, np.uint8)) for _ in range(count)]
        for src, dst in pairs:
            np.copyto(dst, src)  # every page touched before the clock starts
        rates = [0.0] * count
        threads = [threading.Thread(target=_copies, args=(src, dst, rates, i))
                   for i, (src, dst) in enumerate(pairs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        result[f"{count}_threads_GBps"] = round(sum(rates), 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
