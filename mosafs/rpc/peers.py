"""Calls between servers: the manager asking a benefactor to replicate or recode, a
benefactor putting a chunk to another or reading one from another (a recode's fragments,
with the read tokens the manager signed for it). One channel per address, opened on first
use and shared by threads."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import grpc

from mosafs._proto import benefactor_pb2 as bpb
from mosafs._proto import benefactor_pb2_grpc as bgrpc
from mosafs.errors import InternalError
from mosafs.rpc import chunkwire
from mosafs.rpc.channels import channel
from mosafs.rpc.errors import call, stream

PUT_TIMEOUT_S = 120.0
# A replication request copies up to a few tens of MiB chunk by chunk at low priority.
REPLICATE_TIMEOUT_S = 600.0
SCRUB_TIMEOUT_S = 24 * 3600.0  # a full pass reads every chunk of a benefactor


class BenefactorPeers:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, bgrpc.BenefactorStub] = {}
        self._puts: dict[str, Any] = {}  # PutChunk without protobuf's copies (chunkwire)
        self._gets: dict[str, Any] = {}  # GetChunk, the answer decoded by chunkwire

    def _stub(self, address: str, *, locked: bool = False) -> bgrpc.BenefactorStub:
        with contextlib.nullcontext() if locked else self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                ch = self._channels[address] = channel(address)
                stub = self._stubs[address] = bgrpc.BenefactorStub(ch)
            return stub

    def put(self, address: str, chunk_id: bytes, data: bytes,
            timeout: float = PUT_TIMEOUT_S) -> None:
        with self._lock:
            put = self._puts.get(address)
            if put is None:
                self._stub(address, locked=True)
                put = self._puts[address] = self._channels[address].unary_unary(
                    "/mosafs.v1.Benefactor/PutChunk", request_serializer=None,
                    response_deserializer=bpb.PutChunkResponse.FromString)
        call(put, chunkwire.encode_put(chunk_id, data), timeout=timeout)

    def get(self, address: str, blob_id: bytes, token: bytes, timeout: float,
            verify: bool = False) -> bytes | memoryview:
        """A blob's bytes from ADDRESS (not verified here: the caller hashes them); TOKEN:
        its read token ("" on clusters without tokens). VERIFY: the holder hashes its copy
        first (and deletes and reports it if corrupt)."""
        with self._lock:
            get = self._gets.get(address)
            if get is None:
                self._stub(address, locked=True)
                get = self._gets[address] = self._channels[address].unary_unary(
                    "/mosafs.v1.Benefactor/GetChunk",
                    request_serializer=bpb.GetChunkRequest.SerializeToString,
                    response_deserializer=chunkwire.decode_get_response)
        data: bytes | memoryview = call(
            get, bpb.GetChunkRequest(id=blob_id, verify=verify), timeout=timeout,
            metadata=((chunkwire.TOKEN_KEY, token),) if token else ())
        return data

    def recode(self, address: str, request: bpb.RecodeChunkRequest,
               timeout: float) -> bpb.RecodeChunkResponse:
        """Ask the benefactor at ADDRESS to recode one chunk (repair or conversion)."""
        reply: bpb.RecodeChunkResponse = call(self._stub(address).RecodeChunk, request,
                                              timeout=timeout)
        return reply

    def replicate(self, source: str, target: str, ids: Sequence[bytes],
                  timeout: float) -> tuple[list[bool], str]:
        """Ask SOURCE to copy IDS to TARGET within TIMEOUT seconds: copied[i] for each id,
        and the target's problem if it stopped the copying ("unreachable", "full")."""
        reply = call(self._stub(source).ReplicateChunks,
                     bpb.ReplicateChunksRequest(ids=ids, target_address=target),
                     timeout=timeout)
        if len(reply.copied) != len(ids):
            return [False] * len(ids), ""  # a confused peer: copy nothing, try again later
        return list(reply.copied), reply.target_problem

    def run_garbage_round(self, address: str) -> tuple[int, int, int]:
        """Ask the benefactor at ADDRESS to run a collection round now."""
        reply = call(self._stub(address).RunGarbageRound, bpb.GarbageRoundRequest(),
                     timeout=REPLICATE_TIMEOUT_S)
        return reply.deleted_chunks, reply.freed_bytes, reply.waiting_chunks

    def delete_chunks(self, address: str, ids: Sequence[bytes],
                      put_before_ns: int) -> tuple[int, int]:
        """Ask the benefactor at ADDRESS to delete IDS unless put at or after
        PUT_BEFORE_NS: (chunks deleted, bytes freed)."""
        reply = call(self._stub(address).DeleteChunks,
                     bpb.DeleteChunksRequest(ids=ids, put_before_ns=put_before_ns),
                     timeout=REPLICATE_TIMEOUT_S)
        return reply.deleted_chunks, reply.freed_bytes

    def scrub(self, address: str) -> Iterator[bpb.ScrubProgress]:
        """Ask the benefactor at ADDRESS to verify every chunk now; its progress."""
        yield from stream(self._stub(address).Scrub, bpb.ScrubRequest(),
                          timeout=SCRUB_TIMEOUT_S)

    def has(self, address: str, ids: Sequence[bytes]) -> list[bool]:
        reply = call(self._stub(address).HasChunks, bpb.HasChunksRequest(ids=ids),
                     timeout=PUT_TIMEOUT_S)
        if len(reply.present) != len(ids):
            raise InternalError(f"benefactor {address} answered {len(reply.present)} of "
                                f"{len(ids)} ids")
        return list(reply.present)

    def recovery_records(self, address: str) -> list[tuple[str, bytes]]:
        """(name, bytes) of the recovery records kept at ADDRESS, oldest first."""
        reply = call(self._stub(address).ListRecoveryRecords,
                     bpb.ListRecoveryRecordsRequest(), timeout=PUT_TIMEOUT_S)
        return [(r.name, bytes(r.data)) for r in reply.records]

    def inventory(self, address: str) -> Iterator[tuple[bytes, int]]:
        """(id, size) of every blob stored at ADDRESS."""
        for page in stream(self._stub(address).ListChunks, bpb.ListChunksRequest(),
                           timeout=SCRUB_TIMEOUT_S):
            if len(page.ids) != len(page.sizes):
                raise InternalError(f"benefactor {address} sent {len(page.ids)} ids and "
                                    f"{len(page.sizes)} sizes")
            yield from zip((bytes(i) for i in page.ids), (int(n) for n in page.sizes),
                           strict=True)

    def benefactor_id(self, address: str) -> str:
        return str(call(self._stub(address).GetInfo, bpb.GetInfoRequest(),
                        timeout=PUT_TIMEOUT_S).id)

    def put_recovery_record(self, address: str, name: str, data: bytes) -> None:
        """Keep recovery record NAME on the benefactor at ADDRESS (metadata backups)."""
        call(self._stub(address).PutRecoveryRecord, bpb.RecoveryRecord(name=name, data=data),
             timeout=PUT_TIMEOUT_S)

    def close(self) -> None:
        with self._lock:
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()
            self._stubs.clear()
            self._puts.clear()
            self._gets.clear()
