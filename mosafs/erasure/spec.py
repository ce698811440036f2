"""The shape of an erasure-coded chunk (DESIGN §10): K data + M parity fragments of S bytes.

Cheap to import (no numpy, no ctypes): the manager and the command line can check a pool's
K and M, and size fragments, without loading a coder. Parsing the pool's `ec:K+M` text is
the redundancy parser's job; this module starts from the two numbers.

Layout of a chunk of L bytes under K+M:

* S = 64 * ceil(L / (64 K)): every fragment is a whole number of 64-byte lines, so SIMD
  (ISA-L) and 16-byte vector loads (the GPU kernel) never meet a ragged end;
* the chunk, zero-padded to K*S, is cut into data fragments j = bytes [jS, (j+1)S);
* data fragment j holds min(S, max(0, L - jS)) bytes of the chunk, the rest is padding:
  at most one fragment is partly padding, and the ones after it are all padding (small
  chunks); coders read only the real bytes and treat the rest as zeros.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from mosafs.errors import ConfigError, InvalidArgument

ALIGN = 64
"""Fragment sizes are multiples of this many bytes."""
MIN_K, MAX_K = 1, 32
MIN_M, MAX_M = 1, 8
"""Supported K and M. The field has 256 elements, so a Cauchy matrix exists for K+M up to
256; 32+8 bounds the coders' tables and the GPU kernel's registers (one accumulator per
parity row), and is far beyond what a pool of benefactors needs (16+4 at most)."""


def fragment_size(length: int, k: int) -> int:
    """S for a chunk of LENGTH bytes cut into K data fragments (DESIGN §10)."""
    _check_length(length)
    return ALIGN * -(-length // (ALIGN * k))


def _check_length(length: int) -> None:
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise InvalidArgument(f"a chunk to erasure-code has at least 1 byte, got {length!r}")


def _check_count(what: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"erasure code: {what} must be a whole number from {low} to {high}, "
                          f"got {value!r}")


@dataclass(frozen=True, slots=True)
class Code:
    """A validated K+M: K data fragments, M parity fragments, any K of the K+M suffice."""

    k: int
    m: int

    def __post_init__(self) -> None:
        # Validating here means no coder can be driven with an unchecked K or M.
        _check_count("K (data fragments)", self.k, MIN_K, MAX_K)
        _check_count("M (parity fragments)", self.m, MIN_M, MAX_M)

    def __str__(self) -> str:
        return f"ec:{self.k}+{self.m}"

    @staticmethod
    def of(k: int, m: int) -> Code:
        """Code(k, m), validated once per (k, m) and shared (coders call this per chunk)."""
        return _code(k, m)

    @property
    def n(self) -> int:
        """Fragments in all: K + M."""
        return self.k + self.m

    def fragment_size(self, length: int) -> int:
        return fragment_size(length, self.k)

    def layout(self, length: int) -> Layout:
        """The layout of a LENGTH-byte chunk (cached: chunk sizes repeat)."""
        return _layout(self, length)

    def check_index(self, index: int) -> int:
        """INDEX when it names a fragment (0..K+M-1), else InvalidArgument."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.n:
            raise InvalidArgument(f"{self}: fragment index must be 0..{self.n - 1}, "
                                  f"got {index!r}")
        return index


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the bytes of one chunk of LENGTH bytes go under CODE."""

    code: Code
    length: int
    size: int = 0
    """S, the bytes of every fragment (computed)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", fragment_size(self.length, self.code.k))

    @property
    def padded_length(self) -> int:
        """K * S: the chunk with its zero padding."""
        return self.code.k * self.size

    def data_bytes(self, j: int) -> int:
        """How many bytes of the chunk data fragment J holds (the rest is zero padding)."""
        return min(self.size, max(0, self.length - j * self.size))

    @property
    def partial(self) -> int | None:
        """The data fragment that is partly chunk, partly padding, or None when every data
        fragment is all chunk or all padding."""
        j, rest = divmod(self.length, self.size)
        return j if rest else None

    @property
    def carrying(self) -> int:
        """Data fragments holding at least one byte of the chunk (the others are zeros)."""
        return -(-self.length // self.size)


@functools.lru_cache(maxsize=256, typed=True)  # typed: True and 4.0 are no K
def _code(k: int, m: int) -> Code:
    return Code(k, m)


@functools.lru_cache(maxsize=4096, typed=True)
def _layout(code: Code, length: int) -> Layout:
    return Layout(code, length)
