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
commits. Each is announced to the committer first (ANNOUNCE), so that one group waits for
them all instead of committing whichever came first. Domain code: no grpc; the servicer
turns each MosafsError into an outcome.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from mosafs.errors import InvalidArgument, MosafsError

MAX_OPS = 256  # operations in one batch (the mount sends at most 64)
WRITE_THREADS = 64  # writes of batches running at once: enough to fill a commit group
# Writes of one batch announced to the group committer: no more than can run at once, or
# the group would wait (up to groupcommit.GATHER_S) for writes still queued for a thread.
ANNOUNCED_MAX = WRITE_THREADS // 2

Op = Callable[[Any], Any]
Announce = Callable[[], AbstractContextManager[Any]]


class Batches:
    """Runs batches of operations: READS and WRITES map an operation's name (the BatchOp
    oneof field) to the function that answers its request. ANNOUNCE: a context for one
    write to run in, telling the group committer it comes (MetadataStore.announce_write)."""

    def __init__(self, reads: Mapping[str, Op], writes: Mapping[str, Op], *,
                 announce: Announce | None = None, threads: int = WRITE_THREADS) -> None:
        self._reads = dict(reads)
        self._writes = dict(writes)
        self._announce = announce
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
        running = self._start(self._reads_answered(ops, writes, results))
        for i, future in running:
            results[i] = future.result()
        return results

    def _reads_answered(self, ops: Sequence[Any], writes: bool,
                        results: list[Any]) -> list[tuple[int, Op, Any]]:
        """Answer in RESULTS every operation but the writes to run: (index, function,
        request) of each of those."""
        writing: list[tuple[int, Op, Any]] = []
        for i, op in enumerate(ops):
            which = op.WhichOneof("op")
            if which in self._writes and not writes:
                results[i] = InvalidArgument(f"operation {i} ({which}) changes metadata: it "
                                             f"belongs in a Batch call, not a BatchRead")
            elif which in self._writes:
                writing.append((i, self._writes[which], getattr(op, which)))
            elif which in self._reads:
                results[i] = _attempt(self._reads[which], getattr(op, which))
            else:
                results[i] = InvalidArgument(f"operation {i} of the batch is empty or of a "
                                             f"kind this manager does not know")
        return writing

    def _start(self, writing: list[tuple[int, Op, Any]]) -> list[tuple[int, Future[Any]]]:
        """Each write of WRITING started in the pool, announced (_tickets)."""
        tickets = self._tickets(len(writing))
        running: list[tuple[int, Future[Any]]] = []
        try:
            for (i, fn, request), ticket in zip(writing, tickets, strict=True):
                # The acting caller lives in a context variable: each thread takes a copy.
                running.append((i, self._pool.submit(contextvars.copy_context().run,
                                                     _announced, ticket, fn, request)))
        except BaseException:  # not started (the pool is shut down): nothing will come
            for ticket in tickets[len(running):]:
                with ticket:
                    pass
            raise
        return running

    def _tickets(self, count: int) -> list[AbstractContextManager[Any]]:
        """A context for each of COUNT writes to run in: the first ANNOUNCED_MAX announced
        to the group committer, all before any is started (so that the group the first
        joins waits for the others), where there are several."""
        announce = self._announce if count > 1 else None
        announced = [announce() for _ in range(min(count, ANNOUNCED_MAX))] if announce else []
        return [*announced, *[nullcontext()] * (count - len(announced))]

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _announced(ticket: AbstractContextManager[Any], fn: Op, request: Any) -> Any:
    with ticket:
        return _attempt(fn, request)


def _attempt(fn: Op, request: Any) -> Any:
    try:
        return fn(request)
    except MosafsError as exc:
        # Its traceback's frames hold the operation's read transaction, and py-lmdb keeps
        # a transaction's reader slot until the object is freed: 16 batches of 256 refused
        # lookups kept alive until answered would fill the reader table.
        return exc.with_traceback(None)
