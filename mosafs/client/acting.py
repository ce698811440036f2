"""Whom a manager request acts as: the uid and groups of the process whose FUSE request
caused it (DESIGN §11: the manager checks permissions itself, for these ids, within the
certificate's capability; mosafs.capability says how the manager reads them).

A FUSE handler that has a request context sets ACTING (mosafs.client.operations); calls
made for a file handle (read, write, release) act as the process that opened it. The ids
travel as gRPC metadata with every manager call (mosafs.client.rpc). Calls the mount makes
on its own (lease renewals, the base of a write) carry no ids and act as the certificate's
own identity.
"""

from __future__ import annotations

import contextvars
import time

from mosafs.capability import GIDS_KEY, UID_KEY

Acting = tuple[int, tuple[int, ...]]  # uid, groups (the primary one first)
ACTING: contextvars.ContextVar[Acting | None] = contextvars.ContextVar("mosafs_acting",
                                                                      default=None)
_GROUPS_TTL = 1.0
_groups: dict[tuple[int, int, int], tuple[float, tuple[int, ...]]] = {}


def _supplementary(pid: int) -> tuple[int, ...]:
    """The groups of process PID from /proc (the kernel hands FUSE only uid and gid)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return tuple(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass  # gone already, or not ours to read: the primary group alone
    return ()


def of_request(uid: int, gid: int, pid: int) -> Acting:
    """The ids of a FUSE request, its groups cached for a second per process."""
    key = (pid, uid, gid)
    now = time.monotonic()
    hit = _groups.get(key)
    if hit is None or now - hit[0] > _GROUPS_TTL:
        if len(_groups) > 4096:
            _groups.clear()
        hit = (now, tuple(dict.fromkeys((gid, *_supplementary(pid)))) if pid else (gid,))
        _groups[key] = hit
    return uid, hit[1]


def metadata() -> tuple[tuple[str, str], ...]:
    """The gRPC metadata of the acting ids (none for the mount's own calls)."""
    acting = ACTING.get()
    if acting is None:
        return ()
    uid, gids = acting
    return ((UID_KEY, str(uid)), (GIDS_KEY, ",".join(map(str, gids))))
