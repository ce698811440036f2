"""Peers and inputs that are not to be trusted: a revocation list edited by hand, peers that
connect to the standby feed or to a benefactor's local socket and say nothing, addresses
whose digits are not ASCII. Real sockets, certificates and files; nothing mocked."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from mosafs import certs, revocation
from mosafs.errors import ConfigError
from mosafs.rpc import framed

FP_A = bytes(range(32))
FP_B = bytes(range(32, 64))


def test_revocation_list_with_one_bad_line_still_revokes_at_start(tmp_path: Path) -> None:
    """A hand-edited list with one line that is no fingerprint (an indented comment, a
    note) must not make a starting server accept every revoked certificate."""
    (tmp_path / revocation.REVOKED_FILE).write_text(
        f"{FP_A.hex()} jobA 2024-01-01T00:00:00Z\n"
        "  # jobB revoked by hand below\n"
        f"{FP_B.hex()} jobB 2024-01-02T00:00:00Z\n")
    revs = revocation.Revocations(tmp_path)
    assert revs.is_revoked(FP_A), "a revoked certificate is accepted (list ignored)"
    assert revs.is_revoked(FP_B)


# --- framed: connections that never start TLS ------------------------------------------


def test_framed_listener_serves_a_manager_while_strangers_hold_idle_sockets(
        tmp_path: Path) -> None:
    """Anyone who can reach the feed port (no certificate at all) opens more TCP
    connections than the listener takes handshakes and sends nothing: a standby manager
    with a valid certificate is still served (network access alone can do nothing)."""
    certs.init_ca(tmp_path)
    certs.issue(tmp_path, "manager", "manager")
    me = certs.load(tmp_path, "manager")

    def handle(conn: framed.Connection) -> None:
        while (frame := conn.receive()) is not None:
            conn.send(frame)

    listener = framed.Listener("127.0.0.1", 0, handle, method="Echo",
                               allowed=frozenset({"manager"}),
                               refuse=lambda conn, exc: None, identity=me).start()
    idle = [socket.create_connection(("127.0.0.1", listener.port))
            for _ in range(framed.MAX_HANDSHAKES + 8)]
    try:
        time.sleep(0.5)  # accepted, each waiting in its TLS handshake
        conn = framed.connect("127.0.0.1", listener.port, role="manager", identity=me,
                              timeout=3)
        conn.send(b"ping")
        assert conn.receive() == b"ping"
        conn.close()
    finally:
        for s in idle:
            s.close()
        listener.close()


# --- addresses: odd digits -------------------------------------------------------------

@pytest.mark.parametrize("text", ["127.0.0.1:\u00b2", "127.0.0.1:\u2460"])
def test_split_address_refuses_unicode_digits_with_a_config_error(text: str) -> None:
    """'²'.isdigit() is True but int('²') fails: the daemon must say what is wrong with
    --listen/--manager (ConfigError: one line, exit code), not die with a ValueError."""
    from mosafs.addresses import split_address
    from mosafs.rpc.managers import parse_managers

    with pytest.raises(ConfigError):
        split_address(text, "--listen")
    with pytest.raises(ConfigError):
        parse_managers(text)


# --- local reads: connections that never send a ticket --------------------------------

def test_local_reads_serve_a_ticket_while_other_local_processes_hold_idle_connections(
        tmp_path: Path) -> None:
    """Any process of the host may connect to the benefactor's abstract socket (no
    credentials); connections that send nothing must not stop a reader with a valid
    ticket from being answered promptly."""

    from mosafs import localwire
    from mosafs.benefactor.localreads import LocalReads

    chunk = tmp_path / "c"
    chunk.write_bytes(b"x" * 10)
    local = LocalReads(lambda raw: chunk)
    idle = []
    try:
        for _ in range(8):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect("\0" + local.name)
            idle.append(s)
        time.sleep(0.3)
        ticket = local.grant([b"\1" * 32])
        started = time.monotonic()
        fds = localwire.receive(local.name, ticket, 1)
        waited = time.monotonic() - started
        for fd in fds:
            if fd is not None:
                os.close(fd)
        # Behind eight idle connections a ticket used to wait for the first of them to
        # time out (10 s, each holding a serving thread); now none holds one. The bound
        # is loose so that a loaded machine does not fail it.
        assert waited < 8.0, f"a valid ticket waited {waited:.1f} s behind idle connections"
    finally:
        for s in idle:
            s.close()
        local.close()


def test_revocation_list_skips_a_line_that_is_no_fingerprint(tmp_path: Path) -> None:
    (tmp_path / revocation.REVOKED_FILE).write_text(
        f"{FP_A.hex()} jobA\nnot a fingerprint at all\n{FP_B.hex()[:40]} cut short\n")
    revs = revocation.Revocations(tmp_path)
    assert revs.is_revoked(FP_A)
    assert not revs.is_revoked(FP_B)
