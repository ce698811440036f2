"""Pools: named settings for new writes (redundancy: replicas:R or ec:K+M; stripe width W,
chunker, write semantics, preferred hash backend) and the benefactors that take their chunks. Pool
"default" is created at the first start and cannot be deleted; others are made with
`mosafs pool create`. A folder is assigned a pool (children inherit, docs/lifecycle.md);
the choice of a file's pool is made in one place (core.Manager.open_write)."""

from __future__ import annotations

import logging
import re
import threading
import time

from mosafs._proto import common_pb2
from mosafs.chunking.base import BACKEND_CHOICES
from mosafs.chunking.spec import DEFAULT_SPEC, MAX_CHUNK, parse_spec
from mosafs.erasure.spec import fragment_size as fragment_size  # re-exported
from mosafs.errors import ConfigError
from mosafs.redundancy import MAX_EC_K as MAX_EC_K  # re-exported: the pools' bounds
from mosafs.redundancy import MAX_EC_M as MAX_EC_M
from mosafs.redundancy import MAX_REPLICATION as MAX_REPLICATION
from mosafs.redundancy import Scheme as Scheme
from mosafs.redundancy import parse_redundancy as parse_redundancy

DEFAULT_POOL = "default"
DEFAULT_CHUNKER = DEFAULT_SPEC
WRITE_SEMANTICS = ("optimistic", "pessimistic")
HASH_BACKENDS = BACKEND_CHOICES
MAX_CHUNK_BYTES = MAX_CHUNK  # the largest chunk a spec (and a commit) may name
MAX_STRIPE_WIDTH = 1024
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Chunks smaller than this are kept as M+1 whole copies in an ec:K+M pool: below it a
# fragment (L/K) is so small that the K+M puts, files and fragment records cost more than
# the (M+1)/(1+M/K) space it saves, and with the default chunker (MIN 256 KiB) only the
# last chunk of a file can be this small. docs/erasure_pools.md says more.
DEFAULT_EC_MIN_CHUNK = 128 << 10
UNWRITABLE_WARN_EVERY_S = 60.0

log = logging.getLogger(__name__)
_warned: dict[str, float] = {}  # pool -> time.monotonic() of its last unwritable warning
_warned_lock = threading.Lock()


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ConfigError(f"bad pool name {name[:80]!r}: use 1..64 characters of A-Z a-z 0-9 "
                          f". _ - (starting with a letter or digit)")
    return name


def scheme(settings: common_pb2.PoolSettings) -> Scheme:
    """The redundancy of a pool's settings."""
    if settings.ec_k:
        return Scheme(replicas=settings.replication, k=settings.ec_k, m=settings.ec_m)
    return Scheme(replicas=settings.replication or 1)


def ec_min_chunk(settings: common_pb2.PoolSettings) -> int:
    """Chunks shorter than this are kept as M+1 copies in an EC pool."""
    if settings.HasField("ec_min_chunk"):
        return settings.ec_min_chunk
    return DEFAULT_EC_MIN_CHUNK


def default_settings(name: str = DEFAULT_POOL) -> common_pb2.PoolSettings:
    return common_pb2.PoolSettings(
        name=name, replication=1, stripe_width=3, chunker=DEFAULT_CHUNKER,
        write_semantics="pessimistic", hash_backend="auto",
    )


def check_chunker(spec: str) -> str:
    """Validate a chunker spec with the chunking package's parser (its message is clear)."""
    parse_spec(spec)
    return spec


