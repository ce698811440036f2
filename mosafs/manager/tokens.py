"""Chunk access tokens (DESIGN §11; docs/operations.md, "Chunk access tokens"): the
manager signs, for the caller's certificate, a short-lived token for every chunk it may
read (each chunk of a block-map it may read) and for the write lease it holds; benefactors
serve and take chunk bytes only against them (mosafs.benefactor.tokens), as HDFS block
access tokens do. The keys are HMAC-SHA256 secrets the manager shares with its
benefactors (SecurityState, sent at registration and with every heartbeat's answer).

Token bytes (version 1; integers big-endian):

    offset  size  field
    0       1     version: 1
    1       1     kind: 1 read, 2 write
    2       4     key id (u32): which key signed it
    6       8     expiry, milliseconds since the Unix epoch (u64)
    14      32|8  subject: a read token's chunk id (32 bytes), a write token's lease id (u64)
    46|22   32    holder: SHA-256 of the DER of the certificate it was issued to
    78|54   32    HMAC-SHA256 under the key, over every byte before

A read token is 110 bytes, a write token 86. The holder binds a token to one certificate:
a token copied to another process with another certificate is refused, so a token is
worth nothing without the key of the certificate it names.

Keys (TokenAuthority): 32 random bytes and a random u32 id each. A key signs for
`rotate_s` seconds; the next one is made (and so sent to benefactors) as soon as the
current one starts signing, a whole rotation before it signs anything, so that rotation
never hands out a token a benefactor cannot check yet. A key is kept, and sent, until
every token it signed has expired (the end of its signing window plus `ttl_s`). The keys
are kept in a file beside the metadata (mode 0600), so that a manager restart leaves the
tokens it handed out valid.

Domain code: no grpc.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mosafs.errors import ConfigError

log = logging.getLogger(__name__)

VERSION = 1
READ, WRITE = 1, 2
KIND_NAMES = {READ: "read", WRITE: "write"}
MAC_BYTES = 32
SECRET_BYTES = 32
FINGERPRINT_BYTES = 32
CHUNK_ID_BYTES = 32
_HEAD = struct.Struct(">BBIQ")  # version, kind, key id, expiry ms
_LEASE = struct.Struct(">Q")
HEAD_BYTES = _HEAD.size
READ_TOKEN_BYTES = _HEAD.size + CHUNK_ID_BYTES + FINGERPRINT_BYTES + MAC_BYTES
WRITE_TOKEN_BYTES = _HEAD.size + _LEASE.size + FINGERPRINT_BYTES + MAC_BYTES
DEFAULT_TTL_S = 600.0
DEFAULT_ROTATE_S = 600.0
MIN_SECONDS = 1.0  # shorter lives and rotations only make tests flaky
KEYS_FILE = "token-keys.json"

Clock = Callable[[], float]  # wall clock, seconds since the epoch


class MalformedToken(ValueError):
    """Bytes that are no token of this format."""


@dataclass(frozen=True, slots=True)
class Token:
    """A parsed token; `body` is every byte the MAC covers."""

    kind: int
    key_id: int
    expiry_ms: int
    subject: bytes  # chunk id (read) or the lease id's 8 bytes (write)
    holder: bytes
    body: bytes
    mac: bytes


def sign(secret: bytes, body: bytes) -> bytes:
    return hmac.digest(secret, body, "sha256")


class Mac:
    """HMAC-SHA256 under one key, set up once: each token then copies the keyed state
    (hmac.HMAC.copy) instead of padding and hashing the key again as hmac.digest does,
    which made a check about 1.4 times as slow (docs/benchmarks.md)."""

    __slots__ = ("_keyed",)

    def __init__(self, secret: bytes) -> None:
        self._keyed = hmac.new(secret, digestmod=hashlib.sha256)

    def __call__(self, body: bytes) -> bytes:
        state = self._keyed.copy()
        state.update(body)
        return state.digest()


def encode(kind: int, key_id: int, secret: bytes, expiry_ms: int, subject: bytes,
           holder: bytes) -> bytes:
    body = b"".join((_HEAD.pack(VERSION, kind, key_id, expiry_ms), subject, holder))
    return body + sign(secret, body)


def parse(raw: bytes) -> Token:
    """The fields of RAW; MalformedToken when it is not a token of this format (its MAC
    is not checked here)."""
    if len(raw) < _HEAD.size:
        raise MalformedToken(f"{len(raw)} bytes, shorter than any token")
    version, kind, key_id, expiry_ms = _HEAD.unpack_from(raw)
    if version != VERSION:
        raise MalformedToken(f"token format version {version}; this benefactor reads "
                             f"version {VERSION}")
    size = {READ: READ_TOKEN_BYTES, WRITE: WRITE_TOKEN_BYTES}.get(kind)
    if size is None:
        raise MalformedToken(f"unknown token kind {kind}")
    if len(raw) != size:
        raise MalformedToken(f"a {KIND_NAMES[kind]} token has {size} bytes, not {len(raw)}")
    raw = bytes(raw)
    end = size - MAC_BYTES
    holder_at = end - FINGERPRINT_BYTES
    return Token(kind, key_id, expiry_ms, raw[_HEAD.size:holder_at], raw[holder_at:end],
                 raw[:end], raw[end:])


def head(raw: bytes) -> tuple[int, int, int, int]:
    """(version, kind, key id, expiry ms) of RAW, which has at least HEAD_BYTES."""
    fields: tuple[int, int, int, int] = _HEAD.unpack_from(raw)
    return fields


def expiry_s(raw: bytes) -> float:
    """When token RAW says it expires (seconds since the epoch; unverified: what a holder
    uses to ask for a fresh one in time)."""
    if len(raw) < _HEAD.size:
        return 0.0
    return float(_HEAD.unpack_from(raw)[3]) / 1000


@dataclass(frozen=True, slots=True)
class TokenKey:
    id: int
    secret: bytes
    active_from_ms: int   # signs from here ...
    active_until_ms: int  # ... to here (exclusive)
    not_after_ms: int     # every token it signed has expired by then

    def signs_at(self, now_ms: int) -> bool:
        return self.active_from_ms <= now_ms < self.active_until_ms


def derived_key(master: bytes, window: int, rotate_ms: int, ttl_ms: int) -> TokenKey:
    """The key of rotation window WINDOW (it signs from WINDOW x ROTATE_MS on, for
    ROTATE_MS) derived from MASTER: every manager holding MASTER has the same keys at the
    same time, with nothing to store or ship but MASTER."""
    material = hmac.new(master, b"mosafs token key v1" + window.to_bytes(8, "big"),
                        hashlib.sha512).digest()
    start = window * rotate_ms
    until = start + rotate_ms
    return TokenKey(int.from_bytes(material[:4], "big"), material[32:32 + SECRET_BYTES],
                    start, until, until + ttl_ms)


class TokenAuthority:
    """The manager's keys, and the tokens it signs with them (thread-safe).

    Keys come from one of two places: MASTER, the cluster's secret (the manager's: keys
    derived per rotation window, the same on every manager, so a failover changes no key
    a benefactor knows); else random keys kept in PATH (or in memory, without one)."""

    def __init__(self, *, ttl_s: float = DEFAULT_TTL_S, rotate_s: float = DEFAULT_ROTATE_S,
                 path: Path | None = None, clock: Clock = time.time,
                 master: bytes | None = None) -> None:
        if not (MIN_SECONDS <= ttl_s < 1e7 and MIN_SECONDS <= rotate_s < 1e7):
            raise ConfigError(f"token lifetime and key rotation must be {MIN_SECONDS:g} s "
                              f"or more (got {ttl_s:g} s and {rotate_s:g} s)")
        if master is not None and len(master) < 16:
            raise ConfigError("the token master secret must have 16 bytes or more")
        self.ttl_ms = int(ttl_s * 1000)
        self.rotate_ms = int(rotate_s * 1000)
        self._path = path
        self._master = master
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: list[TokenKey] = _load(path) if path is not None and master is None \
            else []
        self._macs: dict[int, Mac] = {}
        with self._lock:
            self._ensure(self._now())

    def _now(self) -> int:
        return int(self._clock() * 1000)

    def read_token(self, chunk_id: bytes, holder: bytes) -> bytes:
        return self.read_tokens([chunk_id], holder)[0]

    def read_tokens(self, chunk_ids: Sequence[bytes], holder: bytes) -> list[bytes]:
        """A read token for each of CHUNK_IDS (32 bytes each), issued to HOLDER."""
        _check_holder(holder)
        key, expiry, mac = self._signing()
        head = _HEAD.pack(VERSION, READ, key.id, expiry)
        out = []
        for cid in chunk_ids:
            if len(cid) != CHUNK_ID_BYTES:
                raise ValueError(f"a chunk id has {CHUNK_ID_BYTES} bytes, not {len(cid)}")
            body = head + cid + holder
            out.append(body + mac(body))
        return out

    def write_token(self, lease_id: int, holder: bytes) -> bytes:
        """A token that lets HOLDER put chunks for write lease LEASE_ID."""
        _check_holder(holder)
        key, expiry, mac = self._signing()
        body = _HEAD.pack(VERSION, WRITE, key.id, expiry) + _LEASE.pack(lease_id) + holder
        return body + mac(body)

    def published(self) -> list[TokenKey]:
        """Every key a benefactor must know now: those of tokens still in date, and the
        next one."""
        with self._lock:
            self._ensure(self._now())
            return list(self._keys)

    def _signing(self) -> tuple[TokenKey, int, Mac]:
        with self._lock:
            now = self._now()
            self._ensure(now)
            key = next(k for k in self._keys if k.signs_at(now))
            mac = self._macs.get(key.id)
            if mac is None:
                mac = self._macs[key.id] = Mac(key.secret)
        return key, min(now + self.ttl_ms, key.not_after_ms), mac

    def _ensure(self, now: int) -> None:
        """Drop the keys no token in date needs; make the current key and the next one
        where missing (called under the lock)."""
        if self._master is not None:
            self._derive(now)
            return
        kept = [k for k in self._keys if k.not_after_ms > now]
        changed = len(kept) != len(self._keys)
        self._keys = kept
        if changed:
            self._macs = {k.id: self._macs[k.id] for k in kept if k.id in self._macs}
        if not any(k.signs_at(now) for k in kept):
            self._keys.append(self._new_key(now))
            self._keys.sort(key=lambda k: k.active_from_ms)  # a clock set back: keep order
            changed = True
        last = self._keys[-1]
        if last.active_from_ms <= now:  # the current one is the newest: make its successor
            self._keys.append(self._new_key(last.active_until_ms))
            changed = True
        if changed:
            self._save()

    def _derive(self, now: int) -> None:
        """The derived keys needed at NOW: those of earlier windows whose tokens may still
        be in date, the current window's and the next one's."""
        assert self._master is not None
        current = now // self.rotate_ms
        first = current - (self.ttl_ms + self.rotate_ms - 1) // self.rotate_ms
        if self._keys and self._keys[-1].active_from_ms == (current + 1) * self.rotate_ms \
                and self._keys[0].not_after_ms > now:
            return  # unchanged since the last call
        keys = [derived_key(self._master, w, self.rotate_ms, self.ttl_ms)
                for w in range(max(0, first), current + 2)]
        self._keys = [k for k in keys if k.not_after_ms > now]
        self._macs = {k.id: self._macs[k.id] for k in self._keys if k.id in self._macs}

    def _new_key(self, start_ms: int) -> TokenKey:
        taken = {k.id for k in self._keys}
        key_id = int.from_bytes(os.urandom(4), "big")
        while key_id in taken:
            key_id = int.from_bytes(os.urandom(4), "big")
        until = start_ms + self.rotate_ms
        return TokenKey(key_id, os.urandom(SECRET_BYTES), start_ms, until, until + self.ttl_ms)

    def _save(self) -> None:
        if self._path is None:
            return
        record = {"v": 1, "keys": [
            {"id": k.id, "secret": k.secret.hex(), "from": k.active_from_ms,
             "until": k.active_until_ms, "not_after": k.not_after_ms} for k in self._keys]}
        tmp = self._path.with_name(f".{self._path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)


def _load(path: Path) -> list[TokenKey]:
    """The keys of an earlier start; none when there are none or they cannot be read (the
    tokens they signed then fail, and readers ask for new ones)."""
    try:
        record = json.loads(path.read_text())
        keys = [TokenKey(int(k["id"]), bytes.fromhex(k["secret"]), int(k["from"]),
                         int(k["until"]), int(k["not_after"])) for k in record["keys"]]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("cannot read the chunk token keys in %s (%s): making new ones; tokens "
                    "handed out before are refused until readers ask again", path, exc)
        return []
    return sorted((k for k in keys if len(k.secret) == SECRET_BYTES),
                  key=lambda k: k.active_from_ms)


def _check_holder(holder: bytes) -> None:
    if len(holder) != FINGERPRINT_BYTES:
        raise ValueError(f"a token's holder is a {FINGERPRINT_BYTES}-byte certificate "
                         f"fingerprint, not {len(holder)} bytes")

