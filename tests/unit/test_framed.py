"""The framed transport of the standbys' feed (mosafs.rpc.framed), in one process over
loopback: frames arrive whole and in order in plaintext and over mutual TLS, also while
both ends send and receive at once from two threads (the reason for its lock); a close
wakes a blocked receive; callers of another CA, of a role not allowed, or not speaking
TLS are refused and the listener serves on. Real processes: tests/services/test_feed.py."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mosafs import certs
from mosafs.errors import AccessDenied, InvalidArgument, MosafsError, Unavailable
from mosafs.rpc import framed

LOOPBACK = "127.0.0.1"


@pytest.fixture(scope="module")
def ids(tmp_path_factory: pytest.TempPathFactory) -> dict[str, certs.Identity]:
    """Identities of the cluster's CA by role, and one client of another CA."""
    ca = tmp_path_factory.mktemp("ca")
    certs.init_ca(ca)
    for role in ("manager", "client"):
        certs.issue(ca, role, role)
    other = tmp_path_factory.mktemp("other")
    certs.init_ca(other)
    certs.issue(other, "manager", "manager")
    return {"manager": certs.load(ca, "manager"), "client": certs.load(ca, "client"),
            "stranger": certs.load(other, "manager")}


Echo = Callable[..., framed.Listener]


@pytest.fixture
def echo() -> Iterator[Echo]:
    """echo(identity) -> a listener that sends every frame back, closed at the end; the
    refusals it made are in its `.refused`."""
    made: list[framed.Listener] = []

    def start(identity: certs.Identity | None) -> framed.Listener:
        refused: list[MosafsError] = []

        def handle(conn: framed.Connection) -> None:
            while (frame := conn.receive()) is not None:
                conn.send(frame)

        def refuse(conn: framed.Connection, exc: MosafsError) -> None:
            refused.append(exc)
            conn.send(b"refused: " + exc.message.encode())

        listener = framed.Listener(LOOPBACK, 0, handle, method="Echo",
                                   allowed=frozenset({"manager"}), refuse=refuse,
                                   identity=identity).start()
        listener.refused = refused  # type: ignore[attr-defined]
        made.append(listener)
        return listener

    yield start
    for listener in made:
        listener.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_frames_arrive_whole_and_in_order(echo: Echo, ids: dict[str, certs.Identity],
                                          tls: bool) -> None:
    me = ids["manager"] if tls else None
    listener = echo(me)
    conn = framed.connect(LOOPBACK, listener.port, role="manager", identity=me)
    assert (conn.peer.role if conn.peer else None) == ("manager" if tls else None)
    frames = [b"", b"x", os.urandom(70_000), os.urandom(5 << 20)]
    for frame in frames:
        conn.send(frame)
    assert [conn.receive() for _ in frames] == frames
    assert conn.receive_ready() is None  # nothing more sent back
    conn.close()
    with pytest.raises(framed.Closed):
        conn.send(b"after close")


def test_both_directions_at_once_over_tls(echo: Echo, ids: dict[str, certs.Identity]) -> None:
    """One thread sends while another receives on the same TLS connection, as the feed
    does at both ends; without the lock OpenSSL's state breaks (python/cpython#151508)."""
    listener = echo(ids["manager"])
    conn = framed.connect(LOOPBACK, listener.port, role="manager", identity=ids["manager"])
    frames = [os.urandom(1 + (i * 7919) % 40_000) for i in range(1500)]
    got: list[bytes | None] = []
    reader = threading.Thread(target=lambda: got.extend(conn.receive() for _ in frames))
    reader.start()
    for frame in frames:
        conn.send(frame)
    reader.join(timeout=60)
    assert not reader.is_alive()
    assert got == frames
    conn.close()


def test_close_wakes_a_blocked_receive(echo: Echo) -> None:
    listener = echo(None)
    conn = framed.connect(LOOPBACK, listener.port, role="manager", identity=None)
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            conn.receive()
        except framed.Closed as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    conn.close()
    waiter.join(timeout=5)
    assert not waiter.is_alive() and len(outcome) == 1


def test_a_frame_too_long_is_refused_at_its_header(echo: Echo) -> None:
    listener = echo(None)
    conn = framed.connect(LOOPBACK, listener.port, role="manager", identity=None)
    with pytest.raises(InvalidArgument, match="a frame of"):
        conn.send(bytes(framed.MAX_FRAME + 1))
    conn._buffer += (framed.MAX_FRAME + 1).to_bytes(4, "big")  # as if a peer announced it
    with pytest.raises(InvalidArgument, match="announced"):
        conn.receive()
    conn.close()


def test_callers_are_checked_and_the_listener_serves_on(
        echo: Echo, ids: dict[str, certs.Identity]) -> None:
    listener = echo(ids["manager"])
    # A certificate of the cluster's CA whose role is not allowed: told why, then closed.
    client = framed.connect(LOOPBACK, listener.port, role="manager", identity=ids["client"])
    assert client.receive() == b"refused: Echo needs a certificate of role manager; this " \
                               b"one is client"
    assert client.receive() is None
    client.close()
    assert [type(e) for e in listener.refused] == [AccessDenied]  # type: ignore[attr-defined]
    # Another CA's certificate: the server ends the handshake (TLS 1.3 tells the client at
    # its first read).
    with pytest.raises(Unavailable):
        stranger = framed.connect(LOOPBACK, listener.port, role="manager",
                                  identity=ids["stranger"])
        try:
            stranger.send(b"hello")
            stranger.receive()
        finally:
            stranger.close()
    # Not TLS at all: dropped.
    plain = framed.connect(LOOPBACK, listener.port, role="manager", identity=None)
    plain.send(b"not a TLS client hello" * 20)
    try:
        assert plain.receive() is None
    except framed.Closed:
        pass  # a reset, as well as an end
    finally:
        plain.close()
    # A server of another role than the caller expects is refused by the caller.
    with pytest.raises(AccessDenied, match="role manager, not benefactor"):
        framed.connect(LOOPBACK, listener.port, role="benefactor", identity=ids["manager"])
    # And the listener still serves a proper caller.
    good = framed.connect(LOOPBACK, listener.port, role="manager", identity=ids["manager"])
    good.send(b"still here")
    assert good.receive() == b"still here"
    good.close()


def test_a_listener_that_is_gone_is_unavailable(echo: Echo, tmp_path: Path) -> None:
    listener = echo(None)
    port = listener.port
    listener.close()
    with pytest.raises(Unavailable, match="cannot connect"):
        framed.connect(LOOPBACK, port, role="manager", identity=None)


def test_close_ends_a_handshake_that_hangs(echo: Echo, ids: dict[str, certs.Identity]) -> None:
    """A peer that connects and says nothing is in its TLS handshake until HANDSHAKE_S:
    closing the listener ends it at once (a stopping manager does not wait it out)."""
    import socket
    import time

    listener = echo(ids["manager"])
    with socket.create_connection((LOOPBACK, listener.port)) as silent:
        time.sleep(0.2)  # accepted, its handshake waiting for a hello
        started = time.monotonic()
        listener.close()
        assert time.monotonic() - started < framed.HANDSHAKE_S / 2
        assert silent.recv(1) == b""  # the server's side was shut
