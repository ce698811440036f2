"""A gRPC channel's completion thread, kept between calls (docs/client.md, "One
completion thread per channel").

gRPC completes the future calls of a channel (`.future()`, as the mount makes its calls)
in one thread that it starts when a call begins with no other call in flight, and that
ends as soon as the last call in flight has completed (grpc/_channel.py,
`_run_channel_spin_thread`). Calls that follow one another, as a mount's creates do (one
batch in flight at a time), therefore start and end a thread each: about one per call,
490 a second with 8 processes creating files on the 2-CPU machine, each some 70 µs of CPU
and 100 µs of the caller's own time inside Thread.start(), which for the mount is its one
event loop (docs/benchmarks.md, "One completion thread per channel").

`Spin` counts one call more than gRPC has in flight, from the first call on, so that the
thread stays for the channel's life. `release` gives that count back under a call of its
own before the channel is closed: the thread then ends with the last call, as gRPC means
it to. (A channel closed while its thread waits with nothing in flight hands the thread
an event without a callback, which it reports as a TypeError traceback.)

This reads two attributes of gRPC's channel that are not its public API
(`_call_state.lock` and `.managed_calls`, the count its own calls keep under that lock);
where they are missing (another gRPC), Spin does nothing and gRPC behaves as its own.
tests/unit/test_spin.py checks, against the gRPC installed, both the thread per call
without Spin and the one thread with it, so an upgrade that changes either fails there.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

RELEASE_WAIT_S = 2.0  # how long finish() waits for the calls release() started
RELEASE_TRIES = 3     # probes release() starts before it gives up (see there)


class Spin:
    """The completion thread of CHANNEL (a grpc.Channel, or grpc.intercept_channel's
    wrapper of one) held from the first call on; not thread-safe: one event loop's."""

    def __init__(self, channel: Any) -> None:
        state = getattr(channel, "_call_state", None)
        if state is None:  # grpc.intercept_channel's wrapper: the channel is under it
            state = getattr(getattr(channel, "_channel", None), "_call_state", None)
        usable = state is not None and hasattr(state, "lock") and \
            isinstance(getattr(state, "managed_calls", None), int)
        self._state = state if usable else None
        self.held = False
        if not usable:
            log.debug("gRPC's channel has no call count here: its completion thread is "
                      "not held")

    def started(self) -> None:
        """A call was just started on the channel: hold its thread, if not yet held. The
        call keeps the thread running while the count is taken, so the thread that the
        held count keeps is one that runs."""
        if self.held or self._state is None:
            return
        with self._state.lock:
            if self._state.managed_calls > 0:
                self._state.managed_calls += 1
                self.held = True

    def release(self, probe: Callable[[], Any]) -> Any:
        """Give the held count back when PROBE() (a call started on the channel) completes,
        so that the thread ends once that call and any other in flight have completed;
        PROBE's future (None where nothing was held), for `finish` to wait on before the
        channel is closed.

        The count is given back by a done-callback of the probe, which gRPC runs in the
        completion thread itself, just before that thread takes the probe off the count
        and ends when it reaches zero. Given back from here instead, it could land after
        the thread had already completed the probe (a probe that failed at once): the
        count then reaches zero in no completion, the thread waits on, and closing the
        channel hands it an event without a callback (the TypeError traceback). A probe
        that completed before its callback was added is therefore not counted on: another
        is started, up to RELEASE_TRIES."""
        if not self.held or self._state is None:
            return None
        for _ in range(RELEASE_TRIES):
            try:
                future = probe()
            except Exception as exc:  # no call can start: the thread stays, held
                log.debug("no call to release the channel's completion thread with: %s", exc)
                return None
            caller = threading.get_ident()
            inline: list[bool] = []
            future.add_done_callback(lambda _, caller=caller, inline=inline: (
                inline.append(True) if threading.get_ident() == caller else self._give_back()))
            if not inline:
                self.held = False
                return future
        log.debug("every probe completed before the release could ride on it: the "
                  "channel's completion thread stays")
        return None

    def _give_back(self) -> None:
        """The held count, given back in the completion thread (see release)."""
        assert self._state is not None
        with self._state.lock:
            self._state.managed_calls -= 1


def finish(futures: list[Any], wait_s: float = RELEASE_WAIT_S) -> None:
    """Wait, up to WAIT_S in all, for the calls that `release` started to end (their
    errors too: any end will do; a manager that is down fails them at once)."""
    deadline = time.monotonic() + wait_s
    for future in futures:
        if future is not None:
            with contextlib.suppress(Exception):
                future.exception(timeout=max(0.0, deadline - time.monotonic()))
