"""Network addresses as the daemons and commands take them (HOST:PORT) and offer them to
peers. Pure helpers below every layer: the RPC layer, metrics and the process plumbing
all use them."""

from __future__ import annotations

import socket

from mosafs.errors import ConfigError

_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}


def split_address(text: str, what: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT (IPv6 hosts in brackets); ConfigError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ConfigError(f"{what} must be HOST:PORT, got {text!r}")
    return host, int(port)


def advertised_address(listen_host: str, port: int, advertise: str | None = None) -> str:
    if advertise:
        return advertise
    # A wildcard address is not something a peer can dial: offer the host name instead.
    host = socket.gethostname() if listen_host in _WILDCARD_HOSTS else listen_host
    return f"{host}:{port}"
