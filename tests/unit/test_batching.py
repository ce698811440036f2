"""The mount's batching of metadata calls (mosafs.client.batching): a lone call goes out as
its own RPC; calls made while the lane is busy leave together; each is answered on its
own; a failed batch fails its calls; a cancelled caller leaves no one waiting."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import trio

from mosafs.client.batching import Batcher
from mosafs.errors import NotFound, Unavailable


class Transport:
    """Answers op N with N * 10 (an op < 0: NotFound) after DELAY; records every call."""

    def __init__(self, delay: float = 0.01) -> None:
        self.delay = delay
        self.singles: list[int] = []
        self.batches: list[list[int]] = []
        self.fail_batches: Exception | None = None

    def single(self, op: int) -> Any:
        async def run() -> int:
            self.singles.append(op)
            await trio.sleep(self.delay)
            if op < 0:
                raise NotFound(f"op {op}")
            return op * 10

        return run

    async def batch(self, ops: Sequence[int]) -> list[Any]:
        self.batches.append(list(ops))
        await trio.sleep(self.delay)
        if self.fail_batches is not None:
            raise self.fail_batches
        return [NotFound(f"op {op}") if op < 0 else op * 10 for op in ops]


async def _gather(batcher: Batcher, transport: Transport, ops: list[int],
                  lane: Any = "root") -> list[Any]:
    results: list[Any] = [None] * len(ops)

    async def one(i: int, op: int) -> None:
        try:
            results[i] = await batcher.call(lane, op, transport.single(op))
        except Exception as exc:
            results[i] = exc

    async with trio.open_nursery() as nursery:
        for i, op in enumerate(ops):
            nursery.start_soon(one, i, op)
    return results


@pytest.mark.parametrize("in_flight", [1, 2])
def test_concurrent_calls_leave_in_batches_and_each_gets_its_answer(in_flight: int) -> None:
    transport = Transport()
    batcher = Batcher(transport.batch, max_in_flight=in_flight, max_batch=8)
    ops = [1, 2, -3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    results = trio.run(_gather, batcher, transport, ops)
    assert [r for r in results if not isinstance(r, Exception)] == \
        [op * 10 for op in ops if op > 0]
    assert isinstance(results[2], NotFound)
    # The first IN_FLIGHT went alone; the rest in batches of at most 8, none lost or twice.
    assert len(transport.singles) >= in_flight
    sent = transport.singles + [op for b in transport.batches for op in b]
    assert sorted(sent) == sorted(ops)
    assert transport.batches and all(1 < len(b) <= 8 for b in transport.batches)
    assert batcher.batched == sum(len(b) for b in transport.batches)


def test_a_lone_call_is_its_own_rpc() -> None:
    transport = Transport()
    batcher = Batcher(transport.batch)

    async def main() -> None:
        for op in (1, 2, 3):
            assert await batcher.call("root", op, transport.single(op)) == op * 10

    trio.run(main)
    assert transport.singles == [1, 2, 3] and transport.batches == []


def test_lanes_do_not_mix() -> None:
    """A batch carries one acting identity: calls of two lanes never share one."""
    transport = Transport()
    batcher = Batcher(transport.batch, max_in_flight=1)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_gather, batcher, transport, [1, 2, 3, 4], "uid 1")
            nursery.start_soon(_gather, batcher, transport, [-11, -12, -13, -14], "uid 2")

    trio.run(main)
    assert all(all(op > 0 for op in b) or all(op < 0 for op in b) for b in transport.batches)


def test_a_failed_batch_fails_each_of_its_calls() -> None:
    transport = Transport()
    transport.fail_batches = Unavailable("manager unreachable")
    batcher = Batcher(transport.batch, max_in_flight=1)
    results = trio.run(_gather, batcher, transport, [1, 2, 3, 4, 5])
    batched = {op for b in transport.batches for op in b}
    assert batched
    for op, result in zip([1, 2, 3, 4, 5], results, strict=True):
        if op in batched:
            assert isinstance(result, Unavailable)
        else:
            assert result == op * 10


def test_cancelled_callers_leave_no_one_waiting() -> None:
    """A waiting caller cancelled is dropped from its lane; a sender cancelled fails the
    others of its batch instead of leaving them parked."""
    transport = Transport(delay=1.0)
    batcher = Batcher(transport.batch, max_in_flight=1)
    senders: list[Any] = []
    real_batch = transport.batch

    async def batch(ops: Sequence[int]) -> list[Any]:
        senders.append(trio.lowlevel.current_task())
        return await real_batch(ops)

    batcher._send_batch = batch

    async def main() -> dict[int, Any]:
        results: dict[int, Any] = {}
        scopes: dict[int, trio.CancelScope] = {op: trio.CancelScope() for op in (1, 2, 3, 4)}
        tasks: dict[Any, int] = {}

        async def one(op: int) -> None:
            tasks[trio.lowlevel.current_task()] = op
            with scopes[op]:
                try:
                    results[op] = await batcher.call("root", op, transport.single(op))
                except Unavailable as exc:
                    results[op] = exc

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for op in (1, 2, 3, 4):
                    nursery.start_soon(one, op)
                    await trio.sleep(0.01)  # 1 leaves alone, 2-4 wait in this order
                scopes[3].cancel()  # a waiter gives up: 3 never leaves
                await trio.sleep(1.1)  # 1 answered; 2 and 4 left as a batch
                assert transport.batches == [[2, 4]]
                sender = tasks[senders[0]]
                scopes[sender].cancel()  # the sender gives up: the other gets an error
        return results

    results = trio.run(main)
    assert transport.singles == [1] and results[1] == 10
    assert 3 not in results and 3 not in [op for b in transport.batches for op in b]
    # The sender, cancelled, answers nothing; the other op of its batch got an error.
    (other,) = set(results) - {1}
    assert other in (2, 4) and isinstance(results[other], Unavailable)
    assert not batcher._lanes  # nothing left behind
