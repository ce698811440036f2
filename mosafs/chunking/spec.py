"""Chunker specs (DESIGN §5): `fixed:SIZE` and `cdc:MIN:AVG:MAX`, sizes in bytes.

This module is cheap to import (no numpy, no numba): the manager and the command line
validate pool settings with it without paying for the compiled chunker.

Bounds (beyond the contract's "AVG a power of two"):

* every size is at least 1 and at most MAX_CHUNK (64 MiB), the largest chunk that the RPC
  layer and the benefactors accept;
* cdc needs MIN <= AVG <= MAX and MIN_CDC_AVG (256) <= AVG, so that the large-chunk mask
  (`L - 2` bits, L = log2(AVG)) still has at least 6 bits: below that nearly every byte
  past AVG would be a cut point and the "content-defined" part would mean little.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from mosafs.errors import ConfigError

DEFAULT_SPEC = "cdc:262144:1048576:4194304"
MAX_CHUNK = 64 * 1024 * 1024
MIN_CDC_AVG = 256

ChunkerKind = Literal["fixed", "cdc"]
_FIELDS = {"fixed": ("SIZE",), "cdc": ("MIN", "AVG", "MAX")}
_FORMS = "'fixed:SIZE' or 'cdc:MIN:AVG:MAX' (sizes in bytes)"
_DIGITS = re.compile(r"[0-9]+")
_WORD = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class ChunkerSpec:
    """A validated chunker. For `fixed`, min_size == avg_size == max_size == SIZE."""

    kind: ChunkerKind
    min_size: int
    avg_size: int
    max_size: int

    def __post_init__(self) -> None:
        # Validating here (not only in parse_spec) means no code path can build a chunker
        # from an unchecked spec.
        _validate(self)

    def __str__(self) -> str:
        return _describe(self)

    @property
    def avg_bits(self) -> int:
        """L = log2(AVG)."""
        return self.avg_size.bit_length() - 1

    @property
    def mask_s(self) -> int:
        """The top L+2 bits of a 64-bit word: the stricter test, for sizes below AVG."""
        return _top_bits(self.avg_bits + 2)

    @property
    def mask_l(self) -> int:
        """The top L-2 bits: the looser test, for sizes from AVG on."""
        return _top_bits(self.avg_bits - 2)


def parse_spec(text: str) -> ChunkerSpec:
    """Parse 'fixed:SIZE' or 'cdc:MIN:AVG:MAX'; raise ConfigError with a one-line reason."""
    if not isinstance(text, str):
        raise ConfigError(f"chunker spec must be text like {_FORMS}, got {type(text).__name__}")
    stripped = text.strip()
    kind, *fields = stripped.split(":")
    if kind not in _FIELDS:
        raise ConfigError(f"chunker {stripped!r}: unknown kind {kind!r}; use {_FORMS}")
    names = _FIELDS[kind]
    if len(fields) != len(names):
        form = ":".join((kind, *names))
        raise ConfigError(
            f"chunker {stripped!r}: '{kind}' takes {len(names)} size(s), {form}, "
            f"got {len(fields)}"
        )
    sizes = [_parse_size(stripped, name, field) for name, field in zip(names, fields, strict=True)]
    if kind == "fixed":
        return ChunkerSpec("fixed", sizes[0], sizes[0], sizes[0])
    return ChunkerSpec("cdc", sizes[0], sizes[1], sizes[2])


def _parse_size(text: str, name: str, field: str) -> int:
    # Plain ASCII digits only: int() would also take '+5', ' 5' and '5_000', which would
    # make two spellings of one chunker.
    if not _DIGITS.fullmatch(field):
        raise ConfigError(
            f"chunker {text!r}: {name} must be a whole number of bytes, got {field!r}"
        )
    return int(field)


def _validate(spec: ChunkerSpec) -> None:
    text = _describe(spec)
    if spec.kind not in _FIELDS:
        raise ConfigError(f"chunker {text!r}: unknown kind {spec.kind!r}; use {_FORMS}")
    names = ("MIN", "AVG", "MAX") if spec.kind == "cdc" else ("SIZE",) * 3
    for name, size in zip(names, (spec.min_size, spec.avg_size, spec.max_size), strict=True):
        if not isinstance(size, int) or isinstance(size, bool):
            raise ConfigError(f"chunker {text!r}: {name} must be an integer, got {size!r}")
        if not 1 <= size <= MAX_CHUNK:
            raise ConfigError(
                f"chunker {text!r}: {name} must be between 1 and {MAX_CHUNK} bytes "
                f"(64 MiB), got {size}"
            )
    if spec.kind == "fixed":
        if not spec.min_size == spec.avg_size == spec.max_size:
            raise ConfigError(f"chunker {text!r}: a fixed chunker has one size")
        return
    _validate_cdc(text, spec.min_size, spec.avg_size, spec.max_size)


def _validate_cdc(text: str, lo: int, avg: int, hi: int) -> None:
    if avg & (avg - 1):
        below = 1 << (avg.bit_length() - 1)
        raise ConfigError(
            f"chunker {text!r}: AVG must be a power of two, got {avg} "
            f"(nearest: {below} or {below * 2})"
        )
    if avg < MIN_CDC_AVG:
        raise ConfigError(f"chunker {text!r}: AVG must be at least {MIN_CDC_AVG}, got {avg}")
    if not lo <= avg <= hi:
        raise ConfigError(f"chunker {text!r}: sizes must satisfy MIN <= AVG <= MAX")


def _describe(spec: ChunkerSpec) -> str:
    """The canonical text; also used for error messages about a spec being validated."""
    if spec.kind == "fixed":
        return f"fixed:{spec.max_size}"
    return f"{spec.kind}:{spec.min_size}:{spec.avg_size}:{spec.max_size}"


def _top_bits(count: int) -> int:
    return (_WORD >> (64 - count)) << (64 - count)
