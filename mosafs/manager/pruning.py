"""Pruning rules (docs/lifecycle.md): which checkpoint images of one series go.

An *image* is one committed version of a file. A *series* is either the files of one
folder whose names match its series pattern with the same key (their images ordered by
step, then version), or a single file whose name matches no pattern (its versions, ordered
by version number; there the version number is the step). The rules of a policy:

- keep-all (no rule): nothing goes.
- `keep_last N`: the newest N images of the series stay; older ones go, except
- `keep_every K` (only with keep_last): an image whose step is a multiple of K and which is
  the newest image of that step stays too (a thinned-out long-term history);
- `purge_after D`: every image committed more than D ago goes, whatever the other rules say.

Within one file the newest version is never removed while an older one stays, so a file
either loses old versions or goes as a whole with its last one.

This module is pure: it decides; mosafs.manager.folders reads the images and applies it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mosafs.errors import ConfigError

MAX_KEEP = 1_000_000
MAX_PURGE_MS = 100 * 365 * 86_400_000  # a century


@dataclass(frozen=True)
class Policy:
    keep_last: int = 0       # 0: no count limit
    keep_every: int = 0      # 0: none
    purge_after_ms: int = 0  # 0: never

    @property
    def keeps_all(self) -> bool:
        return not (self.keep_last or self.purge_after_ms)

    def describe(self) -> str:
        if self.keeps_all:
            return "keep-all"
        parts = []
        if self.keep_last:
            parts.append(f"keep-last {self.keep_last}")
        if self.keep_every:
            parts.append(f"keep-every {self.keep_every}")
        if self.purge_after_ms:
            parts.append(f"purge-after {format_ms(self.purge_after_ms)}")
        return ", ".join(parts)


def check_policy(policy: Policy) -> Policy:
    for what, value, top in (("keep-last", policy.keep_last, MAX_KEEP),
                             ("keep-every", policy.keep_every, MAX_KEEP),
                             ("purge-after", policy.purge_after_ms, MAX_PURGE_MS)):
        if not 0 <= value <= top:
            raise ConfigError(f"{what} must be 0..{top}, got {value}")
    if policy.keep_every and not policy.keep_last:
        raise ConfigError("keep-every needs keep-last: the newest images are kept by count, "
                          "every Kth step on top of them")
    return policy


def format_ms(ms: int) -> str:
    """A duration as the largest unit that divides it: 7d, 12h, 90s, 1500ms."""
    for unit, size in (("w", 604_800_000), ("d", 86_400_000), ("h", 3_600_000),
                       ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True)
class Image:
    inode: int
    version: int
    step: int             # the series step; the version number for a file of its own
    commit_time_ns: int
    newest: bool = False  # the newest version of its file


def select(images: Sequence[Image], policy: Policy, now_ns: int) -> list[tuple[Image, str]]:
    """The images of ONE series that POLICY removes at NOW_NS, each with the rule's name."""
    if policy.keeps_all or not images:
        return []
    order = sorted(images, key=lambda i: (i.step, i.version, i.commit_time_ns), reverse=True)
    gone: dict[tuple[int, int], str] = {}
    if policy.keep_last:
        steps_seen: set[int] = set()
        for rank, image in enumerate(order):
            newest_of_step = image.step not in steps_seen
            steps_seen.add(image.step)
            kept_by_every = (policy.keep_every and newest_of_step
                             and image.step % policy.keep_every == 0)
            if rank >= policy.keep_last and not kept_by_every:
                gone[(image.inode, image.version)] = f"keep-last {policy.keep_last}"
    if policy.purge_after_ms:
        limit = now_ns - policy.purge_after_ms * 1_000_000
        for image in order:
            if image.commit_time_ns < limit:
                gone[(image.inode, image.version)] = \
                    f"purge-after {format_ms(policy.purge_after_ms)}"
    return _whole_files_last([i for i in order if (i.inode, i.version) in gone], images,
                             gone)


def _whole_files_last(chosen: list[Image], images: Sequence[Image],
                      gone: dict[tuple[int, int], str]) -> list[tuple[Image, str]]:
    """Never the newest version of a file while an older one stays: such a file keeps its
    newest version (only reachable through keep-every, which protects the newest image of
    a step: older versions of the same step have lower ranks, so this is a guard)."""
    partial = set()
    for image in images:
        if (image.inode, image.version) not in gone:
            partial.add(image.inode)
    return [(i, gone[(i.inode, i.version)]) for i in chosen
            if not (i.newest and i.inode in partial)]
