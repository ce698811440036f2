"""The benefactor's side of chunk access tokens (format and keys: mosafs.manager.tokens;
docs/operations.md, "Chunk access tokens"): GetChunk needs a read token for that chunk,
PutChunk a write token (peer copies, made with a benefactor certificate, need none: the
servicer decides that by role), each issued to the caller's certificate and in date.

The keys come from the manager (SecurityState, at registration and with every heartbeat's
answer) and replace the ones known before each time. Until the first arrives this
benefactor cannot tell a good token from a forged one: it answers Unavailable (clients
retry, or try another replica). A SecurityState without keys means the manager issues no
tokens (`mosafs manager --chunk-tokens off`): nothing is checked then. A benefactor
without a TLS identity or without a manager checks nothing either (`required` False):
there is no certificate to bind a token to, or nobody to sign one.

Domain code: no grpc.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable, Iterable

from mosafs.errors import TokenRefused, Unavailable
from mosafs.manager.tokens import (
    FINGERPRINT_BYTES,
    HEAD_BYTES,
    KIND_NAMES,
    MAC_BYTES,
    READ,
    READ_TOKEN_BYTES,
    VERSION,
    WRITE,
    WRITE_TOKEN_BYTES,
    Mac,
    MalformedToken,
    Token,
    head,
    parse,
)

Clock = Callable[[], float]  # wall clock, seconds since the epoch
_REFRESH = "ask the manager again (a new block-map or lease renewal)"
_SIZES = {READ: READ_TOKEN_BYTES, WRITE: WRITE_TOKEN_BYTES}


class _Key:
    __slots__ = ("mac", "not_after_ms")

    def __init__(self, secret: bytes, not_after_ms: int) -> None:
        self.mac = Mac(secret)
        self.not_after_ms = not_after_ms


class TokenChecker:
    """Checks chunk access tokens against the manager's keys (thread-safe: the key set is
    replaced whole, never changed in place)."""

    def __init__(self, *, required: bool, clock: Clock = time.time) -> None:
        self.required = required
        self._clock = clock
        self._lock = threading.Lock()
        # key id -> key; None: no SecurityState has arrived yet
        self._keys: dict[int, _Key] | None = None

    def update(self, keys: Iterable[tuple[int, bytes, int]]) -> bool:
        """The manager's keys now: (id, secret, not after ms) each; replaces the old set.
        True when it shares no key with a non-empty old set: every token signed before is
        refused from now on (a manager that started without its key file)."""
        old = self._keys
        fresh = {}
        for key_id, secret, not_after in keys:
            known = old.get(key_id) if old else None  # keep its MAC states
            fresh[key_id] = known if known is not None and known.not_after_ms == not_after \
                else _Key(bytes(secret), int(not_after))
        with self._lock:
            old, self._keys = self._keys, fresh
        if not old or not fresh:
            return False
        return not old.keys() & fresh.keys()

    def check_read(self, token: bytes, chunk_id: bytes, holder: bytes,
                   now_ms: int | None = None) -> None:
        """TokenRefused unless TOKEN lets HOLDER read chunk CHUNK_ID."""
        self._check(token, READ, chunk_id, holder, now_ms)

    def check_write(self, token: bytes, holder: bytes, now_ms: int | None = None) -> None:
        """TokenRefused unless TOKEN lets HOLDER put chunks."""
        self._check(token, WRITE, b"", holder, now_ms)

    def _check(self, token: bytes, kind: int, chunk_id: bytes, holder: bytes,
               now_ms: int | None) -> None:
        if not self.required:
            return
        keys = self._keys
        if keys is None:
            raise Unavailable("this benefactor has no chunk token keys yet: it has not "
                              "registered with its manager; retry in a moment")
        if not keys:
            return  # the manager issues no tokens (--chunk-tokens off)
        now = int(self._clock() * 1000) if now_ms is None else now_ms
        # The common case first, in few steps: every GetChunk and PutChunk pays for it.
        size = _SIZES[kind]
        if len(token) == size and token[0] == VERSION and token[1] == kind:
            _, _, key_id, expiry = head(token)
            key = keys.get(key_id)
            end = size - MAC_BYTES
            holder_at = end - FINGERPRINT_BYTES
            if (key is not None and expiry > now and key.not_after_ms > now
                    and (kind != READ or token[HEAD_BYTES:holder_at] == chunk_id)
                    and token[holder_at:end] == holder
                    and hmac.compare_digest(key.mac(token[:end]), token[end:])):
                return
        raise self._refusal(token, kind, chunk_id, holder, now, keys)

    @staticmethod
    def _refusal(token: bytes, kind: int, chunk_id: bytes, holder: bytes, now: int,
                 keys: dict[int, _Key]) -> TokenRefused:
        """Why TOKEN is refused, in words."""
        what = "GetChunk needs a read token" if kind == READ else "PutChunk needs a write token"
        if not token:
            return TokenRefused(f"no chunk access token: {what} from the manager (metadata "
                                f"mosafs-token-bin)")
        try:
            parsed: Token = parse(token)
        except MalformedToken as exc:
            return TokenRefused(f"malformed chunk access token ({exc}): {what}")
        if parsed.kind != kind:
            return TokenRefused(f"a {KIND_NAMES[parsed.kind]} token was sent where {what}")
        key = keys.get(parsed.key_id)
        if key is None:
            # A key goes once every token it signed has expired: say so when the token
            # claims it has (unverified, but only the message depends on it).
            why = ("the token has expired and its key is retired" if parsed.expiry_ms <= now
                   else f"the token is signed with key {parsed.key_id}, which this "
                        f"benefactor does not know (newer than the manager's last answer "
                        f"to it, or from another manager)")
            return TokenRefused(f"{why}: {_REFRESH}")
        if not hmac.compare_digest(key.mac(parsed.body), parsed.mac):
            return TokenRefused("forged chunk access token: its signature does not match "
                                f"key {parsed.key_id}")
        # Every token of a key expires by the key's end (the manager caps it so).
        if parsed.expiry_ms <= now or key.not_after_ms <= now:
            return TokenRefused(f"the {KIND_NAMES[kind]} token expired "
                                f"{(now - parsed.expiry_ms) / 1000:.1f} s ago: {_REFRESH}")
        if kind == READ and parsed.subject != chunk_id:
            return TokenRefused(f"the read token is for chunk {parsed.subject.hex()[:16]}..., "
                                f"not for chunk {chunk_id.hex()[:16]}...")
        if parsed.holder != holder:
            return TokenRefused("the token was issued to another certificate")
        return TokenRefused("chunk access token refused")  # not reached: the fast path took it
