"""Keeps the mount's metadata caches coherent with the manager (docs/client.md, "Coherent
caches").

A task asks the manager, every POLL_S, what other mounts and the manager itself changed
since it last asked (the Changes RPC: inodes whose attributes changed, names made, removed
or pointed elsewhere), drops those from the caches (AttrCache.invalidate) and has the FUSE
layer drop them from the kernel's (`on_changes`). While answers keep coming, the cache is
coherent: entries live for the coherent timeout instead of the attribute timeout, and the
kernel is told so.

The lease: the cache is coherent for LEASE_S after the sending of the last question that
was answered. An answer that does not come by then ends it: everything cached is dropped
and the kernel told to forget what it was given for long (`on_lost`), so no entry outlives
the attribute timeout by more than the time that takes; the next answer starts it again.
A manager that restarted or failed over answers RESET (its change list is not the one the
mount followed), as does one whose list no longer reaches back to the mount's position:
the caches are dropped the same way, and the mount follows the new list. A mount whose
certificate may not see the whole namespace is not given change lists: it stays on the
attribute timeout.

An idle mount asks nothing: after IDLE_S without a lookup, stat or listing reaching it,
it lets coherence go (dropping what it holds, as above) and asks again at the next one,
so a cluster's idle mounts cost the manager nothing (each asking one costs it about 0.4 %
of a core). A program that only stats files the kernel holds reaches the mount once
after that, and is kept coherent again.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence

import trio

from mosafs import errors
from mosafs._proto import manager_pb2 as mpb
from mosafs.client.files.attrcache import AttrCache

log = logging.getLogger(__name__)

POLL_S = 0.2     # between questions
LEASE_S = 1.0    # coherent this long after the last answered question was sent
UNTOLD_S = 30.0  # between questions of a mount that is given no change lists
IDLE_S = 10.0    # no lookup, stat or listing this long: stop asking until the next one

Names = Sequence[tuple[int, str]]


class Coherence:
    """Runs (`run`, for the mount's life) the questions for CACHE to MANAGER (its
    `changes(instance, since, timeout)`)."""

    def __init__(self, manager: object, cache: AttrCache, *, poll_s: float = POLL_S,
                 lease_s: float = LEASE_S) -> None:
        self._manager = manager
        self._cache = cache
        self._poll_s, self._lease_s = poll_s, lease_s
        self._instance, self._since = "", 0
        self._until = -math.inf  # trio time: coherent before it
        self._last_use = trio.current_time()
        self._woken: trio.Event | None = None  # set while idle: the next use wakes it
        # The FUSE layer's: drop these from the kernel; drop all it was given for long.
        self.on_changes: Callable[[Sequence[int], Names], Awaitable[None]] | None = None
        self.on_lost: Callable[[], Awaitable[None]] | None = None
        cache.coherent = self.coherent

    def coherent(self) -> bool:
        return trio.current_time() < self._until

    def used(self) -> None:
        """A lookup, stat or listing reached the mount (in the trio thread)."""
        self._last_use = trio.current_time()
        if self._woken is not None:
            self._woken.set()

    async def run(self) -> None:
        while True:
            if trio.current_time() - self._last_use > IDLE_S:
                await self._idle()
            asked = trio.current_time()
            reply = await self._ask(asked)
            if reply is None:
                await self._lose("the manager did not answer")
            elif not reply.coherent:
                if self._until > -math.inf:
                    await self._lose("the manager gives this mount no change lists")
                await trio.sleep(UNTOLD_S)
                continue
            else:
                await self._take(reply, asked)
            await trio.sleep(self._poll_s)

    async def _ask(self, asked: float) -> mpb.ChangesReply | None:
        """The manager's answer, or None if none came within the lease (or by LEASE_S from
        ASKED where none is held)."""
        deadline = self._until if self._until > asked else asked + self._lease_s
        with trio.move_on_at(deadline):
            try:
                return await self._manager.changes(  # type: ignore[attr-defined,no-any-return]
                    self._instance, self._since, timeout=max(0.05, deadline - asked))
            except errors.MosafsError as exc:
                log.debug("asking the manager for changes: %s", exc.message)
                await trio.sleep_until(deadline)
        return None

    async def _take(self, reply: mpb.ChangesReply, asked: float) -> None:
        if reply.reset:
            if self._instance:  # not news at the first question
                log.info("metadata caches dropped: the manager cannot list the changes since "
                         "this mount last asked (it restarted or failed over, or they are "
                         "too many)")
            await self._drop_all()
        elif reply.inodes or reply.names:
            names = [(n.parent, n.name) for n in reply.names]
            self._cache.invalidate(reply.inodes, names)
            if self.on_changes is not None:
                await self.on_changes(list(reply.inodes), names)
        self._instance, self._since = reply.instance, reply.seq
        self._until = asked + self._lease_s

    async def _idle(self) -> None:
        self._woken = trio.Event()
        await self._lose("idle", quiet=True)
        await self._woken.wait()
        self._woken = None

    async def _lose(self, why: str, *, quiet: bool = False) -> None:
        if self._until == -math.inf:
            return
        (log.debug if quiet else log.info)(
            "metadata caches no longer coherent (%s): entries live %g s again", why,
            self._cache.ttl)
        self._until = -math.inf
        await self._drop_all()

    async def _drop_all(self) -> None:
        self._cache.clear()
        if self.on_lost is not None:
            await self.on_lost()
