"""The wire of short-circuit local reads and puts, shared by the benefactor that serves
them (mosafs.benefactor.localreads, which documents the protocol) and the clients
(mosafs.client.files.localreads, .localputs): the ticket's size, how many descriptors
one message carries, a put group's header, this host's boot id, and the client's side
of the exchanges."""

from __future__ import annotations

import json
import os
import socket
import struct
from collections.abc import Sequence
from pathlib import Path

TICKET_BYTES = 32
FDS_PER_MESSAGE = 128  # below the kernel's SCM_MAX_FD (253)
TIMEOUT_S = 10.0
PUT_MAX_COUNT = 256           # blobs in one local put
PUT_MAX_BYTES = 64 << 20      # bytes in one local put
_COUNT = struct.Struct("<I")
_BLOB = struct.Struct("<32sQQ")  # id, offset, length in the memory file
PUT_HEADER_MAX = _COUNT.size + PUT_MAX_COUNT * _BLOB.size
REPLY_MAX = 1 << 20


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


def put_header(blobs: Sequence[tuple[bytes, int, int]]) -> bytes:
    """A local put's header: (id, offset, length) of each blob in the memory file."""
    return _COUNT.pack(len(blobs)) + b"".join(_BLOB.pack(*b) for b in blobs)


def parse_put_header(raw: bytes) -> list[tuple[bytes, int, int]]:
    """The blobs a header names; ValueError for one that is malformed or too large."""
    if len(raw) < _COUNT.size:
        raise ValueError("short header")
    (count,) = _COUNT.unpack_from(raw)
    if not 0 < count <= PUT_MAX_COUNT or len(raw) != _COUNT.size + count * _BLOB.size:
        raise ValueError(f"a header of {len(raw)} bytes for {count} blobs")
    return [_BLOB.unpack_from(raw, _COUNT.size + i * _BLOB.size) for i in range(count)]


def put(name: str, ticket: bytes, fd: int, blobs: Sequence[tuple[bytes, int, int]]
        ) -> list[dict[str, object]]:
    """Hand the memory file FD holding BLOBS to the benefactor's socket NAME for TICKET;
    its answer for each blob: {"present": bool} when stored, {"kind", "message"} when
    refused. OSError when it cannot be reached or refuses the ticket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(TIMEOUT_S * 6)  # the benefactor verifies and fsyncs every blob
        sock.connect("\0" + name)
        sock.sendall(ticket)
        socket.send_fds(sock, [put_header(blobs)], [fd])
        reply = sock.recv(REPLY_MAX)
    if not reply:
        raise ConnectionError(f"local puts: {name} refused the ticket")
    try:
        answers = json.loads(reply)
    except ValueError:
        raise ConnectionError(f"local puts: {name} sent a malformed answer") from None
    got = len(answers) if isinstance(answers, list) else 0
    if got != len(blobs):
        raise ConnectionError(f"local puts: {name} answered {got} of {len(blobs)} blobs")
    return answers
