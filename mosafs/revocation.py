"""Revoked certificates (`mosafs certs revoke NAME`, docs/operations.md "Revoking a
certificate").

A revocation is a line in the TLS directory's file `revoked`:

    <SHA-256 of the certificate's DER, 64 hex digits> <name> <UTC time of the revocation>

Every server (manager, benefactors) checks the fingerprint of the caller's certificate
against this list on every RPC, not only at the TLS handshake: connections live for hours,
and a revocation must take effect on them within seconds, without a restart. The list is
the file of the server's own TLS directory, read again when it changes (looked at no more
than once a second), together with the list the manager sends benefactors with every
heartbeat answer (`add_remote`), for hosts whose TLS directory is not updated by hand.
Revocations are never undone: issue a new certificate under another name instead.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from mosafs.errors import ConfigError, NotFound

log = logging.getLogger(__name__)
REVOKED_FILE = "revoked"
POLL_S = 1.0


def fingerprint_of(cert_pem: bytes) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    try:
        return x509.load_pem_x509_certificate(cert_pem).fingerprint(hashes.SHA256())
    except ValueError as exc:
        raise ConfigError(f"not a PEM certificate: {exc}") from None


def _parse(text: str, path: Path) -> dict[bytes, str]:
    """The fingerprints of the list (`FINGERPRINT [NAME]` a line; `#` comments). A line
    that is not one is skipped with a warning, and the others still revoke: refusing the
    whole list would leave a server that starts with it revoking nothing at all."""
    out: dict[bytes, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        try:
            fp = bytes.fromhex(fields[0])
        except ValueError:
            fp = b""
        if len(fp) != 32:
            log.warning("%s, line %d: not a SHA-256 fingerprint, skipped: %r", path, number,
                        fields[0][:80])
            continue
        out[fp] = fields[1] if len(fields) > 1 else ""
    return out


def read(directory: Path) -> dict[bytes, str]:
    """Fingerprint -> name of every certificate revoked in DIRECTORY's list."""
    path = directory / REVOKED_FILE
    try:
        return _parse(path.read_text(), path)
    except FileNotFoundError:
        return {}


def revoke(directory: Path, name: str) -> tuple[bytes, bool]:
    """Add NAME's certificate (DIRECTORY/NAME.crt) to the list: (fingerprint, whether it
    was listed already). The certificate stays where it is (`certs list` shows it
    revoked)."""
    crt = directory / f"{name}.crt"
    try:
        fp = fingerprint_of(crt.read_bytes())
    except FileNotFoundError:
        raise NotFound(f"no certificate {crt} to revoke") from None
    listed = read(directory)
    if fp in listed:
        return fp, True
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    path = directory / REVOKED_FILE
    tmp = path.with_name(f".{REVOKED_FILE}.tmp")
    old = path.read_text() if path.exists() else ""
    with open(tmp, "w") as f:  # the whole list again: readers never see half a line
        f.write(old + ("" if not old or old.endswith("\n") else "\n")
                + f"{fp.hex()} {name} {stamp}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return fp, False


class Revocations:
    """The revoked fingerprints a server refuses: its TLS directory's list, re-read when
    it changes, and what the manager sent."""

    def __init__(self, directory: Path | None) -> None:
        self._path = directory / REVOKED_FILE if directory is not None else None
        self._lock = threading.Lock()
        self._local: frozenset[bytes] = frozenset()
        self._remote: frozenset[bytes] = frozenset()
        self._stamp: tuple[int, int, int] | None = None
        self._checked = -POLL_S
        self._refresh()

    def is_revoked(self, fingerprint: bytes) -> bool:
        self._refresh()
        return fingerprint in self._local or fingerprint in self._remote

    def fingerprints(self) -> list[bytes]:
        self._refresh()
        return sorted(self._local | self._remote)

    def add_remote(self, fingerprints: Iterable[bytes]) -> None:
        fps = frozenset(fp for fp in fingerprints if len(fp) == 32)
        if not fps <= self._remote:
            with self._lock:
                self._remote = self._remote | fps

    def _refresh(self) -> None:
        now = time.monotonic()
        if self._path is None or now - self._checked < POLL_S:
            return
        with self._lock:
            if now - self._checked < POLL_S:
                return
            self._checked = now
            try:
                st = os.stat(self._path)
            except FileNotFoundError:
                self._local, self._stamp = frozenset(), None
                return
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._stamp:
                return
            self._stamp = stamp
            try:
                self._local = frozenset(_parse(self._path.read_text(), self._path))
            except (OSError, ConfigError) as exc:
                # A damaged list revokes nothing less: keep what was read before.
                log.warning("cannot read the revocation list, keeping the last one: %s", exc)
