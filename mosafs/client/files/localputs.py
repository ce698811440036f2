"""Short-circuit local puts, the writer's side (docs/benefactor.md, "Local reads and
puts"): a group of blobs for a benefactor on this host goes as one memory file (memfd)
handed over its Unix socket, for a ticket its OpenLocal gave against the write token,
instead of through TLS and a gRPC message. The bytes are copied once, into the memory
file, by a worker thread (no GIL held). A benefactor elsewhere (another boot id), one
with local puts off, or a failure to reach its socket is remembered, and its puts go the
usual way; so is a group the socket did not answer (re-sending a blob is harmless).

Tickets are asked for several at a time (`put_tickets`) once a client has had more than one
group for a benefactor, doubling up to TICKETS_MAX, and kept for its next groups to that
benefactor, whichever file they belong to (each still used once, within half its life): one
OpenLocal per group cost the writer a gRPC call per 3-8 MiB stored, or per small file, and
its wait on a busy benefactor (6 ms on average in an all-new 256 MiB write on the 2-CPU
machine, docs/benchmarks.md). A write token says only that this client (its certificate)
may put chunks until it expires, whichever write it came with, so a ticket given against
one write's token allows what another's would. A kept ticket that the benefactor no longer
takes (restarted, or past its life there) costs one fresh OpenLocal, not the local puts.

Memory files are kept for the next group to the same benefactor process (`MemoryFiles`):
a new one gets every page allocated and, when closed, freed again, which cost 0.54 CPU-s
per GiB against 0.14-0.21 for rewriting a kept one (docs/benefactor.md, "Local reads and
puts"). Only the benefactor process a file went to ever sees it again, and only once it
answered for every blob of the group: a file whose hand-over failed may still be read
there and is closed. The benefactor reads each blob out before checking it, so a writer
that changes the file meanwhile cannot get unverified bytes stored
(mosafs.benefactor.puts)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio

from mosafs import errors
from mosafs.client.rpc import Benefactors
from mosafs.localwire import PUT_MAX_BYTES, PUT_MAX_COUNT, host_id, put

log = logging.getLogger(__name__)

Outcome = bool | errors.MosafsError

KEEP_PER_BENEFACTOR = 4      # memory files kept per benefactor (PutGroups sends 2 at once)
KEEP_MAX_BYTES = 16 << 20    # a larger one (a group of large blobs) is not kept
KEEP_BENEFACTORS = 16        # beyond, the files of the one used longest ago are closed
TICKETS_MAX = 16             # put tickets asked for at once (the benefactor gives no more)
STOCKS_MAX = 64              # benefactors whose tickets are kept


class MemoryFiles:
    """Memory files kept per benefactor process for its next groups (module docstring),
    by the name of its local socket, which every benefactor process draws at random: a
    benefactor restarted, or another one at the same address, never sees a file kept for
    the one before. Thread-safe: hand-overs run in worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[str, list[tuple[int, int]]] = {}  # socket -> [(fd, size)]
        self._closed = False
        self.made = 0  # memory files created (tests, figures)

    def take(self, socket: str, size: int) -> tuple[int, int]:
        """(fd, its size) of a file for the benefactor at SOCKET, to hold SIZE bytes."""
        with self._lock:
            free = self._free.get(socket)
            if free:  # the smallest that holds SIZE, else the largest (it grows)
                fits = [i for i, (_, have) in enumerate(free) if have >= size]
                pick = min(fits, key=lambda i: free[i][1]) if fits else \
                    max(range(len(free)), key=lambda i: free[i][1])
                return free.pop(pick)
            self.made += 1
        return os.memfd_create("mosafs-put", os.MFD_CLOEXEC), 0

    def give(self, socket: str, fd: int, size: int) -> None:
        """FD (SIZE bytes) back after the benefactor at SOCKET answered for its whole
        group; closed if not kept."""
        closing = [fd]
        with self._lock:
            free = self._free.pop(socket, [])  # re-inserted: the most recently used last
            if not self._closed and size <= KEEP_MAX_BYTES and len(free) < KEEP_PER_BENEFACTOR:
                free.append((fd, size))
                closing.clear()
            if free and not self._closed:
                self._free[socket] = free
            while len(self._free) > KEEP_BENEFACTORS:
                closing += [f for f, _ in self._free.pop(next(iter(self._free)))]
        for unkept in closing:
            os.close(unkept)

    def close(self) -> None:
        with self._lock:
            kept, self._free, self._closed = self._free, {}, True
        for free in kept.values():
            for fd, _ in free:
                os.close(fd)


@dataclass
class _Stock:
    """Put tickets of one benefactor, given and not yet used."""

    socket: str
    tickets: list[bytes]
    use_by: float  # time.monotonic(): half the tickets' life, so none expires on its way
    asked: int     # how many the last OpenLocal asked for (the next asks twice as many)


