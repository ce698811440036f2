"""A cluster's managers as their clients see them (docs/coordination.md): one active, the
others standbys that refuse every Manager call, naming the active one. Mounts, the
checkpoint library, benefactors and the admin commands are given every address (`--manager
A,B,C`, cluster.json's `managers`) and follow the active manager by themselves: a call
goes to the manager that answered last, and moves on to the next address only where that
cannot run it twice.

- a standby's refusal (FAILED_PRECONDITION starting with STANDBY_REFUSAL) was not run;
- a call that never had a connection (the manager's process is gone) was not run;
- a call that may run twice (the channels' retried methods, mosafs.rpc.channels) may go
  anywhere after any failure to reach its manager;
- any other call that failed once its manager had it (a connection lost under it, a
  deadline) fails: its caller gets the error (a mount: EIO), never a second run.
"""

from __future__ import annotations

import threading

from mosafs import errors

# The start of a standby's refusal (mosafs.manager.follow_servicer.add_refusals).
STANDBY_REFUSAL = "this manager is a standby of"
# Words of gRPC's UNAVAILABLE for a call that found no connection to send it on.
_NEVER_SENT = ("failed to connect", "connection refused", "connections to all backends "
               "failing", "no route to host", "name resolution")


def parse_managers(text: str, what: str = "--manager") -> list[str]:
    """HOST:PORT[,HOST:PORT...] as a list (each checked); ConfigError for a bad one."""
    from mosafs.addresses import split_address

    found = [a.strip() for a in text.split(",") if a.strip()]
    if not found:
        raise errors.ConfigError(f"{what}: no manager address in {text!r}")
    for address in found:
        split_address(address, what)
    if len(set(found)) != len(found):
        raise errors.ConfigError(f"{what}: an address is given twice in {text!r}")
    return found


def refused_by_standby(exc: errors.MosafsError) -> bool:
    return STANDBY_REFUSAL in exc.message


def may_go_elsewhere(exc: errors.MosafsError, idempotent: bool) -> bool:
    """Whether a call that failed with EXC may be sent to the next manager (module
    docstring)."""
    if refused_by_standby(exc):
        return True
    if not isinstance(exc, errors.Unavailable | errors.DeadlineExceeded):
        return False
    text = exc.message.lower()
    return idempotent or (isinstance(exc, errors.Unavailable)
                          and any(w in text for w in _NEVER_SENT))


class Managers:
    """ADDRESSES and the index of the one to ask first: the last that answered."""

    def __init__(self, addresses: list[str]) -> None:
        if not addresses:
            raise errors.ConfigError("no manager address")
        self.addresses = list(addresses)
        self._current = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.addresses)

    @property
    def current(self) -> int:
        with self._lock:
            return self._current

    def failed(self, index: int) -> bool:
        """The manager at INDEX could not take a call: ask the next one from now on.
        True when that wraps around to the first address (every one was tried)."""
        with self._lock:
            if self._current == index:
                self._current = (index + 1) % len(self.addresses)
            return self._current == 0
