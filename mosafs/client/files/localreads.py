"""Short-circuit local reads, the reader's side (docs/benefactor.md, "Local reads and
puts"): chunks of a benefactor on this host are read from its files, received as open
descriptors for a ticket its OpenLocal gave (read tokens checked there), straight into the caller's
buffers with pread; every chunk is verified against its id as a network read is. A
benefactor elsewhere (another boot id), one with local reads off, or any failure makes
the caller read those chunks the usual way."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import trio

from mosafs import errors, ids
from mosafs.client.rpc import Benefactors
from mosafs.localwire import host_id, receive

log = logging.getLogger(__name__)

THREADS = 16  # batches read at once (pread and BLAKE3 release the GIL)


class LocalReads:
    """Reads for one client; remembers the benefactors that are not local."""

    def __init__(self, benefactors: Benefactors) -> None:
        self._benefactors = benefactors
        self._host = host_id()
        self._remote: set[str] = set()
        self._limiter = trio.CapacityLimiter(THREADS)
        self.bytes_read = 0

    async def read(self, address: str, items: Sequence[tuple[bytes, bytes, Any]]) -> list[bool]:
        """ITEMS: (chunk id, read token, destination: a writable buffer of the chunk's
        length). Whether each was read and verified into its destination."""
        if not self._host or address in self._remote or not items:
            return [False] * len(items)
        try:
            reply = await self._benefactors.open_local(
                address, [cid for cid, _, _ in items],
                [t for _, t, _ in items] if any(t for _, t, _ in items) else [])
        except errors.MosafsError as exc:
            log.debug("no local reads from %s: %s", address, exc.message)
            self._remote.add(address)
            return [False] * len(items)
        if reply.host != self._host:
            self._remote.add(address)
            return [False] * len(items)
        try:
            done = await trio.to_thread.run_sync(_read_files, reply.socket, reply.ticket,
                                                 items, limiter=self._limiter)
        except OSError as exc:
            log.debug("local reads from %s failed: %s", address, exc)
            self._remote.add(address)
            return [False] * len(items)
        self.bytes_read += sum(memoryview(d).nbytes for (_, _, d), ok in zip(items, done,
                                                                             strict=True) if ok)
        return done


def _read_files(name: str, ticket: bytes, items: Sequence[tuple[bytes, bytes, Any]]) -> list[bool]:
    """In a worker thread: the descriptors for TICKET, each file read into its destination
    and verified."""
    fds = receive(name, ticket, len(items))
    for fd in fds:  # the disk reads every file of the batch at once, not one after another
        if fd is not None:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    done = []
    try:
        for fd, (cid, _, dest) in zip(fds, items, strict=True):
            done.append(fd is not None and _read_one(fd, cid, dest))
    finally:
        for fd in fds:
            if fd is not None:
                os.close(fd)
    return done


def _read_one(fd: int, cid: bytes, dest: Any) -> bool:
    view = memoryview(dest).cast("B")
    if os.fstat(fd).st_size != view.nbytes:
        return False  # not this chunk's length: the network read finds out why
    got = 0
    while got < view.nbytes:
        n = os.preadv(fd, [view[got:]], got)
        if n <= 0:
            return False
        got += n
    try:
        ids.verify(cid, view)
    except errors.IntegrityError:
        return False  # a bad local copy: the network read reports it (GetChunk verify)
    return True
