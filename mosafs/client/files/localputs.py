"""Short-circuit local puts, the writer's side (docs/benefactor.md, "Local reads and
puts"): a group of blobs for a benefactor on this host goes as one memory file (memfd)
handed over its Unix socket, for a ticket its OpenLocal gave against the write token,
instead of through TLS and a gRPC message. The bytes are copied once, into the memory
file, by a worker thread (no GIL held). A benefactor elsewhere (another boot id), one
with local puts off, or a failure to reach its socket is remembered, and its puts go the
usual way; so is a group the socket did not answer (re-sending a blob is harmless)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import trio

from mosafs import errors
from mosafs.client.rpc import Benefactors
from mosafs.localwire import PUT_MAX_BYTES, PUT_MAX_COUNT, host_id, put

log = logging.getLogger(__name__)

Outcome = bool | errors.MosafsError


class LocalPuts:
    """Local puts for one client; remembers the benefactors that do not take them."""

    def __init__(self, benefactors: Benefactors) -> None:
        self._benefactors = benefactors
        self._host = host_id()
        self._remote: set[str] = set()
        self.groups = 0  # groups stored this way (tests, figures)

    def usable(self, address: str, blobs: Sequence[tuple[bytes, Any]]) -> bool:
        size = sum(memoryview(d).nbytes for _, d in blobs)
        return bool(self._host) and address not in self._remote and \
            0 < len(blobs) <= PUT_MAX_COUNT and 0 < size <= PUT_MAX_BYTES

    async def put(self, address: str, blobs: Sequence[tuple[bytes, Any]],
                  token: bytes) -> list[Outcome] | None:
        """Each blob's outcome, or None: not done this way (the caller puts them the usual
        way). A refused write token is the caller's error, as for a PutChunks call."""
        try:
            reply = await self._benefactors.open_local(address, [], [], put_token=token)
        except errors.TokenRefused:
            raise
        except errors.MosafsError as exc:
            log.debug("no local puts to %s: %s", address, exc.message)
            self._remote.add(address)
            return None
        if reply.host != self._host:
            self._remote.add(address)
            return None
        try:
            answers = await trio.to_thread.run_sync(_hand_over, reply.socket, reply.ticket,
                                                    blobs)
        except OSError as exc:
            log.info("local puts to %s failed, sending them the usual way: %s", address, exc)
            self._remote.add(address)
            return None
        self.groups += 1
        return [_outcome(a) for a in answers]


def _hand_over(name: str, ticket: bytes, blobs: Sequence[tuple[bytes, Any]]
               ) -> list[dict[str, object]]:
    """In a worker thread: BLOBS written into a memory file, handed to socket NAME."""
    fd = os.memfd_create("mosafs-put", os.MFD_CLOEXEC)
    try:
        spans = []
        at = 0
        for blob_id, data in blobs:
            n = memoryview(data).nbytes
            spans.append((blob_id, at, n))
            at += n
        written = 0
        views = [memoryview(d).cast("B") for _, d in blobs]
        while written < at:  # pwritev may write less than asked
            written += os.pwritev(fd, _rest(views, written), written)
        return put(name, ticket, fd, spans)
    finally:
        os.close(fd)


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
