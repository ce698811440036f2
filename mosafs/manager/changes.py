"""The namespace's recent changes, for the mounts' caches (docs/client.md, "Coherent
caches").

Every committed write transaction that touched an inode record or a name is recorded here
with the mount it came from (`ORIGIN` in mosafs.capability: the request's metadata; "" for
the manager's own work, which every mount must hear of). A mount asks `since` a few times
a second and drops what it cached of the inodes and names listed; it is not told its own
changes, which it made to its caches as it made them. The list lives in memory only: its
INSTANCE, random per manager process, tells a mount whose manager restarted or failed over
that its position means nothing here, and it drops everything (RESET), as it does when
the changes after its position were trimmed, or are more than one answer lists.

Concurrency: one lock. Writers record after their commit and before their caller is
answered, so a change a client was told of is listed to every mount that asks after that.
"""

from __future__ import annotations

import secrets
import struct
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from mosafs.manager.replog import Op

MAX_KEYS = 200_000   # inodes and names kept; past it the oldest changes go
MAX_ANSWER = 20_000  # inodes and names in one answer; more: RESET instead

_U64 = struct.Struct(">Q")
Name = tuple[int, str]


@dataclass(frozen=True)
class Answer:
    instance: str
    seq: int
    reset: bool
    inodes: list[int] = field(default_factory=list)
    names: list[Name] = field(default_factory=list)


class ChangeList:
    """See the module docstring. INODES_DB and NAMES_DB: the sub-database indexes (as a
    write transaction's recorded ops name them) of inode records and of names."""

    def __init__(self, inodes_db: int, names_db: int, *, max_keys: int = MAX_KEYS,
                 max_answer: int = MAX_ANSWER) -> None:
        self.instance = secrets.token_hex(8)
        self._inodes_db, self._names_db = inodes_db, names_db
        self._max_keys, self._max_answer = max_keys, max_answer
        self._lock = threading.Lock()
        self._seq = 0
        self._floor = 0  # every change after this seq is still listed
        self._kept: deque[tuple[int, str, tuple[int, ...], tuple[Name, ...]]] = deque()
        self._keys = 0

    def record(self, origin: str, ops: Sequence[Op]) -> None:
        """A committed transaction's OPS, made for ORIGIN (a mount's id, or "")."""
        inodes: set[int] = set()
        names: set[Name] = set()
        for db, key, _ in ops:
            if db == self._inodes_db and len(key) == 8:
                inodes.add(_U64.unpack(key)[0])
            elif db == self._names_db and len(key) > 8:
                names.add((_U64.unpack_from(key)[0], key[8:].decode(errors="replace")))
        if not inodes and not names:
            return
        with self._lock:
            self._seq += 1
            self._kept.append((self._seq, origin, tuple(inodes), tuple(names)))
            self._keys += len(inodes) + len(names)
            while self._keys > self._max_keys and len(self._kept) > 1:
                seq, _, gone_inodes, gone_names = self._kept.popleft()
                self._keys -= len(gone_inodes) + len(gone_names)
                self._floor = seq

    @property
    def seq(self) -> int:
        with self._lock:
            return self._seq

    def since(self, instance: str, seq: int, origin: str) -> Answer:
        """What changed after SEQ of list INSTANCE, but for what ORIGIN changed itself."""
        with self._lock:
            newest = self._seq
            if instance != self.instance or seq < self._floor or seq > newest:
                return Answer(self.instance, newest, reset=True)
            inodes: set[int] = set()
            names: set[Name] = set()
            for kept_seq, who, changed, named in reversed(self._kept):
                if kept_seq <= seq:
                    break
                if who and who == origin:
                    continue
                inodes.update(changed)
                names.update(named)
                if len(inodes) + len(names) > self._max_answer:
                    return Answer(self.instance, newest, reset=True)
        return Answer(self.instance, newest, reset=False, inodes=sorted(inodes),
                      names=sorted(names))

