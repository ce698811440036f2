"""Batched metadata calls (docs/client.md, "Batched metadata calls"): the operations of one
Batch RPC, each checked as its own RPC would be (the same permission checks, the same
acting uid and groups) and answered on its own, so that one refused operation fails only
itself.

Why batches: a small gRPC call costs this Python server about 0.25-0.37 ms of CPU before
any metadata work (benchmarks/grpc_unary.py; docs/benchmarks.md, "Metadata"), more than a
lookup or a create itself. A batch of 8 pays it once.

Everything runs in the thread that answers the RPC. Reads run one after another (LMDB read
transactions, microseconds each). Writes are planned one after another (checked, their
write made ready: a `Planned`), then run all together in one group commit
(MetadataStore.run_planned): one durable commit for the batch, and no thread per write to
hand each to the committer and wait for it (docs/benchmarks.md, "A batch's writes
without a thread each"). Domain code: no grpc; the servicer turns each MosafsError into
an outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mosafs.errors import InvalidArgument, MosafsError
from mosafs.manager.metadata import Planned

MAX_OPS = 256  # operations in one batch (the mount sends at most 64)

Op = Callable[[Any], Any]
Plan = Callable[[Any], Planned[Any]]
RunPlanned = Callable[[Sequence[Planned[Any]]], list[Any]]


class Batches:
    """Runs batches of operations: READS maps an operation's name (the BatchOp oneof field)
    to the function that answers its request, WRITES to the one that plans it, and RUN
    runs a batch's plans in one group commit (MetadataStore.run_planned)."""

    def __init__(self, reads: Mapping[str, Op], writes: Mapping[str, Plan],
                 run: RunPlanned) -> None:
        self._reads = dict(reads)
        self._writes = dict(writes)
        self._run = run

    def run(self, ops: Sequence[Any], *, writes: bool = True) -> list[Any]:
        """Each operation's answer, or the MosafsError that refused it, in order.
        InvalidArgument for a batch that is empty or too long; without WRITES (a batch the
        channel may send twice) a write is refused, alone. A bug in an operation is raised
        (after the other writes ended)."""
        if not ops:
            raise InvalidArgument("a batch needs at least one operation")
        if len(ops) > MAX_OPS:
            raise InvalidArgument(f"a batch holds at most {MAX_OPS} operations, got {len(ops)}")
        results: list[Any] = [None] * len(ops)
        planned = self._reads_answered(ops, writes, results)
        if planned:
            answers = self._run([plan for _, plan in planned])
            for (i, _), answer in zip(planned, answers, strict=True):
                results[i] = answer
        return results

    def _reads_answered(self, ops: Sequence[Any], writes: bool,
                        results: list[Any]) -> list[tuple[int, Planned[Any]]]:
        """Answer in RESULTS every operation but the writes to run (reads, and writes
        refused while planned): (index, plan) of each of those."""
        planned: list[tuple[int, Planned[Any]]] = []
        for i, op in enumerate(ops):
            which = op.WhichOneof("op")
            if which in self._writes and not writes:
                results[i] = InvalidArgument(f"operation {i} ({which}) changes metadata: it "
                                             f"belongs in a Batch call, not a BatchRead")
            elif which in self._writes:
                plan = _attempt(self._writes[which], getattr(op, which))
                if isinstance(plan, MosafsError):
                    results[i] = plan
                else:
                    planned.append((i, plan))
            elif which in self._reads:
                results[i] = _attempt(self._reads[which], getattr(op, which))
            else:
                results[i] = InvalidArgument(f"operation {i} of the batch is empty or of a "
                                             f"kind this manager does not know")
        return planned


def _attempt(fn: Op, request: Any) -> Any:
    try:
        return fn(request)
    except MosafsError as exc:
        # Its traceback's frames hold the operation's read transaction, and py-lmdb keeps
        # a transaction's reader slot until the object is freed: 16 batches of 256 refused
        # lookups kept alive until answered would fill the reader table.
        return exc.with_traceback(None)
