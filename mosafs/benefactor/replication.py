"""The source side of replication (DESIGN §8): copy chunks stored here to another
benefactor, as the manager asks. Each chunk is read and verified like a GetChunk (a corrupt
copy is never spread), then put to the target, which verifies it again.

Priority of new writes: at most `concurrency` replication requests run at once here, and
one request copies its chunks one after another, so replication uses a small, fixed share
of this benefactor's threads, disk and network, and client puts keep the rest.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from mosafs.benefactor.chunkstore import ChunkStore
from mosafs.errors import InvalidArgument, MosafsError
from mosafs.ids import check_id

log = logging.getLogger(__name__)

# put(target address, chunk id, bytes): store one chunk on another benefactor
PutFn = Callable[[str, bytes, bytes], None]
MAX_IDS = 4096


class ChunkReplicator:
    def __init__(self, store: ChunkStore, put: PutFn, *, concurrency: int = 2) -> None:
        self._store = store
        self._put = put
        self._slots = threading.BoundedSemaphore(concurrency)

    def replicate(self, ids: Sequence[bytes], target: str) -> tuple[list[bool], list[str]]:
        """Copy IDS to TARGET: (copied[i], error[i]) for each id."""
        if len(ids) > MAX_IDS:
            raise InvalidArgument(f"at most {MAX_IDS} ids per replication request")
        _check_target(target)
        for cid in ids:
            check_id(cid)  # all refused before any is copied
        copied: list[bool] = []
        problems: list[str] = []
        with self._slots:
            for cid in ids:
                try:
                    self._put(target, cid, self._store.get(cid))
                except MosafsError as exc:
                    copied.append(False)
                    problems.append(exc.message)
                    continue
                copied.append(True)
                problems.append("")
        failed = [p for p in problems if p]
        if failed:
            log.info("replication to %s: %d of %d chunks not copied (first: %s)",
                     target, len(failed), len(ids), failed[0])
        return copied, problems


def _check_target(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 \
            or len(address) > 300 or any(c.isspace() or c == "/" for c in address):
        raise InvalidArgument(f"bad target address {address[:80]!r}: use HOST:PORT")
