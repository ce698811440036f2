"""Batched metadata calls from the mount (docs/client.md, "Batched metadata calls").

A lookup, stat or create goes out alone, as its own RPC, while fewer than `max_in_flight`
calls of its lane are on their way; those that arrive while the lane is busy wait, and
leave together in one Batch RPC (at most `max_batch`) as soon as a call of the lane
returns. As with the manager's group commit, a lone call waits for nothing, and under load
the batches grow by themselves: eight processes creating files make batches of several
creates, and the manager pays its per-call cost (about 0.3 ms of CPU in Python gRPC,
docs/benchmarks.md) once per batch instead of once per file.

A lane is the acting uid and groups (mosafs.client.acting): a batch carries one in its
call's metadata, and the manager checks every operation against it. Each operation is
answered on its own: the manager's refusal of one fails that one alone. A failure of the
Batch call itself fails every operation in it, as it would have failed each of their own
calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from mosafs.errors import MosafsError, Unavailable

MAX_IN_FLIGHT = 2
MAX_BATCH = 64

# send(ops) -> for each op, its answer or the MosafsError that refused it
SendBatch = Callable[[Sequence[Any]], Awaitable[Sequence[Any]]]


@dataclass(eq=False)
class _Slot:
    op: Any                                  # the BatchOp
    single: Callable[[], Awaitable[Any]]      # the same operation as its own RPC
    done: bool = False
    value: Any = None
    error: MosafsError | None = None

    def settle(self, value: Any) -> None:
        if isinstance(value, MosafsError):
            self.error = value
        else:
            self.value = value
        self.done = True

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


@dataclass(eq=False)
class _Lane:
    pending: list[_Slot] = field(default_factory=list)
    in_flight: int = 0
    lot: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)


class Batcher:
    """Coalesces concurrent calls of one lane (trio; one event loop)."""

    def __init__(self, send_batch: SendBatch, *, max_in_flight: int = MAX_IN_FLIGHT,
                 max_batch: int = MAX_BATCH) -> None:
        self._send_batch = send_batch
        self._max_in_flight = max_in_flight
        self._max_batch = max_batch
        self._lanes: dict[Hashable, _Lane] = {}
        self.batches = 0  # Batch calls sent
        self.batched = 0  # operations they carried

    async def call(self, lane_key: Hashable, op: Any,
                   single: Callable[[], Awaitable[Any]]) -> Any:
        """OP's answer: through SINGLE (its own RPC) if the lane has room, else in a
        batch. Its MosafsError is raised."""
        lane = self._lanes.get(lane_key)
        if lane is None:
            lane = self._lanes[lane_key] = _Lane()
        slot = _Slot(op, single)
        lane.pending.append(slot)
        try:
            while not slot.done:
                if lane.pending and lane.in_flight < self._max_in_flight:
                    await self._send(lane)
                else:  # the lane is full, or SLOT left in a batch another caller sends
                    await lane.lot.park()
        except BaseException:  # cancelled before its batch left: it never will
            if slot in lane.pending:
                lane.pending.remove(slot)
            raise
        finally:
            if not lane.pending and not lane.in_flight:
                self._lanes.pop(lane_key, None)
        return slot.result()

    async def _send(self, lane: _Lane) -> None:
        """Send the lane's oldest waiting calls (this caller's among them or not)."""
        batch = lane.pending[:self._max_batch]
        del lane.pending[:len(batch)]
        lane.in_flight += 1
        try:
            if len(batch) == 1:
                try:
                    batch[0].settle(await batch[0].single())
                except MosafsError as exc:
                    batch[0].settle(exc)
            else:
                self.batches += 1
                self.batched += len(batch)
                try:
                    answers: Sequence[Any] = await self._send_batch([s.op for s in batch])
                except MosafsError as exc:
                    answers = [exc] * len(batch)
                for s, answer in zip(batch, answers, strict=True):
                    s.settle(answer)
        finally:
            lane.in_flight -= 1
            for s in batch:  # the sender was cancelled: the others must not wait forever
                if not s.done:
                    s.settle(Unavailable("the batched call was cancelled before its answer"))
            lane.lot.unpark_all()
