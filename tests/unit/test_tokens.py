"""Chunk access tokens, in process: the manager's TokenAuthority signs, the benefactor's
TokenChecker checks (mosafs.manager.tokens, mosafs.benefactor.tokens), on a test clock."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from mosafs.benefactor.tokens import TokenChecker
from mosafs.errors import ConfigError, TokenRefused, Unavailable
from mosafs.manager import tokens
from mosafs.manager.tokens import TokenAuthority

CHUNK = hashlib.sha256(b"chunk").digest()
OTHER_CHUNK = hashlib.sha256(b"another chunk").digest()
ME = hashlib.sha256(b"my certificate").digest()
YOU = hashlib.sha256(b"your certificate").digest()


class Clock:
    """Wall clock in seconds, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def pair(clock: Clock, *, ttl: float = 60, rotate: float = 30,
         path: Path | None = None) -> tuple[TokenAuthority, TokenChecker]:
    authority = TokenAuthority(ttl_s=ttl, rotate_s=rotate, path=path, clock=clock)
    checker = TokenChecker(required=True, clock=clock)
    sync(authority, checker)
    return authority, checker


def sync(authority: TokenAuthority, checker: TokenChecker) -> None:
    """What a heartbeat's answer does."""
    checker.update((k.id, k.secret, k.not_after_ms) for k in authority.published())


def refused(call, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TokenRefused, match=match):
        call()


def test_round_trip_and_format() -> None:
    clock = Clock()
    authority, checker = pair(clock)
    read = authority.read_token(CHUNK, ME)
    write = authority.write_token(12345, ME)
    assert len(read) == tokens.READ_TOKEN_BYTES == 110
    assert len(write) == tokens.WRITE_TOKEN_BYTES == 86
    parsed = tokens.parse(read)
    assert (parsed.kind, parsed.subject, parsed.holder) == (tokens.READ, CHUNK, ME)
    assert parsed.expiry_ms == int(clock.now * 1000) + 60_000
    checker.check_read(read, CHUNK, ME)
    checker.check_write(write, ME)
    assert tokens.parse(write).subject == (12345).to_bytes(8, "big")
    assert authority.read_tokens([CHUNK, OTHER_CHUNK], ME)[1] == \
        authority.read_token(OTHER_CHUNK, ME)


def test_expired_token_is_refused() -> None:
    clock = Clock()
    authority, checker = pair(clock, ttl=60, rotate=600)
    token = authority.read_token(CHUNK, ME)
    clock.now += 59.9
    checker.check_read(token, CHUNK, ME)
    clock.now += 0.2
    refused(lambda: checker.check_read(token, CHUNK, ME), "expired")


def test_forged_and_malformed_tokens_are_refused() -> None:
    clock = Clock()
    authority, checker = pair(clock)
    token = authority.read_token(CHUNK, ME)
    for at in (6, 20, len(token) - 1):  # the expiry, the subject, the MAC
        forged = bytearray(token)
        forged[at] ^= 1
        refused(lambda f=bytes(forged): checker.check_read(f, CHUNK, ME), "forged")
    # A later expiry with a MAC of a key the forger made up.
    made_up = tokens.encode(tokens.READ, tokens.parse(token).key_id, os.urandom(32),
                            int(clock.now * 1000) + 10**9, CHUNK, ME)
    refused(lambda: checker.check_read(made_up, CHUNK, ME), "forged")
    refused(lambda: checker.check_read(b"", CHUNK, ME), "no chunk access token")
    refused(lambda: checker.check_read(token[:-1], CHUNK, ME), "malformed")
    refused(lambda: checker.check_read(b"\x02" + token[1:], CHUNK, ME), "version 2")
    write = authority.write_token(1, ME)
    refused(lambda: checker.check_read(write, CHUNK, ME), "a write token was sent")
    refused(lambda: checker.check_write(token, ME), "a read token was sent")


def test_token_for_another_chunk_or_certificate_is_refused() -> None:
    clock = Clock()
    authority, checker = pair(clock)
    token = authority.read_token(CHUNK, ME)
    refused(lambda: checker.check_read(token, OTHER_CHUNK, ME), "not for chunk")
    refused(lambda: checker.check_read(token, CHUNK, YOU), "another certificate")
    refused(lambda: checker.check_write(authority.write_token(7, ME), YOU),
            "another certificate")


def test_rotation_keeps_old_tokens_valid_until_they_expire() -> None:
    clock = Clock()
    authority, checker = pair(clock, ttl=60, rotate=30)
    old = authority.read_token(CHUNK, ME)
    old_key = tokens.parse(old).key_id
    # The next key is published before it signs: a benefactor that heard of the keys
    # before the rotation checks tokens of the new key.
    assert len(authority.published()) == 2
    clock.now += 31
    new = authority.read_token(CHUNK, ME)
    assert tokens.parse(new).key_id != old_key
    checker.check_read(new, CHUNK, ME)
    sync(authority, checker)
    checker.check_read(old, CHUNK, ME)  # signed by the retiring key, still in date
    assert old_key in {k.id for k in authority.published()}
    # Once every token of the old key has expired the key goes, and its tokens are
    # refused as expired, with a retired key.
    clock.now += 60
    assert old_key not in {k.id for k in authority.published()}
    sync(authority, checker)
    refused(lambda: checker.check_read(old, CHUNK, ME), "key is retired")


