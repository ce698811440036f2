"""Would host-computed parity lift the two-GPU `ec:4+2` ceiling? (issue 23)

The end-to-end figure of `mosafs bench ec --parts devices` on two GPUs sits at the host's
copy ceiling: every input byte goes in, and M/K of it comes back out as parity. If the
host's CPUs coded a share F of the chunks with ISA-L, only (1 - F) * M/K would come back,
but the CPUs would read F and write F * M/K bytes of host memory themselves. This script
measures both sides on the GPUs visible here:

* the copies alone (pinned memory, every GPU at once, no kernel) with BACK x the input
  copied out at the same time, for BACK = M/K * (1 - F), F = 0, 1/4, 1/2, 3/4, 1;
* the same copies while T host threads run ISA-L 4+2 encodes of 1 MiB chunks from
  ordinary host memory, and the rate those threads reach meanwhile;
* the threads' rate with no copy running.

Run on a lent GPU machine, from the repository root (`scripts/device_env.sh` installs
the wheels):

    python benchmarks/dma_host_share.py [--threads 2,4,8] [--reps 61]

It prints one JSON object; GB/s = 10^9 bytes per second (copies: of bytes copied in).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import numpy as np

from mosafs.bench.ec_devices import _copy_both_ways
from mosafs.erasure.isal import IsalCoder

MiB = 1 << 20
K, M = 4, 2


class Encoders:
    """T threads encoding 1 MiB chunks of their own 256 MiB buffers until stopped."""

    def __init__(self, threads: int) -> None:
        self._coder = IsalCoder()
        self._stop = threading.Event()
        self._bytes = [0] * threads
        self._began = [0.0] * threads
        self._ready = threading.Barrier(threads + 1)
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True)
                         for i in range(threads)]

    def _loop(self, index: int) -> None:
        buf = np.random.default_rng(index).integers(0, 256, 256 * MiB, dtype=np.uint8)
        out = np.empty(M * (MiB // K), np.uint8)
        self._ready.wait()
        self._began[index] = time.perf_counter()
        while not self._stop.is_set():
            for off in range(0, buf.size, MiB):
                self._coder.encode(buf[off:off + MiB], K, M, out=out)
                self._bytes[index] += MiB
                if self._stop.is_set():
                    return

    def __enter__(self) -> Encoders:
        for t in self._threads:
            t.start()
        self._ready.wait()  # every buffer made: from here on the threads only encode
        time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def total(self) -> int:
        return sum(self._bytes)

    def rate(self) -> float:
        """GB/s encoded by all threads since their buffers were made."""
        now = time.perf_counter()
        return sum(n / (now - t) for n, t in zip(self._bytes, self._began, strict=True)) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="2,4,8")
    parser.add_argument("--reps", type=int, default=61)
    args = parser.parse_args()
    import cupy

    gpus = list(range(cupy.cuda.runtime.getDeviceCount()))
    threads = [int(t) for t in args.threads.split(",")]
    result: dict[str, Any] = {"gpus": len(gpus), "copy_in_GBps": {}, "with_encoders": {},
                              "encoders_alone_GBps": {}}
    for share in (0.0, 0.25, 0.5, 0.75, 1.0):
        back = M / K * (1 - share)
        result["copy_in_GBps"][f"host_share_{share}"] = round(
            _copy_both_ways(gpus, 512 * MiB, back, args.reps), 2)
    for count in threads:
        for share in (0.0, 0.5):
            with Encoders(count) as enc:
                before, start = enc.total(), time.perf_counter()
                copied = _copy_both_ways(gpus, 512 * MiB, M / K * (1 - share), args.reps)
                encoded = (enc.total() - before) / (time.perf_counter() - start) / 1e9
            result["with_encoders"][f"{count}_threads_host_share_{share}"] = {
                "copy_in_GBps": round(copied, 2), "isal_GBps": round(encoded, 2)}
    for count in threads:
        with Encoders(count) as enc:
            time.sleep(3.0)
            result["encoders_alone_GBps"][f"{count}_threads"] = round(enc.rate(), 2)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
