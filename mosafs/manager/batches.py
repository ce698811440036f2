"""Batched metadata calls (docs/client.md, "Batched metadata calls"): the operations of one
Batch RPC, each run as its own RPC would run it (the same permission checks, the same
acting uid and groups) and answered on its own, so that one refused operation fails only
itself.

Why batches: a small gRPC call costs this Python server about 0.25-0.37 ms of CPU before
any metadata work (benchmarks/grpc_unary.py; docs/benchmarks.md, "Metadata"), more than a
lookup or a create itself. A batch of 8 pays it once.

Reads run one after another in the calling thread (LMDB read transactions, microseconds
each). Writes run side by side in a pool of threads so that they share group commits
(mosafs.manager.groupcommit): run one after the other, N creates would wait for N
commits. Domain code: no grpc; the servicer turns each MosafsError into an outcome.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mosafs.errors import InvalidArgument, MosafsError

MAX_OPS = 256  # operations in one batch (the mount sends at most 64)
WRITE_THREADS = 32  # writes of batches running at once: enough to fill a commit group

Op = Callable[[Any], Any]


class Batches:
    """Runs batches of operations: READS and WRITES map an operation's name (the BatchOp
    oneof field) to the function that answers its request."""

    def __init__(self, reads: Mapping[str, Op], writes: Mapping[str, Op], *,
                 threads: int = WRITE_THREADS) -> None:
        self._reads = dict(reads)
        self._writes = dict(writes)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="batch-write")

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
        running: list[tuple[int, Future[Any]]] = []
        for i, op in enumerate(ops):
            which = op.WhichOneof("op")
            if which in self._writes and not writes:
                results[i] = InvalidArgument(f"operation {i} ({which}) changes metadata: it "
                                             f"belongs in a Batch call, not a BatchRead")
            elif which in self._writes:
                # The acting caller lives in a context variable: the thread takes a copy.
                context = contextvars.copy_context()
                running.append((i, self._pool.submit(context.run, _attempt, self._writes[which],
                                                     getattr(op, which))))
            elif which in self._reads:
                results[i] = _attempt(self._reads[which], getattr(op, which))
            else:
                results[i] = InvalidArgument(f"operation {i} of the batch is empty or of a "
                                             f"kind this manager does not know")
        for i, future in running:
            results[i] = future.result()
        return results

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _attempt(fn: Op, request: Any) -> Any:
    try:
        return fn(request)
    except MosafsError as exc:
        # Its traceback's frames hold the operation's read transaction, and py-lmdb keeps
        # a transaction's reader slot until the object is freed: 16 batches of 256 refused
        # lookups kept alive until answered would fill the reader table.
        return exc.with_traceback(None)
