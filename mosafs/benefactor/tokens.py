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
    KIND_NAMES,
    READ,
    WRITE,
    MalformedToken,
    Token,
    parse,
    sign,
)

Clock = Callable[[], float]  # wall clock, seconds since the epoch
_REFRESH = "ask the manager again (a new block-map or lease renewal)"


class TokenChecker:
    """Checks chunk access tokens against the manager's keys (thread-safe: the key set is
    replaced whole, never changed in place)."""

    def __init__(self, *, required: bool, clock: Clock = time.time) -> None:
        self.required = required
        self._clock = clock
        self._lock = threading.Lock()
        # key id -> (secret, not after ms); None: no SecurityState has arrived yet
        self._keys: dict[int, tuple[bytes, int]] | None = None

    def update(self, keys: Iterable[tuple[int, bytes, int]]) -> bool:
        """The manager's keys now: (id, secret, not after ms) each; replaces the old set.
        True when it shares no key with a non-empty old set: every token signed before is
        refused from now on (a manager that started without its key file)."""
        fresh = {key_id: (bytes(secret), int(not_after)) for key_id, secret, not_after in keys}
        with self._lock:
            old, self._keys = self._keys, fresh
        if not old or not fresh:
            return False
        return not old.keys() & fresh.keys()

    @property
    def active(self) -> bool:
        """Whether tokens are checked now (required, and the manager issues them)."""
        keys = self._keys
        return self.required and (keys is None or bool(keys))

    def check_read(self, token: bytes, chunk_id: bytes, holder: bytes,
                   now_ms: int | None = None) -> None:
        """TokenRefused unless TOKEN lets HOLDER read chunk CHUNK_ID."""
        parsed = self._check(token, READ, holder, now_ms)
        if parsed is not None and not hmac.compare_digest(parsed.subject, chunk_id):
            raise TokenRefused(f"the read token is for chunk {parsed.subject.hex()[:16]}..., "
                               f"not for chunk {chunk_id.hex()[:16]}...")

    def check_write(self, token: bytes, holder: bytes, now_ms: int | None = None) -> int:
        """TokenRefused unless TOKEN lets HOLDER put chunks; the token's lease id (0 when
        nothing is checked)."""
        parsed = self._check(token, WRITE, holder, now_ms)
        return parsed.lease_id if parsed is not None else 0

    def _check(self, token: bytes, kind: int, holder: bytes,
               now_ms: int | None) -> Token | None:
        if not self.required:
            return None
        keys = self._keys
        if keys is None:
            raise Unavailable("this benefactor has no chunk token keys yet: it has not "
                              "registered with its manager; retry in a moment")
        if not keys:
            return None  # the manager issues no tokens (--chunk-tokens off)
        what = "GetChunk needs a read token" if kind == READ else "PutChunk needs a write token"
        if not token:
            raise TokenRefused(f"no chunk access token: {what} from the manager (metadata "
                               f"mosafs-token-bin)")
        try:
            parsed = parse(token)
        except MalformedToken as exc:
            raise TokenRefused(f"malformed chunk access token ({exc}): {what}") from None
        if parsed.kind != kind:
            raise TokenRefused(f"a {KIND_NAMES[parsed.kind]} token was sent where {what}")
        now = int(self._clock() * 1000) if now_ms is None else now_ms
        entry = keys.get(parsed.key_id)
        if entry is None:
            # A key goes once every token it signed has expired: say so when the token
            # claims it has (unverified, but only the message depends on it).
            why = ("the token has expired and its key is retired" if parsed.expiry_ms <= now
                   else f"the token is signed with key {parsed.key_id}, which this "
                        f"benefactor does not know (newer than the manager's last answer "
                        f"to it, or from another manager)")
            raise TokenRefused(f"{why}: {_REFRESH}")
        if not hmac.compare_digest(sign(entry[0], parsed.body), parsed.mac):
            raise TokenRefused("forged chunk access token: its signature does not match "
                               f"key {parsed.key_id}")
        # Every token of a key expires by the key's end (the manager caps it so).
        if parsed.expiry_ms <= now or entry[1] <= now:
            raise TokenRefused(f"the {KIND_NAMES[kind]} token expired "
                               f"{(now - parsed.expiry_ms) / 1000:.1f} s ago: {_REFRESH}")
        if not hmac.compare_digest(parsed.holder, holder):
            raise TokenRefused("the token was issued to another certificate")
        return parsed
