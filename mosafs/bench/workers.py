"""Worker processes and threads of a benchmark report through a queue: tuples whose first
item says what they are ("done": a worker finished; "error": a worker failed, with its
traceback as the last item; anything else: a figure)."""

from __future__ import annotations

import queue as queues
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from mosafs.bench.procs import BenchError

POLL_S = 5.0


def collect(out: Any, workers: int, alive: Callable[[], bool]) -> list[tuple[Any, ...]]:
    """Every figure OUT brings until WORKERS workers said "done"; BenchError with a
    worker's traceback where one failed, or where one ended without a word (ALIVE()
    false with none waiting)."""
    figures: list[tuple[Any, ...]] = []
    done = 0
    while done < workers:
        try:
            item = out.get(timeout=POLL_S)
        except queues.Empty:
            if not alive():
                raise BenchError("a worker ended without reporting") from None
            continue
        if item[0] == "error":
            raise BenchError(f"a worker failed:\n{item[-1]}")
        if item[0] == "done":
            done += 1
        else:
            figures.append(item)
    return figures


@contextmanager
def running(procs: Sequence[Any], join_s: float) -> Iterator[Callable[[], bool]]:
    """PROCS (multiprocessing processes) started; inside, a test of whether all still
    run; after, each joined (killed past JOIN_S)."""
    for p in procs:
        p.start()
    try:
        yield lambda: all(p.is_alive() for p in procs)
    finally:
        for p in procs:
            p.join(timeout=join_s)
            if p.is_alive():
                p.kill()
                p.join()
