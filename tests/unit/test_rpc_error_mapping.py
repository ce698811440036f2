"""How a call's gRPC status becomes a domain error on the caller's side
(mosafs.rpc.errors.error_of): the kind a mosafs server sends wins; otherwise the status."""

from __future__ import annotations

import grpc

from mosafs import errors
from mosafs.rpc.errors import error_of


def test_a_call_its_server_cancelled_counts_as_unavailable() -> None:
    """A server stopping cancels the calls it serves: the caller treats that as the peer
    going away (retry, or the next manager), not as a refusal."""
    err = error_of(grpc.StatusCode.CANCELLED, None, "Cancelled")
    assert isinstance(err, errors.Unavailable) and err.message == "Cancelled"
    assert isinstance(error_of(grpc.StatusCode.UNAVAILABLE, None, ""), errors.Unavailable)


def test_the_kind_a_server_sent_wins_over_the_status() -> None:
    err = error_of(grpc.StatusCode.PERMISSION_DENIED, "token-refused", "expired")
    assert isinstance(err, errors.TokenRefused)
    unknown = error_of(grpc.StatusCode.UNKNOWN, None, "")
    assert type(unknown) is errors.MosafsError and unknown.message
