"""The gRPC Benefactor service: unpack a request, call the ChunkStore, pack the answer.

Errors are mapped to status codes only by @servicer (mosafs.rpc.errors): InvalidArgument
-> INVALID_ARGUMENT, NotFound -> NOT_FOUND, IntegrityError -> DATA_LOSS, NoSpace ->
RESOURCE_EXHAUSTED, TokenRefused -> PERMISSION_DENIED.

Chunk bytes move only against a chunk access token (mosafs.benefactor.tokens), sent in
the metadata `mosafs-token-bin`: GetChunk a read token of that chunk, PutChunk a write
token, except from a benefactor certificate (a peer's copy for replication or a recode).
RecodeChunk (the manager's) carries the read tokens its reads from peers need. Refusals are
counted (metrics.REFUSALS, reason "token") and logged on "mosafs.audit".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc

from mosafs import metrics
from mosafs._proto import benefactor_pb2 as pb
from mosafs._proto import benefactor_pb2_grpc as pb_grpc
from mosafs.benefactor.garbage import GarbageRounds
from mosafs.benefactor.ingest import IngestLimiter
from mosafs.benefactor.localreads import MAX_IDS as MAX_LOCAL_IDS
from mosafs.benefactor.localreads import MAX_PUT_TICKETS, TICKET_TTL_S, LocalReads
from mosafs.benefactor.puts import Outcome, Puts
from mosafs.benefactor.recode import Recoder, job_of, reply_of
from mosafs.benefactor.recovery import RecoveryRecords
from mosafs.benefactor.replication import ChunkReplicator
from mosafs.benefactor.scrub import Scrubber
from mosafs.benefactor.store import CORRUPT, ChunkStore
from mosafs.benefactor.tokens import TokenChecker
from mosafs.errors import (
    FailedPrecondition,
    IntegrityError,
    InvalidArgument,
    TokenRefused,
    Unavailable,
)
from mosafs.ids import check_id
from mosafs.localwire import host_id
from mosafs.rpc import chunkwire
from mosafs.rpc.errors import servicer, status_code
from mosafs.rpc.handlers import add_decoding_in_handlers
from mosafs.rpc.security import current_caller, refuse

INVENTORY_PAGE = 4096  # ids per ListChunks message


@dataclass(frozen=True)
class Identity:
    """How this benefactor presents itself to the manager and to clients."""

    id: str
    address: str
    pool: str


def info_message(identity: Identity, store: ChunkStore) -> pb.BenefactorInfo:
    """The BenefactorInfo for GetInfo, registration and heartbeats."""
    usage = store.usage()
    return pb.BenefactorInfo(
        id=identity.id,
        address=identity.address,
        capacity_bytes=usage.capacity_bytes,
        free_bytes=usage.free_bytes,
        chunks=usage.chunks,
        stored_bytes=usage.stored_bytes,
        pool=identity.pool,
    )


@servicer
class BenefactorServicer(pb_grpc.BenefactorServicer):
    def __init__(self, store: ChunkStore, info: Callable[[], pb.BenefactorInfo],
                 replicator: ChunkReplicator, garbage: GarbageRounds,
                 scrubber: Scrubber, ingest: IngestLimiter | None = None,
                 tokens: TokenChecker | None = None, recoder: Recoder | None = None,
                 puts: Puts | None = None, local: LocalReads | None = None,
                 records: RecoveryRecords | None = None) -> None:
        # INFO is a callable: the address is known only once the server has bound its port,
        # after the servicer was added.
        self._ingest = ingest
        self._tokens = tokens or TokenChecker(required=False)
        self._store = store
        self._puts = puts or Puts(store)
        self._info = info
        self._replicator = replicator
        self._garbage = garbage
        self._scrubber = scrubber
        self._recoder = recoder
        self._local = local
        self._records = records

    def PutChunk(self, request: chunkwire.PutChunk,
                 context: grpc.ServicerContext) -> pb.PutChunkResponse:
        # REQUEST.data is a view into the received message (mosafs.rpc.chunkwire).
        self._admit("PutChunk", context, memoryview(request.data).nbytes)
        return pb.PutChunkResponse(already_present=self._puts.one(request))

    def PutChunks(self, request: list[chunkwire.PutChunk],
                  context: grpc.ServicerContext) -> pb.PutChunksResponse:
        self._admit("PutChunks", context, sum(memoryview(c.data).nbytes for c in request))
        return pb.PutChunksResponse(outcomes=[_outcome(o) for o in self._puts.group(request)])

    def _admit(self, method: str, context: grpc.ServicerContext, size: int) -> None:
        """A put's token (a peer's copy needs none) and its bytes' share of the ingest
        limit, once per call."""
        caller = current_caller()
        if caller.role != "benefactor":
            try:
                self._tokens.check_write(_token(context), caller.fingerprint)
            except TokenRefused as exc:
                raise _refused(method, caller.name, exc) from None
        if self._ingest is not None:
            self._ingest.take(size)

    def GetChunk(self, request: pb.GetChunkRequest,
                 context: grpc.ServicerContext) -> bytes:
        caller = current_caller()
        try:
            # A manager signs tokens, or is being rebuilt and has no keys yet: it reads
            # without one (access: mosafs.rpc.access).
            if caller.role != "manager":
                self._tokens.check_read(_token(context), check_id(request.id),
                                        caller.fingerprint)
        except TokenRefused as exc:
            raise _refused("GetChunk", caller.name, exc) from None
        if request.verify and self._scrubber.check(check_id(request.id)) == CORRUPT:
            raise IntegrityError(f"chunk {request.id.hex()} was corrupt here: deleted, and "
                                 "reported for repair")
        # Not re-hashed: the reader verifies (DESIGN §3) and asks again with verify.
        data = self._store.get(request.id, verify=False)
        metrics.BENEFACTOR_SERVED.inc(len(data))
        return data  # framed by chunkwire.encode_get_response

    def OpenLocal(self, request: pb.OpenLocalRequest,
                  context: grpc.ServicerContext) -> pb.OpenLocalResponse:
        if self._local is None:
            raise FailedPrecondition("local reads and puts are off on this benefactor")
        if request.put:
            if request.ids or not self._local.takes_puts:
                raise InvalidArgument("a local put's ticket names no ids") if request.ids \
                    else FailedPrecondition("local puts are off on this benefactor")
            self._admit("OpenLocal", context, 0)
            tickets = [self._local.grant(None)
                       for _ in range(min(max(request.put_tickets, 1), MAX_PUT_TICKETS))]
            return pb.OpenLocalResponse(socket=self._local.name, ticket=tickets[0],
                                        more_tickets=tickets[1:], host=host_id(),
                                        ticket_ttl_ms=int(TICKET_TTL_S * 1000))
        ids = [check_id(raw) for raw in request.ids]
        tokens = list(request.tokens) or [b""] * len(ids)
        if len(tokens) != len(ids) or len(ids) > MAX_LOCAL_IDS:
            raise InvalidArgument(f"OpenLocal takes at most {MAX_LOCAL_IDS} ids, each with "
                                  f"its token ({len(ids)} ids, {len(request.tokens)} tokens)")
        caller = current_caller()
        try:
            for raw, token in zip(ids, tokens, strict=True):
                self._tokens.check_read(token, raw, caller.fingerprint)
        except TokenRefused as exc:
            raise _refused("OpenLocal", caller.name, exc) from None
        return pb.OpenLocalResponse(socket=self._local.name, ticket=self._local.grant(ids),
                                    host=host_id(), ticket_ttl_ms=int(TICKET_TTL_S * 1000))

    def HasChunks(self, request: pb.HasChunksRequest,
                  context: grpc.ServicerContext) -> pb.HasChunksResponse:
        return pb.HasChunksResponse(present=self._store.has_many(list(request.ids)))

    def ReplicateChunks(self, request: pb.ReplicateChunksRequest,
                        context: grpc.ServicerContext) -> pb.ReplicateChunksResponse:
        out = self._replicator.replicate(list(request.ids), request.target_address)
        return pb.ReplicateChunksResponse(copied=out.copied, errors=out.errors,
                                          target_problem=out.target_problem)

    def RecodeChunk(self, request: pb.RecodeChunkRequest,
                    context: grpc.ServicerContext) -> pb.RecodeChunkResponse:
        if self._recoder is None:
            raise Unavailable("this benefactor does not recode chunks")
        return reply_of(self._recoder.recode(job_of(request)))

    def RunGarbageRound(self, request: pb.GarbageRoundRequest,
                        context: grpc.ServicerContext) -> pb.GarbageRound:
        result = self._garbage.run()
        return pb.GarbageRound(reported=result.reported, deleted_chunks=result.deleted_chunks,
                               freed_bytes=result.freed_bytes,
                               waiting_chunks=result.waiting_chunks)

    def DeleteChunks(self, request: pb.DeleteChunksRequest,
                     context: grpc.ServicerContext) -> pb.DeleteChunksResponse:
        deleted, freed = self._garbage.delete(list(request.ids), request.put_before_ns)
        return pb.DeleteChunksResponse(deleted_chunks=deleted, freed_bytes=freed)

    def PutRecoveryRecord(self, request: pb.RecoveryRecord,
                          context: grpc.ServicerContext) -> pb.PutRecoveryRecordResponse:
        return pb.PutRecoveryRecordResponse(
            kept=self._recovery().put(request.name, bytes(request.data)))

    def ListRecoveryRecords(self, request: pb.ListRecoveryRecordsRequest,
                            context: grpc.ServicerContext) -> pb.ListRecoveryRecordsResponse:
        return pb.ListRecoveryRecordsResponse(records=[
            pb.RecoveryRecord(name=name, data=data) for name, data in self._recovery().records()])

    def ListChunks(self, request: pb.ListChunksRequest,
                   context: grpc.ServicerContext) -> Iterator[pb.ChunkInventoryPage]:
        page = pb.ChunkInventoryPage()
        sent = False
        for item in self._store.inventory():
            page.ids.append(item.id)
            page.sizes.append(item.length)
            if len(page.ids) >= INVENTORY_PAGE:
                yield page
                sent, page = True, pb.ChunkInventoryPage()
        if page.ids or not sent:
            yield page

    def _recovery(self) -> RecoveryRecords:
        if self._records is None:
            raise FailedPrecondition("this benefactor keeps no recovery records")
        return self._records

    def Scrub(self, request: pb.ScrubRequest,
              context: grpc.ServicerContext) -> Iterator[pb.ScrubProgress]:
        for p in self._scrubber.run():
            yield pb.ScrubProgress(
                checked_chunks=p.checked_chunks, checked_bytes=p.checked_bytes,
                total_chunks=p.total_chunks, total_bytes=p.total_bytes,
                corrupt_chunks=len(p.corrupt_ids), done=p.done,
                corrupt_ids=p.corrupt_ids if p.done else [])

    def GetInfo(self, request: pb.GetInfoRequest,
                context: grpc.ServicerContext) -> pb.BenefactorInfo:
        return self._info()


def _token(context: grpc.ServicerContext) -> bytes:
    """The chunk access token the call carries (b"" without one)."""
    for key, value in context.invocation_metadata() or ():
        if key == chunkwire.TOKEN_KEY:  # a "-bin" key: grpc hands over bytes
            return value if isinstance(value, bytes) else value.encode()
    return b""


def _outcome(out: Outcome) -> pb.PutOutcome:
    if out.error is None:
        return pb.PutOutcome(already_present=out.present)
    return pb.PutOutcome(code=status_code(out.error).value[0], kind=out.error.kind,
                         error=out.error.message)


def _refused(method: str, name: str, exc: TokenRefused) -> TokenRefused:
    """EXC, counted and logged (the servicer wrapper answers it)."""
    refuse("token", name, method, exc.message)
    return exc


def add_to_server(server: grpc.Server, store: ChunkStore,
                  info: Callable[[], pb.BenefactorInfo], replicator: ChunkReplicator,
                  garbage: GarbageRounds, scrubber: Scrubber,
                  ingest: IngestLimiter | None = None,
                  tokens: TokenChecker | None = None, recoder: Recoder | None = None,
                  puts: Puts | None = None, local: LocalReads | None = None,
                  records: RecoveryRecords | None = None) -> None:
    add_decoding_in_handlers(
        pb_grpc.add_BenefactorServicer_to_server,
        BenefactorServicer(store, info, replicator, garbage, scrubber, ingest, tokens,
                           recoder, puts, local, records),
        server,
        codecs={"PutChunk": (chunkwire.decode_put, None),
                "PutChunks": (chunkwire.decode_puts, None),
                "GetChunk": (None, chunkwire.encode_get_response)})
