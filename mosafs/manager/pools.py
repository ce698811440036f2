"""Pools: named settings for new writes (replication R, stripe width W, chunker, write
semantics, hash backend). For now there is one pool, "default", created at the first start;
the choice of a file's pool is made in one place (core.Manager.pool_for) so that folder
assignments can plug in later."""

from __future__ import annotations

from mosafs._proto import common_pb2
from mosafs.errors import ConfigError, MosafsError

DEFAULT_POOL = "default"
DEFAULT_CHUNKER = "cdc:262144:1048576:4194304"
WRITE_SEMANTICS = ("optimistic", "pessimistic")
HASH_BACKENDS = ("auto", "cpu", "gpu")
MAX_CHUNK_BYTES = 64 << 20  # the largest chunk a spec may ask for (and a commit may name)
MAX_REPLICATION = 16
MAX_STRIPE_WIDTH = 1024


def default_settings(name: str = DEFAULT_POOL) -> common_pb2.PoolSettings:
    return common_pb2.PoolSettings(
        name=name, replication=1, stripe_width=3, chunker=DEFAULT_CHUNKER,
        write_semantics="optimistic", hash_backend="auto",
    )


def check_chunker(spec: str) -> str:
    """Validate a chunker spec; the chunking package owns the full parser when it is present."""
    try:
        from mosafs.chunking.spec import parse_spec  # type: ignore[import-not-found]
    except ImportError:
        try:
            from mosafs.chunking import parse_spec  # type: ignore[attr-defined,no-redef]
        except ImportError:
            return _check_chunker_minimal(spec)
    try:
        parse_spec(spec)
    except (MosafsError, ValueError) as exc:
        raise ConfigError(f"bad chunker spec {spec!r}: {exc}") from None
    return spec


def _check_chunker_minimal(spec: str) -> str:
    """`fixed:SIZE` or `cdc:MIN:AVG:MAX` with positive integers (DESIGN §5)."""
    kind, _, rest = spec.partition(":")
    try:
        sizes = [int(part) for part in rest.split(":")]
    except ValueError:
        sizes = []
    usage = "use fixed:SIZE or cdc:MIN:AVG:MAX (bytes, AVG a power of two)"
    if kind == "fixed" and len(sizes) == 1:
        ok = 0 < sizes[0] <= MAX_CHUNK_BYTES
    elif kind == "cdc" and len(sizes) == 3:
        lo, avg, hi = sizes
        ok = 0 < lo <= avg <= hi <= MAX_CHUNK_BYTES and avg & (avg - 1) == 0
    else:
        ok = False
    if not ok:
        raise ConfigError(f"bad chunker spec {spec!r}: {usage}, at most {MAX_CHUNK_BYTES} bytes")
    return spec


def check_settings(settings: common_pb2.PoolSettings) -> common_pb2.PoolSettings:
    if not settings.name:
        raise ConfigError("a pool needs a name")
    if not 1 <= settings.replication <= MAX_REPLICATION:
        raise ConfigError(f"replication must be 1..{MAX_REPLICATION}, got {settings.replication}")
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
) -> common_pb2.PoolSettings:
    """A validated copy of SETTINGS with every argument that is not None applied."""
    for what, value in (("replication", replication), ("stripe width", stripe_width)):
        if value is not None and not 0 < value < 1 << 32:
            raise ConfigError(f"{what} must be a positive integer, got {value}")
    out = common_pb2.PoolSettings()
    out.CopyFrom(settings)
    if replication is not None:
        out.replication = replication
    if stripe_width is not None:
        out.stripe_width = stripe_width
    if chunker is not None:
        out.chunker = chunker
    if write_semantics is not None:
        out.write_semantics = write_semantics
    if hash_backend is not None:
        out.hash_backend = hash_backend
    return check_settings(out)
