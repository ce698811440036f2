"""Redundancy as pools and commands name it: `replicas:R` (R whole copies of every chunk) or
`ec:K+M` (K data and M parity fragments on K+M benefactors; docs/erasure_pools.md). The
spelling and its bounds, below the manager, the admin commands and argument parsing."""

from __future__ import annotations

import re
from dataclasses import dataclass

from mosafs.errors import ConfigError

MAX_REPLICATION = 16
# Erasure coding (docs/erasure_pools.md). K and M are bounded by what the coders are
# checked for (every K+M up to 16+4, tests/unit/test_erasure_*.py); a wider code would
# also need that many benefactors per chunk.
MAX_EC_K = 16
MAX_EC_M = 4
_REDUNDANCY_HELP = ("use replicas:R (R whole copies of every chunk, e.g. replicas:3) or "
                    "ec:K+M (K data + M parity fragments on K+M benefactors, e.g. ec:4+2)")
_EC = re.compile(r"ec:(\d{1,9})\+(\d{1,9})", re.ASCII)
_REPLICAS = re.compile(r"replicas:(\d{1,9})", re.ASCII)


@dataclass(frozen=True)
class Scheme:
    """A pool's redundancy: R whole copies (k == 0), or K data + M parity fragments."""

    replicas: int = 1
    k: int = 0
    m: int = 0

    @property
    def coded(self) -> bool:
        return self.k > 0

    @property
    def width(self) -> int:
        """Distinct benefactors one chunk needs: K+M, or R."""
        return self.k + self.m if self.coded else self.replicas

    def __str__(self) -> str:
        return f"ec:{self.k}+{self.m}" if self.coded else f"replicas:{self.replicas}"


def parse_redundancy(text: str) -> Scheme:
    """`replicas:R` or `ec:K+M`; ConfigError with a one-line reason for anything else."""
    shown = repr(text[:40])
    text = text.strip().lower()
    if (match := _REPLICAS.fullmatch(text)) is not None:
        replicas = int(match[1])
        if not 1 <= replicas <= MAX_REPLICATION:
            raise ConfigError(f"bad redundancy {shown}: R (copies) must be "
                              f"1..{MAX_REPLICATION}, got {replicas}")
        return Scheme(replicas=replicas)
    if (match := _EC.fullmatch(text)) is not None:
        k, m = int(match[1]), int(match[2])
        if not 1 <= k <= MAX_EC_K:
            raise ConfigError(f"bad redundancy {shown}: K (data fragments) must be "
                              f"1..{MAX_EC_K}, got {k}")
        if m == 0:
            raise ConfigError(f"bad redundancy {shown}: M (parity fragments) must be "
                              f"1..{MAX_EC_M}: ec:{k}+0 survives no failure (replicas:1 "
                              f"is that)")
        if not 1 <= m <= MAX_EC_M:
            raise ConfigError(f"bad redundancy {shown}: M (parity fragments) must be "
                              f"1..{MAX_EC_M}, got {m}")
        return Scheme(replicas=m + 1, k=k, m=m)
    raise ConfigError(f"bad redundancy {shown}: {_REDUNDANCY_HELP}")
