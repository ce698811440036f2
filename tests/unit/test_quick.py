"""mosafs.client.quick: a free lock or token is taken without yielding to trio's
scheduler; a taken one is waited for as trio waits; a lock table forgets free locks only."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from mosafs.client.quick import InodeLocks, Quick, QuickLock


def _in_trio(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    @functools.wraps(test)
    def run() -> None:
        trio.run(test)
    return run


@_in_trio
async def test_free_lock_and_token_are_taken_without_a_checkpoint() -> None:
    lock, limiter = QuickLock(), trio.CapacityLimiter(1)
    with trio.testing.assert_no_checkpoints():
        async with lock:
            assert lock.locked()
        async with Quick(limiter):
            assert limiter.borrowed_tokens == 1
    assert not lock.locked() and limiter.borrowed_tokens == 0


@_in_trio
async def test_a_held_lock_is_waited_for_and_handed_over() -> None:
    lock = QuickLock()
    order: list[str] = []

    async def second() -> None:
        async with lock:
            order.append("second")

    async with trio.open_nursery() as nursery:
        async with lock:
            nursery.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            order.append("first")  # the other task waits: the lock is ours
        await trio.testing.wait_all_tasks_blocked()
    assert order == ["first", "second"]
    assert not lock.locked()


@_in_trio
async def test_a_waiter_cancelled_leaves_the_lock_consistent() -> None:
    lock = QuickLock()
    caught: list[bool] = []

    async def impatient() -> None:
        with trio.move_on_after(0.01) as scope:
            async with lock:
                pytest.fail("took a lock that was held")
        caught.append(scope.cancelled_caught)

    async with lock, trio.open_nursery() as nursery:
        nursery.start_soon(impatient)
    assert caught == [True]
    with trio.testing.assert_no_checkpoints():
        async with lock:  # free again, and taken at once
            pass


@_in_trio
async def test_a_taken_token_is_waited_for() -> None:
    limiter = trio.CapacityLimiter(1)
    limit = Quick(limiter)
    got = trio.Event()

    async def second() -> None:
        async with limit:
            got.set()

    async with trio.open_nursery() as nursery:
        async with limit:
            nursery.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            assert not got.is_set()
        await got.wait()
    assert limiter.borrowed_tokens == 0


@_in_trio
async def test_inode_locks_forget_only_free_locks() -> None:
    locks = InodeLocks()
    first = locks(7)
    assert locks(7) is first and len(locks) == 1
    locks.drop(7)
    assert len(locks) == 0 and locks(7) is not first  # a new one after the drop

    held = locks(8)
    async with held:
        locks.drop(8)  # held: kept, or a second task could take another lock of inode 8
        assert locks(8) is held

    handed: list[bool] = []

    async def waiter() -> None:
        async with locks(9):
            await trio.sleep(0)
            handed.append(True)

    async with trio.open_nursery() as nursery:
        async with locks(9):
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
        # Released, and at once held by the waiter: the drop keeps it.
        locks.drop(9)
        assert locks(9).locked()
    assert handed == [True]
    locks.drop(9)
    locks.drop(8)
    locks.drop(7)
    locks.drop(1)  # never made: nothing to forget
    assert len(locks) == 0
