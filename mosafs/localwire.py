"""The wire of short-circuit local reads, shared by the benefactor that serves them
(mosafs.benefactor.localreads, which documents the protocol) and the readers
(mosafs.client.files.localreads): the ticket's size, how many descriptors one message
carries, this host's boot id, and the reader's side of the exchange."""

from __future__ import annotations

import os
import socket
from pathlib import Path

TICKET_BYTES = 32
FDS_PER_MESSAGE = 128  # below the kernel's SCM_MAX_FD (253)
TIMEOUT_S = 10.0


def host_id() -> str:
    """This boot of this host: a reader compares the benefactor's with its own before it
    connects (an abstract socket of the same name elsewhere is not the benefactor's)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def receive(name: str, ticket: bytes, count: int) -> list[int | None]:
    """The descriptors of COUNT chunk files for TICKET from the socket NAME (None: that
    chunk is not there). The caller closes them. OSError when the benefactor cannot be
    reached or refuses the ticket (the connection closed before all COUNT answers)."""
    out: list[int | None] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(TIMEOUT_S)
        sock.connect("\0" + name)
        sock.sendall(ticket)
        try:
            while len(out) < count:
                status, fds, _, _ = socket.recv_fds(sock, FDS_PER_MESSAGE, FDS_PER_MESSAGE)
                if not status:
                    raise ConnectionError(f"local reads: {name} answered {len(out)} of "
                                          f"{count} chunks")
                if sum(status) != len(fds) or len(out) + len(status) > count:
                    for fd in fds:
                        os.close(fd)
                    raise ConnectionError(f"local reads: {name} sent a malformed answer")
                given = iter(fds)
                out.extend(next(given) if flag else None for flag in status)
        except BaseException:
            for held in out:
                if held is not None:
                    os.close(held)
            raise
    return out