def test_checker_states() -> None:
    clock = Clock()
    authority = TokenAuthority(ttl_s=60, rotate_s=30, clock=clock)
    token = authority.read_token(CHUNK, ME)
    waiting = TokenChecker(required=True, clock=clock)
    with pytest.raises(Unavailable, match="not registered"):
        waiting.check_read(token, CHUNK, ME)  # no keys from the manager yet
    waiting.update([])  # the manager issues no tokens: nothing to check
    waiting.check_read(b"", CHUNK, ME)
    TokenChecker(required=False).check_read(b"", CHUNK, b"")  # plaintext, or standalone
    other = TokenAuthority(ttl_s=60, rotate_s=30, clock=clock)  # another manager's keys
    checker = TokenChecker(required=True, clock=clock)
    keys = [(k.id, k.secret, k.not_after_ms) for k in authority.published()]
    assert not checker.update(keys)  # the first key set: nothing lost
    assert not checker.update(keys[1:])  # a rotation keeps keys in common
    # Only new keys (a manager that lost its key file): the benefactor says so.
    assert checker.update((k.id, k.secret, k.not_after_ms) for k in other.published())
    refused(lambda: checker.check_read(token, CHUNK, ME), "does not know")


def test_keys_survive_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / tokens.KEYS_FILE
    first, checker = pair(clock, path=path)
    token = first.read_token(CHUNK, ME)
    assert path.stat().st_mode & 0o777 == 0o600
    second = TokenAuthority(ttl_s=60, rotate_s=30, path=path, clock=clock)
    assert [k.id for k in second.published()] == [k.id for k in first.published()]
    sync(second, checker)
    checker.check_read(token, CHUNK, ME)
    assert tokens.parse(second.read_token(CHUNK, ME)).key_id == tokens.parse(token).key_id
    # Expired keys of an earlier start are dropped; a damaged file means new keys.
    clock.now += 3600
    assert tokens.parse(token).key_id not in {
        k.id for k in TokenAuthority(ttl_s=60, rotate_s=30, path=path, clock=clock).published()}
    path.write_text(json.dumps({"v": 1, "keys": "?"}))
    fresh = TokenAuthority(ttl_s=60, rotate_s=30, path=path, clock=clock)
    assert len(fresh.published()) == 2


def test_bad_settings_and_holders() -> None:
    with pytest.raises(ConfigError):
        TokenAuthority(ttl_s=0.1)
    authority = TokenAuthority()
    with pytest.raises(ValueError):
        authority.read_token(CHUNK, b"")  # a plaintext caller has no certificate
    with pytest.raises(ValueError):
        authority.read_token(b"short", ME)


def test_precomputed_mac_is_hmac_sha256() -> None:
    for size in (32, 64, 100):  # a key longer than SHA-256's block is hashed first
        secret = os.urandom(size)
        for body in (b"", b"x" * 78, os.urandom(1000)):
            assert tokens.Mac(secret)(body) == tokens.sign(secret, body)


# -- keys derived from the cluster's master secret (failover: docs/coordination.md) -------

MASTER = hashlib.sha256(b"the cluster's master secret").digest()


def test_every_manager_with_the_master_secret_signs_with_the_same_keys() -> None:
    clock = Clock()
    active = TokenAuthority(ttl_s=60, rotate_s=30, clock=clock, master=MASTER)
    checker = TokenChecker(required=True, clock=clock)
    sync(active, checker)  # what the benefactors learned from the first active manager
    token = active.read_token(CHUNK, ME)
    clock.now += 20
    successor = TokenAuthority(ttl_s=60, rotate_s=30, clock=clock, master=MASTER)
    assert [(k.id, k.secret) for k in successor.published()] == \
        [(k.id, k.secret) for k in active.published()]
    checker.check_read(token, CHUNK, ME)  # the old token, and the new manager's, verify
    checker.check_read(successor.read_token(CHUNK, ME), CHUNK, ME)
    other = TokenAuthority(ttl_s=60, rotate_s=30, clock=clock, master=bytes(32))
    refused(lambda: checker.check_read(other.read_token(CHUNK, ME), CHUNK, ME), "key")


def test_derived_keys_rotate_and_are_known_a_window_ahead() -> None:
    clock = Clock()
    authority = TokenAuthority(ttl_s=60, rotate_s=30, clock=clock, master=MASTER)
    checker = TokenChecker(required=True, clock=clock)
    seen = set()
    for _ in range(10):
        sync(authority, checker)
        keys = authority.published()
        now_ms = int(clock.now * 1000)
        assert sum(k.signs_at(now_ms) for k in keys) == 1
        assert keys[-1].active_from_ms > now_ms  # the next key is out before it signs
        assert all(k.not_after_ms > now_ms for k in keys)
        token = authority.read_token(CHUNK, ME)
        seen.add(tokens.parse(token).key_id)
        clock.now += 15
        sync(authority, checker)
        checker.check_read(token, CHUNK, ME)  # still in date, its key still sent
    assert len(seen) >= 5  # a new key every 30 s
    with pytest.raises(ConfigError):
        TokenAuthority(master=b"short")
