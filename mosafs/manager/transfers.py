"""What the manager's two repairers (replication, mosafs.manager.replication; fragments,
mosafs.manager.ec_repair) share about the transfers they ask benefactors for: the copy
call's shape, a transfer's deadline, and the rate of finished transfers."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from mosafs.manager.registry import Clock

MiB = 1 << 20
RATE_WINDOW_S = 10.0
# copy(source address, target address, ids, timeout) -> (copied[i] for each id, the
# target's problem: "" | "unreachable" | "full")
CopyFn = Callable[[str, str, Sequence[bytes], float], tuple[list[bool], str]]


class RateWindow:
    """Bytes per second over the last RATE_WINDOW_S of finished transfers (the callers
    hold their own lock around it)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._done: deque[tuple[float, int]] = deque()  # (clock, bytes)

    def add(self, nbytes: int) -> None:
        self._done.append((self._clock(), nbytes))

    def rate(self) -> float:
        now = self._clock()
        while self._done and self._done[0][0] < now - RATE_WINDOW_S:
            self._done.popleft()
        if not self._done:
            return 0.0
        return sum(n for _, n in self._done) / max(now - self._done[0][0], 1.0)
# Deadline of one copy request: a floor for connecting and a slow disk, plus its bytes at a
# rate well below what any benefactor sustains.
COPY_DEADLINE_FLOOR_S = 10.0
COPY_DEADLINE_RATE = 4 * MiB


def copy_deadline(nbytes: int) -> float:
    return COPY_DEADLINE_FLOOR_S + nbytes / COPY_DEADLINE_RATE
