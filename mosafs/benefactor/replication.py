"""The source side of replication (DESIGN §8): copy chunks stored here to another
benefactor, as the manager asks. Each chunk is read and verified like a GetChunk (a corrupt
copy is never spread), then put to the target, which verifies it again.

Priority of new writes: at most `concurrency` replication requests run at once here, and
one request copies its chunks one after another, so replication uses a small, fixed share
of this benefactor's threads, disk and network, and client puts keep the rest.

A target that cannot be reached (down, or slower than the put's deadline) or is full ends
the request at once: the rest of its chunks would fail the same way, one deadline each.
The reply says which ("unreachable", "full", "failed"), so the manager stops choosing that
target.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mosafs.addresses import port_of
from mosafs.benefactor.store import ChunkStore
from mosafs.errors import DeadlineExceeded, InvalidArgument, MosafsError, NoSpace, Unavailable
from mosafs.ids import check_id

log = logging.getLogger(__name__)

# put(target address, chunk id, bytes, timeout): store one chunk on another benefactor
PutFn = Callable[[str, bytes, bytes, float], None]
MAX_IDS = 4096
MiB = 1 << 20
# Deadline of one put: a floor for connecting and a slow disk, plus the chunk at a rate
# far below any benefactor's.
PUT_FLOOR_S = 5.0
PUT_RATE = 4 * MiB


@dataclass
class Outcome:
    copied: list[bool]
    errors: list[str]
    target_problem: str = ""  # "unreachable" | "full" | "failed": the target stopped it


class ChunkReplicator:
    def __init__(self, store: ChunkStore, put: PutFn, *, concurrency: int = 2) -> None:
        self._store = store
        self._put = put
        self._slots = threading.BoundedSemaphore(concurrency)

    def replicate(self, ids: Sequence[bytes], target: str) -> Outcome:
        """Copy IDS to TARGET, each chunk with its own deadline."""
        if len(ids) > MAX_IDS:
            raise InvalidArgument(f"at most {MAX_IDS} ids per replication request")
        check_target(target)
        for cid in ids:
            check_id(cid)  # all refused before any is copied
        out = Outcome([False] * len(ids), [""] * len(ids))
        with self._slots:
            for i, cid in enumerate(ids):
                try:
                    data = self._store.get(cid)
                except MosafsError as exc:  # this chunk only (corrupt or missing here)
                    out.errors[i] = exc.message
                    continue
                try:
                    self._put(target, cid, data, PUT_FLOOR_S + len(data) / PUT_RATE)
                except MosafsError as exc:
                    # The target's refusal: the manager stops choosing it for a while (a
                    # target failing another way, a bad disk, would be chosen again and
                    # again otherwise).
                    out.errors[i] = exc.message
                    out.target_problem = target_problem(exc)
                    break
                out.copied[i] = True
        failed = [e for e in out.errors if e]
        if failed or out.target_problem:
            log.info("replication to %s: %d of %d chunks not copied (%s)", target,
                     out.copied.count(False), len(ids), out.target_problem or failed[0])
        return out


def target_problem(exc: MosafsError) -> str:
    """What a put's failure says of its target: "full", "unreachable", or "failed"
    (any other refusal)."""
    if isinstance(exc, NoSpace):
        return "full"
    if isinstance(exc, Unavailable | DeadlineExceeded):
        return "unreachable"
    return "failed"


def check_target(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port_of(port) \
            or len(address) > 300 or any(c.isspace() or c == "/" for c in address):
        raise InvalidArgument(f"bad target address {address[:80]!r}: use HOST:PORT")
