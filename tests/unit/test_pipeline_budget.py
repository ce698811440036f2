"""The bytes a write stream's chunks hold between the chunking engine and their puts stay
within one window (mosafs/client/files/pipeline.py, _ByteBudget): the chunking waits
for the puts, so a worker's memory no longer grows with the file when puts are slow."""

from __future__ import annotations

import trio
import trio.testing

from mosafs.client.files.pipeline import _ByteBudget

MiB = 1 << 20


def test_taking_past_the_limit_waits_for_bytes_given_back() -> None:
    async def main() -> None:
        budget = _ByteBudget(8 * MiB)
        await budget.take(6 * MiB)
        taken = trio.Event()

        async def second() -> None:
            await budget.take(4 * MiB)  # 10 MiB would pass the limit: waits
            taken.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            assert not taken.is_set() and budget.held == 6 * MiB
            budget.give(1 * MiB)  # 9 MiB would still pass it
            await trio.testing.wait_all_tasks_blocked()
            assert not taken.is_set()
            budget.give(1 * MiB)
            await taken.wait()
        assert budget.held == 8 * MiB

    trio.run(main)


def test_a_batch_larger_than_the_limit_goes_when_nothing_is_held() -> None:
    async def main() -> None:
        budget = _ByteBudget(4 * MiB)
        await budget.take(16 * MiB)  # else a huge chunk could never be stored
        assert budget.held == 16 * MiB
        budget.give(16 * MiB)
        with trio.move_on_after(1):
            await budget.take(1)
        assert budget.held == 1

    trio.run(main)
