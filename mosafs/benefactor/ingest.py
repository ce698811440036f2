"""An ingest rate limit (`mosafs benefactor --ingest-rate`): the benefactor takes chunk
bytes no faster than a link of that rate would carry them.

It models a FIFO link: each put of N bytes holds the link for N / RATE seconds after the
puts before it, and its answer waits until then. The client keeps a bounded number of puts
in flight, so the wait is back-pressure and a writer's throughput to this benefactor is
the rate. Used where link emulation with network namespaces is not available (benchmarks on
machines without iproute2), and to keep a benefactor from taking all of a shared link.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class IngestLimiter:
    def __init__(self, rate_bytes_s: int, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if rate_bytes_s <= 0:
            raise ValueError("an ingest rate must be positive")
        self.rate = rate_bytes_s
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._free_at = 0.0  # when the link has carried every put before

    def take(self, nbytes: int) -> float:
        """Wait until NBYTES have crossed the link; returns the seconds waited."""
        with self._lock:
            now = self._clock()
            self._free_at = max(now, self._free_at) + nbytes / self.rate
            done = self._free_at
        wait = done - now
        if wait > 0:
            self._sleep(wait)
        return max(wait, 0.0)
