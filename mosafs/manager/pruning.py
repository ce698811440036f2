"""Pruning rules (docs/lifecycle.md): which checkpoint images of one series go.

An *image* is one committed version of a file. A *series* is either the files of one
folder whose names match its series pattern with the same key, or a single file whose name
matches no pattern. A series is a list of *steps*: in a series of files each file is one
step (its step number from its name), however many versions it has; for a file of its own
each version is a step (the version number is the step). The rules of a policy:

- keep-all (no rule): nothing goes.
- `keep_last N`: the newest N steps stay (ordered by step number, then commit time), each
  with its newest version; older steps go, and so do the older versions of a kept step
  (superseded: the step is one checkpoint, its newest version is what it holds), except
- `keep_every K` (only with keep_last): the newest version of every step whose number is a
  multiple of K stays too (a thinned-out long-term history);
- `purge_after D`: every image committed more than D ago goes, whatever the other rules say.

So timing cannot change what stays: a step written twice (a commit repeated, a file
rewritten) still counts once, and the newest version of each of the N newest steps is
never removed by keep-last.

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
    gone: dict[tuple[int, int], str] = {}
    if policy.keep_last:
        gone.update(_beyond_last(images, policy))
    if policy.purge_after_ms:
        limit = now_ns - policy.purge_after_ms * 1_000_000
        reason = f"purge-after {format_ms(policy.purge_after_ms)}"
        gone.update({(i.inode, i.version): reason for i in images
                     if i.commit_time_ns < limit})
    order = sorted(images, key=lambda i: (i.step, i.version, i.commit_time_ns), reverse=True)
    return _whole_files_last([i for i in order if (i.inode, i.version) in gone], images,
                             gone)


def steps_newest_first(images: Sequence[Image]) -> list[list[Image]]:
    """IMAGES grouped into steps (one file's versions with one step number), newest step
    first (highest step number, then the most recent commit); each step's images newest
    version first."""
    by_step: dict[tuple[int, int], list[Image]] = {}
    for image in images:
        by_step.setdefault((image.step, image.inode), []).append(image)
    for versions in by_step.values():
        versions.sort(key=lambda i: (i.version, i.commit_time_ns), reverse=True)
    return sorted(by_step.values(), reverse=True,
                  key=lambda v: (v[0].step, max(i.commit_time_ns for i in v), v[0].inode))


def _beyond_last(images: Sequence[Image], policy: Policy) -> dict[tuple[int, int], str]:
    """What keep-last (with keep-every) removes: every step after the N newest, and every
    version of a step but its newest (superseded); keep-every spares the newest version of
    a step that is a multiple of K."""
    reason = f"keep-last {policy.keep_last}"
    gone: dict[tuple[int, int], str] = {}
    for rank, versions in enumerate(steps_newest_first(images)):
        newest, *older = versions
        kept_by_every = policy.keep_every and newest.step % policy.keep_every == 0
        if rank >= policy.keep_last and not kept_by_every:
            gone.update({(i.inode, i.version): reason for i in versions})
            continue
        superseded = f"{reason}, superseded by version {newest.version}"
        gone.update({(i.inode, i.version): superseded for i in older})
    return gone


def _whole_files_last(chosen: list[Image], images: Sequence[Image],
                      gone: dict[tuple[int, int], str]) -> list[tuple[Image, str]]:
    """Never the newest version of a file while an older one stays: such a file keeps its
    newest version (a guard: keep-last and keep-every keep a step's newest version or
    nothing of it, and purge-after removes the older versions of a file first)."""
    partial = set()
    for image in images:
        if (image.inode, image.version) not in gone:
            partial.add(image.inode)
    return [(i, gone[(i.inode, i.version)]) for i in chosen
            if not (i.newest and i.inode in partial)]
