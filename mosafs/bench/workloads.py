"""Deterministic benchmark workloads (the stdchk/MosaStore evaluation's three kinds).

Every workload is a series of files ("steps") of one size, made from a seed alone, so any
process (the benchmark, a writer in a network namespace, a run on another machine) makes
the same bytes:

- `different`: no similarity at all: every step is new random bytes.
- `similar`: the same file written again and again (every step equals the first).
- `checkpoint`: process-memory-like images. Step 1 is random; each later step is the
  previous one with a fraction (`change`) of its 4 KiB pages rewritten, in `regions`
  contiguous runs of pages (the arrays an application updated; memory changes cluster),
  and a few regions shifted by small insertions (`insertions` per step, each 16 to 4096
  bytes, the tail trimmed to keep the size). Fixed-size chunking loses everything after an
  insertion; CDC does not. How much a chunker finds again depends on the chunk size
  against the run length: the benchmark reports the similarity it *detected*.

Random bytes come from the BLAKE3 XOF (incompressible, fast); page choices and insertion
points from numpy's PCG64 seeded by the workload, so they do not depend on the platform.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from mosafs.errors import ConfigError

PAGE = 4096
KINDS = ("different", "similar", "checkpoint")
MIN_SIZE, MAX_SIZE = 1 << 20, 1 << 30


@dataclass(frozen=True)
class Workload:
    kind: str = "checkpoint"
    size: int = 64 << 20
    steps: int = 4
    change: float = 0.2     # checkpoint: fraction of pages rewritten per step
    regions: int = 8        # checkpoint: contiguous runs those pages form
    insertions: int = 4     # checkpoint: insertions per step
    seed: str = "mosafs-bench"

    def check(self) -> Workload:
        if self.kind not in KINDS:
            raise ConfigError(f"unknown workload {self.kind!r}; use one of {', '.join(KINDS)}")
        if not MIN_SIZE <= self.size <= MAX_SIZE:
            raise ConfigError(f"workload size must be 1 MiB..1 GiB, got {self.size} bytes")
        if not 1 <= self.steps <= 1000:
            raise ConfigError(f"workload steps must be 1..1000, got {self.steps}")
        if not 0.0 <= self.change <= 1.0 or not 0 <= self.insertions <= 1000 \
                or not 1 <= self.regions <= 100_000:
            raise ConfigError("change must be 0..1, insertions 0..1000, regions 1..100000")
        return self

    @property
    def similarity(self) -> float:
        """The designed share of a step's bytes that the previous step already had."""
        if self.kind == "different":
            return 0.0
        if self.kind == "similar":
            return 1.0
        return 1.0 - self.change

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Workload:
        return cls(**data).check()


def _random(seed: str, n: int) -> bytes:
    import blake3

    return blake3.blake3(seed.encode()).digest(length=n)


def steps(workload: Workload) -> Iterator[bytes]:
    """The workload's files, step 1 first (each generated from the one before)."""
    import numpy as np

    w = workload.check()
    if w.kind == "different":
        for step in range(1, w.steps + 1):
            yield _random(f"{w.seed}/different/{step}", w.size)
        return
    current = _random(f"{w.seed}/{w.kind}/1", w.size)
    yield current
    rng = np.random.Generator(np.random.PCG64(_seed_int(w.seed)))
    for step in range(2, w.steps + 1):
        if w.kind == "checkpoint":
            current = _next_checkpoint(current, w, step, rng)
        yield current


def _seed_int(seed: str) -> int:
    import blake3

    return int.from_bytes(blake3.blake3(seed.encode()).digest(length=8), "little")


def _next_checkpoint(previous: bytes, w: Workload, step: int, rng: Any) -> bytes:
    import numpy as np

    image = np.frombuffer(previous, dtype=np.uint8).copy()
    pages = len(image) // PAGE
    count = round(pages * w.change)
    if count:
        # REGIONS runs of pages, evenly long, at random places among equal slots (so they
        # never overlap and together rewrite exactly COUNT pages).
        runs = min(w.regions, count)
        slot = pages // runs
        lengths = [count // runs + (i < count % runs) for i in range(runs)]
        fresh = _random(f"{w.seed}/pages/{step}", count * PAGE)
        done = 0
        for i, run in enumerate(lengths):
            first = i * slot + int(rng.integers(0, max(1, slot - run + 1)))
            image[first * PAGE:(first + run) * PAGE] = np.frombuffer(
                fresh, dtype=np.uint8, count=run * PAGE, offset=done * PAGE)
            done += run
    if w.insertions:
        at = np.sort(rng.integers(0, len(image), size=w.insertions))
        lengths = rng.integers(16, PAGE + 1, size=w.insertions)
        parts, last = [], 0
        for i, (offset, length) in enumerate(zip(at.tolist(), lengths.tolist(), strict=True)):
            parts.append(image[last:offset].tobytes())
            parts.append(_random(f"{w.seed}/insert/{step}/{i}", length))
            last = offset
        parts.append(image[last:].tobytes())
        return b"".join(parts)[:w.size]
    return image.tobytes()