def check_settings(settings: common_pb2.PoolSettings) -> common_pb2.PoolSettings:
    if not settings.name:
        raise ConfigError("a pool needs a name")
    if not 1 <= settings.replication <= MAX_REPLICATION:
        raise ConfigError(f"replication must be 1..{MAX_REPLICATION}, got {settings.replication}")
    if settings.ec_k or settings.ec_m:
        parse_redundancy(f"ec:{settings.ec_k}+{settings.ec_m}")  # its message if out of range
        if settings.replication != settings.ec_m + 1:
            raise ConfigError(f"an ec:{settings.ec_k}+{settings.ec_m} pool keeps its small "
                              f"chunks as {settings.ec_m + 1} copies, not "
                              f"{settings.replication}")
    if settings.HasField("ec_min_chunk") and settings.ec_min_chunk > MAX_CHUNK_BYTES:
        raise ConfigError(f"the EC threshold (ec_min_chunk) must be 0..{MAX_CHUNK_BYTES} "
                          f"bytes, got {settings.ec_min_chunk}")
    if not 1 <= settings.stripe_width <= MAX_STRIPE_WIDTH:
        raise ConfigError(
            f"stripe width must be 1..{MAX_STRIPE_WIDTH}, got {settings.stripe_width}")
    if settings.write_semantics not in WRITE_SEMANTICS:
        raise ConfigError(f"write semantics must be one of {', '.join(WRITE_SEMANTICS)}, "
                          f"got {settings.write_semantics!r}")
    if settings.hash_backend not in HASH_BACKENDS:
        raise ConfigError(f"hash backend must be one of {', '.join(HASH_BACKENDS)}, "
                          f"got {settings.hash_backend!r}")
    check_chunker(settings.chunker)
    return settings


def with_overrides(
    settings: common_pb2.PoolSettings, *, replication: int | None = None,
    stripe_width: int | None = None, chunker: str | None = None,
    write_semantics: str | None = None, hash_backend: str | None = None,
    redundancy: str | None = None, ec_min_chunk: int | None = None,
) -> common_pb2.PoolSettings:
    """A validated copy of SETTINGS with every argument that is not None applied.
    REPLICATION R is the short form of REDUNDANCY "replicas:R"; given both, they must
    agree."""
    for what, value in (("replication", replication), ("stripe width", stripe_width)):
        if value is not None and not 0 < value < 1 << 32:
            raise ConfigError(f"{what} must be a positive integer, got {value}")
    wanted = None if redundancy is None else parse_redundancy(redundancy)
    if replication is not None:
        if wanted is not None and wanted != Scheme(replicas=replication):
            raise ConfigError(f"replication {replication} and redundancy {redundancy!r} "
                              f"disagree: give one of them")
        wanted = Scheme(replicas=replication)
    if ec_min_chunk is not None and not 0 <= ec_min_chunk <= MAX_CHUNK_BYTES:
        raise ConfigError(f"the EC threshold must be 0..{MAX_CHUNK_BYTES} bytes, got "
                          f"{ec_min_chunk}")
    out = common_pb2.PoolSettings()
    out.CopyFrom(settings)
    if wanted is not None:
        out.replication, out.ec_k, out.ec_m = wanted.replicas, wanted.k, wanted.m
    if ec_min_chunk is not None:
        out.ec_min_chunk = ec_min_chunk
    if stripe_width is not None:
        out.stripe_width = stripe_width
    if chunker is not None:
        out.chunker = chunker
    if write_semantics is not None:
        out.write_semantics = write_semantics
    if hash_backend is not None:
        out.hash_backend = hash_backend
    return check_settings(out)


def warn_unwritable(pool: str, reason: str, *, now: float | None = None) -> bool:
    """Log REASON, why no write to POOL can be placed (no benefactor, all draining, all
    full), as a WARNING at most once a minute per pool; whether it was logged. Every open
    for writing in the pool's folders fails the same way until an administrator acts, and
    a job or a shell loop retrying would otherwise fill the log with one line per open."""
    now = time.monotonic() if now is None else now
    with _warned_lock:
        last = _warned.get(pool)
        if last is not None and now - last < UNWRITABLE_WARN_EVERY_S:
            return False
        _warned[pool] = now
    log.warning("opens for writing fail with ENOSPC: %s", reason)  # REASON names the pool
    return True
