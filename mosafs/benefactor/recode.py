"""Repair and conversion of erasure-coded chunks on the benefactor that the manager asks
(docs/erasure_pools.md, "Repair" and "Conversion"): one RecodeChunk request is one chunk.

1. Read the chunk: a whole copy if one is listed (this benefactor's own first), else K of
   its fragments, this benefactor's own ones first and the others from peers in parallel
   (at most K fetches in flight; a fragment that cannot be read, or whose bytes do not
   hash to its id, is replaced by the next one listed). A corrupt fragment is reported to
   its holder (a GetChunk with verify: the holder hashes its copy, deletes it and tells
   the manager) or, when it is our own, deleted and reported here (Scrubber.check).
2. Decode (ISA-L, mosafs.erasure; no arithmetic when the K data fragments were read) and
   verify the chunk against its id: nothing that does not hash to the chunk id is ever
   encoded and spread.
3. Encode the layout asked for (fragments of out_k + out_m, or the whole chunk), name
   each fragment by its BLAKE3 (a repair's must equal the ids the manager recorded, or the
   request is refused) and put each target's blob: to a peer as a peer's copy (PutChunk
   from a benefactor certificate needs no token), or into this store (address "").

Peers' GetChunk needs read tokens even between benefactors (docs/operations.md, "Chunk
access tokens"): the manager signs one per blob for this benefactor's certificate and
sends them with the request. Priority of client traffic: at most `concurrency` requests
run here at once (the manager also bounds what it sends). Bad input (ids, sizes, indices,
addresses) is InvalidArgument before anything is read. Domain code: no grpc.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from mosafs import ids
from mosafs._proto import benefactor_pb2
from mosafs.benefactor.replication import (
    PUT_FLOOR_S,
    PUT_RATE,
    PutFn,
    check_target,
    target_problem,
)
from mosafs.benefactor.store import CORRUPT, ChunkStore
from mosafs.chunking.spec import MAX_CHUNK
from mosafs.erasure.spec import Code
from mosafs.errors import (
    ConfigError,
    IntegrityError,
    InvalidArgument,
    MosafsError,
    Unavailable,
)
from mosafs.ids import check_id

log = logging.getLogger(__name__)

# get(address, blob id, token, timeout, verify) -> the blob's bytes (not verified here)
GetFn = Callable[[str, bytes, bytes, float, bool], Any]
# check(blob id) -> SOUND | CORRUPT | GONE: our own copy hashed; a corrupt one is deleted
# and reported to the manager (Scrubber.check)
CheckFn = Callable[[bytes], str]
MAX_SOURCES = 64
MAX_TARGETS = 32
MAX_TOKEN_BYTES = 512
GET_FLOOR_S = 5.0
GET_RATE = 4 << 20  # bytes/s: a deadline far above what any peer needs
CLOSE_WAIT_S = 5.0  # how long close() lets running requests end (they stop at their next
                    # read or put)


@dataclass(frozen=True)
class Source:
    index: int     # fragment index; 0 for a whole copy
    address: str   # "" = this benefactor
    token: bytes = b""


@dataclass(frozen=True)
class Target:
    index: int     # fragment index of the new layout; 0 for a whole copy
    address: str   # "" = keep it here


@dataclass(frozen=True)
class RecodeJob:
    chunk_id: bytes
    length: int
    copies: Sequence[Source] = ()
    k: int = 0
    m: int = 0
    fragment_ids: Sequence[bytes] = ()
    fragments: Sequence[Source] = ()
    out_k: int = 0
    out_m: int = 0
    targets: Sequence[Target] = ()

    @property
    def repair(self) -> bool:
        """Fragments of the same layout as those read: their ids are known."""
        return self.out_k > 0 and (self.out_k, self.out_m) == (self.k, self.m)


@dataclass
class RecodeOutcome:
    fragment_ids: list[bytes]
    stored: list[bool]
    errors: list[str]
    target_problems: list[str]
    unreadable: list[int] = field(default_factory=list)


def job_of(request: benefactor_pb2.RecodeChunkRequest) -> RecodeJob:
    """The job a RecodeChunk request asks for (checked by Recoder.recode)."""

    def source(message: benefactor_pb2.BlobSource) -> Source:
        return Source(message.index, message.address, message.token)

    return RecodeJob(
        chunk_id=request.chunk_id, length=request.length,
        copies=[source(s) for s in request.copies], k=request.ec_k, m=request.ec_m,
        fragment_ids=list(request.fragment_ids),
        fragments=[source(s) for s in request.fragments], out_k=request.out_k,
        out_m=request.out_m, targets=[Target(t.index, t.address) for t in request.targets])


def reply_of(out: RecodeOutcome) -> benefactor_pb2.RecodeChunkResponse:
    return benefactor_pb2.RecodeChunkResponse(
        fragment_ids=out.fragment_ids, stored=out.stored, errors=out.errors,
        target_problems=out.target_problems, unreadable=out.unreadable)


def check_job(job: RecodeJob) -> RecodeJob:
    """InvalidArgument, saying what, for anything a well-behaved manager never sends."""
    check_id(job.chunk_id)
    what = f"recode of chunk {job.chunk_id.hex()}"
    if not 1 <= job.length <= MAX_CHUNK:
        raise InvalidArgument(f"{what}: length must be 1..{MAX_CHUNK}, got {job.length}")
    if len(job.copies) + len(job.fragments) > MAX_SOURCES:
        raise InvalidArgument(f"{what}: at most {MAX_SOURCES} sources")
    if not 1 <= len(job.targets) <= MAX_TARGETS:
        raise InvalidArgument(f"{what}: 1..{MAX_TARGETS} targets, got {len(job.targets)}")
    for src in (*job.copies, *job.fragments):
        if src.address:
            check_target(src.address)
        if len(src.token) > MAX_TOKEN_BYTES:
            raise InvalidArgument(f"{what}: a read token of {len(src.token)} bytes")
    if job.k or job.m:
        _check_code(what, job.k, job.m)
        width = job.k + job.m
        if len(job.fragment_ids) != width:
            raise InvalidArgument(f"{what}: ec:{job.k}+{job.m} needs {width} fragment ids, "
                                  f"got {len(job.fragment_ids)}")
        for fid in job.fragment_ids:
            check_id(fid)
        indices = [src.index for src in job.fragments]
        if any(i >= width for i in indices) or len(set(indices)) != len(indices):
            raise InvalidArgument(f"{what}: fragment sources must name distinct indices "
                                  f"0..{width - 1}, got {indices}")
    elif job.fragments:
        raise InvalidArgument(f"{what}: fragment sources without ec_k and ec_m")
    if not job.copies and not job.fragments:
        raise InvalidArgument(f"{what}: no source to read the chunk from")
    if job.out_k or job.out_m:
        _check_code(what, job.out_k, job.out_m)
        width = job.out_k + job.out_m
        indices = [t.index for t in job.targets]
        if any(i >= width for i in indices) or len(set(indices)) != len(indices):
            raise InvalidArgument(f"{what}: targets must name distinct fragment indices "
                                  f"0..{width - 1}, got {indices}")
    elif any(t.index for t in job.targets):
        raise InvalidArgument(f"{what}: whole copies have index 0")
    addresses = [t.address for t in job.targets]
    if len(set(addresses)) != len(addresses):
        raise InvalidArgument(f"{what}: two blobs of one chunk to one benefactor")
    for address in addresses:
        if address:
            check_target(address)
    return job


def _check_code(what: str, k: int, m: int) -> None:
    try:
        Code(k, m)
    except ConfigError as exc:
        raise InvalidArgument(f"{what}: {exc.message}") from None


class Recoder:
    """Runs RecodeChunk requests (thread-safe; at most CONCURRENCY at once)."""

    def __init__(self, store: ChunkStore, get: GetFn, put: PutFn, *,
                 check: CheckFn | None = None, coder: Callable[[], Any] | None = None,
                 concurrency: int = 2, threads: int = 16) -> None:
        self._store = store
        self._get = get
        self._put = put
        self._check = check
        self._make_coder = coder or _isal
        self._coder: Any = None
        self._coder_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(concurrency)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="recode")
        self._state = threading.Condition()
        self._running = 0
        self._closing = False

    def close(self) -> None:
        """Refuse new requests, let running ones end (at most CLOSE_WAIT_S: each stops at
        its next read or put), then stop the threads: the channels they use close next."""
        with self._state:
            self._closing = True
            self._state.wait_for(lambda: self._running == 0, timeout=CLOSE_WAIT_S)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _check_open(self) -> None:
        if self._closing:
            raise Unavailable("this benefactor is stopping")

    def coder(self) -> Any:
        with self._coder_lock:
            if self._coder is None:
                try:
                    self._coder = self._make_coder()
                except ConfigError as exc:
                    raise Unavailable(f"this benefactor cannot erasure-code: {exc.message}"
                                      ) from None
            return self._coder

    def recode(self, job: RecodeJob) -> RecodeOutcome:
        check_job(job)
        with self._state:
            self._check_open()
            self._running += 1
        try:
            with self._slots:
                unreadable: list[int] = []
                chunk = self._read(job, unreadable)
                blobs, fragment_ids = self._encode(job, chunk)
                out = self._store_all(job, blobs)
                out.fragment_ids = fragment_ids
                out.unreadable = unreadable
            return out
        finally:
            with self._state:
                self._running -= 1
                self._state.notify_all()

    # -- reading ---------------------------------------------------------------------------

    def _read(self, job: RecodeJob, unreadable: list[int]) -> Any:
        """The chunk's bytes, verified against its id."""
        problems: list[str] = []
        for src in sorted(job.copies, key=lambda s: bool(s.address)):  # our own first
            try:
                return self._fetch(src, job.chunk_id, job.length)
            except MosafsError as exc:
                problems.append(f"copy at {src.address or 'here'}: {exc.message}")
        if not job.k:
            raise Unavailable(f"chunk {job.chunk_id.hex()}: no whole copy could be read "
                              f"({'; '.join(problems)})")
        fragments = self._read_fragments(job, unreadable, problems)
        if len(fragments) < job.k:
            error = IntegrityError if any("hash" in p for p in problems) else Unavailable
            raise error(f"chunk {job.chunk_id.hex()}: {len(fragments)} of the {job.k} "
                        f"fragments needed could be read ({'; '.join(problems)})")
        chunk = self.coder().decode(fragments, job.k, job.m, job.length)
        try:
            ids.verify(job.chunk_id, chunk)
        except IntegrityError as exc:
            raise IntegrityError(f"fragments {sorted(fragments)} verified but decode to "
                                 f"other bytes ({exc.message}): the record's fragment ids "
                                 f"are not this chunk's") from None
        return chunk

    def _read_fragments(self, job: RecodeJob, unreadable: list[int],
                        problems: list[str]) -> dict[int, Any]:
        """Up to K verified fragments, at most K fetches at a time."""
        size = 64 * -(-job.length // (64 * job.k))
        queue = sorted(job.fragments, key=lambda s: bool(s.address))  # stable: ours first
        got: dict[int, Any] = {}
        running: dict[Future[Any], Source] = {}
        while len(got) < job.k and (queue or running):
            while queue and len(running) < job.k - len(got):
                src = queue.pop(0)
                running[self._pool.submit(self._fetch, src, job.fragment_ids[src.index],
                                          size)] = src
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                src = running.pop(future)
                try:
                    got[src.index] = future.result()
                except MosafsError as exc:
                    unreadable.append(src.index)
                    problems.append(f"fragment {src.index} at {src.address or 'here'}: "
                                    f"{exc.message}")
        for future in running:  # K found while others were still on their way
            future.cancel()
        return dict(list(got.items())[:job.k])

    def _fetch(self, src: Source, blob_id: bytes, size: int) -> Any:
        """One blob, verified against BLOB_ID; a corrupt one is reported to its holder."""
        self._check_open()
        if not src.address:
            data = self._store.get(blob_id, verify=False)
            if ids.chunk_id(data) != blob_id:
                if self._check is not None and self._check(blob_id) == CORRUPT:
                    raise IntegrityError(f"blob {blob_id.hex()} does not hash to its id "
                                         f"here (deleted, reported)")
                data = self._store.get(blob_id)  # put again meanwhile, or IntegrityError
            return data
        timeout = GET_FLOOR_S + size / GET_RATE
        data = self._get(src.address, blob_id, src.token, timeout, False)
        if ids.chunk_id(data) != blob_id:
            with contextlib.suppress(MosafsError):  # the holder hashes its copy, deletes
                self._get(src.address, blob_id, src.token, timeout, True)  # and reports it
            raise IntegrityError(f"blob {blob_id.hex()} from {src.address} does not hash "
                                 f"to its id (reported to it)")
        return data

    # -- encoding and storing --------------------------------------------------------------

    def _encode(self, job: RecodeJob, chunk: Any) -> tuple[list[tuple[bytes, Any]],
                                                           list[bytes]]:
        """The (id, bytes) of each target's blob, and every fragment id of the new layout
        (none for whole copies)."""
        if not job.out_k:
            return [(job.chunk_id, chunk)] * len(job.targets), []
        fragments = self.coder().fragments(chunk, job.out_k, job.out_m)
        if job.repair:
            fragment_ids = [bytes(f) for f in job.fragment_ids]
            for target in job.targets:
                made = ids.chunk_id(fragments[target.index])
                if made != fragment_ids[target.index]:
                    raise IntegrityError(
                        f"chunk {job.chunk_id.hex()}: rebuilt fragment {target.index} "
                        f"hashes to {made.hex()}, the record says "
                        f"{fragment_ids[target.index].hex()}")
        else:
            fragment_ids = [ids.chunk_id(f) for f in fragments]
        return [(fragment_ids[t.index], fragments[t.index]) for t in job.targets], fragment_ids

    def _store_all(self, job: RecodeJob, blobs: list[tuple[bytes, Any]]) -> RecodeOutcome:
        count = len(job.targets)
        out = RecodeOutcome([], [False] * count, [""] * count, [""] * count)
        futures = [self._pool.submit(self._store_one, t.address, blob_id, data)
                   for t, (blob_id, data) in zip(job.targets, blobs, strict=True)]
        for i, future in enumerate(futures):
            try:
                future.result()
            except MosafsError as exc:
                out.errors[i] = exc.message
                out.target_problems[i] = target_problem(exc)
                continue
            out.stored[i] = True
        failed = [e for e in out.errors if e]
        if failed:
            log.info("recode of chunk %s: %d of %d blobs not stored (%s)",
                     job.chunk_id.hex(), len(failed), count, failed[0])
        return out

    def _store_one(self, address: str, blob_id: bytes, data: Any) -> None:
        self._check_open()
        if not address:
            self._store.put(blob_id, data)
            return
        self._put(address, blob_id, data, PUT_FLOOR_S + memoryview(data).nbytes / PUT_RATE)


def _isal() -> Any:
    from mosafs.erasure.registry import make_coder

    return make_coder("isal")
