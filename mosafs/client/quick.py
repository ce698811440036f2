"""Trio's lock and capacity limiter, taken without a trip through the scheduler when free.

`async with trio.Lock()` yields to trio's scheduler even when the lock is free (its
`acquire` ends in a checkpoint), and so does a capacity limiter's. On the mount's hot
paths (the session lock of open, flush and release; the limiter of every manager call)
each such yield is one more pass of trio's run loop, with its epoll call: about 16 task
steps and 11.5 passes per empty file created, against 10 for the five FUSE requests
themselves (docs/benchmarks.md, "The mount's scheduler passes"). These take a free lock
or a free token at once and wait, as trio does, only when they must. Cancellation is
still seen at the next checkpoint of the code that holds them (every RPC and every wait
is one).
"""

from __future__ import annotations

from types import TracebackType

import trio


class Quick:
    """`async with` of HELD, a trio.Lock or trio.CapacityLimiter (what has `acquire_nowait`,
    `acquire` and `release`), taken without yielding when free."""

    __slots__ = ("_held",)

    def __init__(self, held: trio.Lock | trio.CapacityLimiter) -> None:
        self._held = held

    async def __aenter__(self) -> None:
        try:
            self._held.acquire_nowait()
        except trio.WouldBlock:
            await self._held.acquire()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._held.release()


class QuickLock(Quick):
    """A lock of its own, for `async with`."""

    __slots__ = ()
    _held: trio.Lock

    def __init__(self) -> None:
        super().__init__(trio.Lock())

    def locked(self) -> bool:
        return self._held.locked()


class InodeLocks:
    """A QuickLock per inode, made at first use (`locks(inode)`) and forgotten again
    (`drop`) once nothing needs it, so that a mount keeps no lock per file it ever
    opened."""

    __slots__ = ("_locks",)

    def __init__(self) -> None:
        self._locks: dict[int, QuickLock] = {}

    def __call__(self, inode: int) -> QuickLock:
        lock = self._locks.get(inode)
        if lock is None:
            lock = self._locks[inode] = QuickLock()
        return lock

    def __len__(self) -> int:
        return len(self._locks)

    def drop(self, inode: int) -> None:
        """Forget INODE's lock unless it is held: a task waiting for a lock holds it as
        soon as it is released (trio hands it over), so a free lock has no waiter."""
        lock = self._locks.get(inode)
        if lock is not None and not lock.locked():
            del self._locks[inode]
