"""Which manager a client asks (mosafs.rpc.managers): the address lists it is given, and
when a failed call may go to the next manager (only where it cannot run twice)."""

from __future__ import annotations

import pytest

from mosafs import errors
from mosafs.rpc.managers import STANDBY_REFUSAL, Managers, may_go_elsewhere, parse_managers


def test_address_lists_are_checked() -> None:
    assert parse_managers("127.0.0.1:1") == ["127.0.0.1:1"]
    assert parse_managers(" a:1, b:2 ,") == ["a:1", "b:2"]
    for bad, words in ((",", "no manager address"), ("a:1,a:1", "given twice"),
                       ("a:1,nope", "HOST:PORT")):
        with pytest.raises(errors.ConfigError, match=words):
            parse_managers(bad)


REFUSAL = errors.FailedPrecondition(f"{STANDBY_REFUSAL} 127.0.0.1:9; ask the active manager")
NEVER_SENT = errors.Unavailable("failed to connect to all addresses; last error: "
                                "Connection refused")
LOST_UNDER_IT = errors.Unavailable("Socket closed")
LATE = errors.DeadlineExceeded("Deadline Exceeded")


@pytest.mark.parametrize(("exc", "idempotent", "moves_on"), [
    (REFUSAL, False, True),        # a standby ran nothing
    (NEVER_SENT, False, True),     # nothing was sent
    (LOST_UNDER_IT, False, False),  # a commit may have run: never twice
    (LATE, False, False),
    (LOST_UNDER_IT, True, True),   # a read may run twice
    (LATE, True, True),
    (errors.NotFound("no such file"), True, False),  # an answer, not a failure to reach
    (errors.FailedPrecondition("directory not empty"), True, False),
])
def test_a_call_moves_on_only_where_it_cannot_run_twice(
        exc: errors.MosafsError, idempotent: bool, moves_on: bool) -> None:
    assert may_go_elsewhere(exc, idempotent) is moves_on


def test_the_next_manager_is_asked_after_a_failure_and_kept() -> None:
    managers = Managers(["a:1", "b:2", "c:3"])
    assert managers.current == 0
    assert managers.failed(0) is False and managers.current == 1
    assert managers.failed(0) is False and managers.current == 1  # stale news: kept
    assert managers.failed(1) is False and managers.failed(2) is True  # a whole round
    assert managers.current == 0
