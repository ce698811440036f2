"""Network addresses as the daemons and commands take them (HOST:PORT) and offer them to
peers. Pure helpers below every layer: the RPC layer, metrics and the process plumbing
all use them."""

from __future__ import annotations

import socket

from mosafs.errors import ConfigError

_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}


def port_of(text: str) -> int | None:
    """The port TEXT names (0..65535, ASCII digits only: str.isdigit() also takes digits
    int() refuses, such as a superscript two), or None."""
    if not (text.isascii() and text.isdigit()) or len(text) > 5 or int(text) > 65535:
        return None
    return int(text)


def split_address(text: str, what: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT (IPv6 hosts in brackets); ConfigError otherwise."""
    host, sep, raw = text.rpartition(":")
    port = port_of(raw)
    if not sep or port is None:
        raise ConfigError(f"{what} must be HOST:PORT, got {text!r}")
    return host, port


def advertised_address(listen_host: str, port: int, advertise: str | None = None) -> str:
    if advertise:
        return advertise
    # A wildcard address is not something a peer can dial: offer the host name instead.
    host = socket.gethostname() if listen_host in _WILDCARD_HOSTS else listen_host
    return f"{host}:{port}"