class LocalPuts:
    """Local puts for one client; remembers the benefactors that do not take them, and
    keeps the put tickets given ahead (module docstring). Trio: one event loop."""

    def __init__(self, benefactors: Benefactors) -> None:
        self._benefactors = benefactors
        self._host = host_id()
        self._remote: set[str] = set()
        self._stocks: dict[str, _Stock] = {}  # by benefactor address
        self.files = MemoryFiles()
        self.groups = 0  # groups stored this way (tests, figures)
        self.opened = 0  # OpenLocal calls made for puts (tests, figures)

    def usable(self, address: str, blobs: Sequence[tuple[bytes, Any]]) -> bool:
        size = sum(memoryview(d).nbytes for _, d in blobs)
        return bool(self._host) and address not in self._remote and \
            0 < len(blobs) <= PUT_MAX_COUNT and 0 < size <= PUT_MAX_BYTES

    async def put(self, address: str, blobs: Sequence[tuple[bytes, Any]],
                  token: bytes) -> list[Outcome] | None:
        """Each blob's outcome, or None: not done this way (the caller puts them the usual
        way). A refused write token is the caller's error, as for a PutChunks call."""
        kept = self._kept(address)
        if kept is not None:
            try:
                return await self._deliver(kept, blobs)
            except OSError as exc:  # re-sending a blob is harmless
                log.debug("a kept put ticket of %s failed, asking for another: %s",
                          address, exc)
                self._stocks.pop(address, None)
        fresh = await self._open(address, token)
        if fresh is None:
            return None
        try:
            return await self._deliver(fresh, blobs)
        except OSError as exc:
            log.info("local puts to %s failed, sending them the usual way: %s", address, exc)
            self._remote.add(address)
            return None

    async def _deliver(self, ticket: tuple[str, bytes],
                       blobs: Sequence[tuple[bytes, Any]]) -> list[Outcome]:
        answers = await trio.to_thread.run_sync(_hand_over, self.files, *ticket, blobs)
        self.groups += 1
        return [_outcome(a) for a in answers]

    def _kept(self, address: str) -> tuple[str, bytes] | None:
        """(socket, ticket) of a ticket kept for ADDRESS, or None."""
        stock = self._stocks.get(address)
        if stock is None or not stock.tickets:
            return None
        if stock.use_by < time.monotonic():
            del self._stocks[address]
            return None
        return stock.socket, stock.tickets.pop()

    async def _open(self, address: str, token: bytes) -> tuple[str, bytes] | None:
        """(socket, ticket) from a new OpenLocal to ADDRESS with write token TOKEN, the
        tickets beyond the first kept; None if the benefactor takes no local puts from
        here (remembered)."""
        before = self._stocks.get(address)
        want = 1 if before is None else min(2 * before.asked, TICKETS_MAX)
        try:
            reply = await self._benefactors.open_local(address, [], [], put_token=token,
                                                       put_tickets=want)
        except errors.TokenRefused:
            raise
        except errors.MosafsError as exc:
            log.debug("no local puts to %s: %s", address, exc.message)
            self._remote.add(address)
            return None
        self.opened += 1
        if reply.host != self._host:
            self._remote.add(address)
            return None
        now = time.monotonic()
        stock = _Stock(reply.socket, list(reply.more_tickets), now + reply.ticket_ttl_ms / 2000,
                       want)
        kept = self._stocks.pop(address, None)  # in again as the most recently used
        if kept is not None and kept.socket == stock.socket and kept.use_by >= now:
            # Another group's call for the same key ended first (two groups in flight):
            # both calls' tickets are kept, used by the earlier deadline.
            stock.tickets += kept.tickets
            stock.use_by = kept.use_by
        self._stocks[address] = stock
        self._prune(now)
        return reply.socket, reply.ticket

    def _prune(self, now: float) -> None:
        """Stocks past their use, then the ones used longest ago beyond STOCKS_MAX (a
        finished write's tickets expire on the benefactor unused)."""
        for key in [k for k, s in self._stocks.items() if s.use_by < now]:
            del self._stocks[key]
        while len(self._stocks) > STOCKS_MAX:
            del self._stocks[next(iter(self._stocks))]


    def close(self) -> None:
        """Close the memory files kept (the context's end)."""
        self.files.close()


def _hand_over(files: MemoryFiles, name: str, ticket: bytes,
               blobs: Sequence[tuple[bytes, Any]]) -> list[dict[str, object]]:
    """In a worker thread: BLOBS written into a memory file for the benefactor at socket
    NAME and handed to it; the file is kept for its next group only once it answered."""
    spans = []
    at = 0
    for blob_id, data in blobs:
        n = memoryview(data).nbytes
        spans.append((blob_id, at, n))
        at += n
    fd, size = files.take(name, at)
    try:
        written = 0
        views = [memoryview(d).cast("B") for _, d in blobs]
        while written < at:  # pwritev may write less than asked
            written += os.pwritev(fd, _rest(views, written), written)
        answers = put(name, ticket, fd, spans)
    except BaseException:
        os.close(fd)
        raise
    files.give(name, fd, max(size, at))
    return answers


def _rest(views: list[memoryview], skip: int) -> list[memoryview]:
    """VIEWS without their first SKIP bytes."""
    out = []
    for v in views:
        if skip >= v.nbytes:
            skip -= v.nbytes
            continue
        out.append(v[skip:])
        skip = 0
    return out


def _outcome(answer: dict[str, object]) -> Outcome:
    if "present" in answer:
        return bool(answer["present"])
    cls = errors.BY_KIND.get(str(answer.get("kind")), errors.MosafsError)
    return cls(str(answer.get("message") or "refused"))
