"""Async access to the manager and the benefactors for the trio side of the client.

gRPC's sync stubs block, so every call runs in a worker thread through
`trio.to_thread.run_sync` with a capacity limiter: the FUSE event loop never blocks on the
network and the number of threads stays bounded. Failures arrive as mosafs.errors classes
(mosafs.rpc.errors.call maps them).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import trio

from mosafs import errors, ids
from mosafs._proto import benefactor_pb2 as bpb
from mosafs._proto import benefactor_pb2_grpc as bgrpc
from mosafs._proto import common_pb2 as cpb
from mosafs._proto import manager_pb2 as mpb
from mosafs._proto import manager_pb2_grpc as mgrpc
from mosafs.capability import MOUNT_KEY
from mosafs.client import acting
from mosafs.client.batching import Batcher
from mosafs.client.quick import Quick
from mosafs.rpc import chunkwire, spin
from mosafs.rpc.channels import MANAGER_IDEMPOTENT, PROCESS_IDENTITY, channel
from mosafs.rpc.errors import call, error_of, from_rpc_error
from mosafs.rpc.managers import Managers, may_go_elsewhere, parse_managers

T = TypeVar("T")

# Metadata calls are small and answered from LMDB; chunk transfers move up to MAX bytes.
METADATA_TIMEOUT = 30.0
CHUNK_TIMEOUT = 120.0
PUT_METHOD = "/mosafs.v1.Benefactor/PutChunk"
PUTS_METHOD = "/mosafs.v1.Benefactor/PutChunks"
LOCATE_BATCH = 65_536  # ids per LocateChunks call (the manager's limit)
WRITES_IN_FLIGHT = 1  # metadata writes (creates) of one lane on their way at once
GET_METHOD = "/mosafs.v1.Benefactor/GetChunk"
# With several managers: one try's deadline (a paused manager is left after this), and
# the pauses between rounds over every address while a failover lasts.
FAILOVER_TRY_S = 10.0
FAILOVER_PAUSE_S = 0.1
FAILOVER_PAUSE_MAX_S = 1.0


@dataclass
class Located:
    """A LocateChunks answer: whole-copy addresses and read tokens by id, the locations of
    the erasure-coded chunks, and the address of every benefactor named."""

    addresses: dict[bytes, list[str]] = field(default_factory=dict)
    tokens: dict[bytes, bytes] = field(default_factory=dict)
    coded: list[mpb.ChunkLocation] = field(default_factory=list)
    benefactors: dict[str, str] = field(default_factory=dict)


class Rpc:
    """Runs blocking calls in threads, at most `limit` at a time."""

    def __init__(self, limit: int) -> None:
        self.limiter = trio.CapacityLimiter(limit)
        self.slot = Quick(self.limiter)  # `async with`: a token, at once when free

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(functools.partial(fn, *args), limiter=self.limiter)


class ManagerClient:
    """The manager's RPCs as coroutines."""

    def __init__(self, address: str, rpc: Rpc, *, timeout: float = METADATA_TIMEOUT,
                 identity: Any = PROCESS_IDENTITY, mount_id: str = "") -> None:
        """ADDRESS: HOST:PORT, or several (A,B,C): a cluster's managers, of which the
        active one is followed (mosafs.rpc.managers). MOUNT_ID: named in every call, so
        that the manager does not list this client's own changes back to it
        (mosafs.manager.changes)."""
        self.address = address
        self._mount = ((MOUNT_KEY, mount_id),) if mount_id else ()
        self._managers = Managers(parse_managers(address))
        self._channels = [channel(a, identity) for a in self._managers.addresses]
        self._stubs = [mgrpc.ManagerStub(ch) for ch in self._channels]
        # Each channel's completion thread, kept between calls (mosafs.rpc.spin).
        self._spins = [spin.Spin(ch) for ch in self._channels]
        self._rpc = rpc
        self._timeout = timeout
        self.batcher = Batcher(self._send_batch)
        # Creates: one call in flight, the rest wait and leave together. Two in flight
        # (as reads have) made batches half the size, and every batch is a durable commit
        # on the manager and, with standbys, a log entry to ship (docs/benchmarks.md, "A
        # batch's writes in one group").
        self.write_batcher = Batcher(self._send_batch, max_in_flight=WRITES_IN_FLIGHT)

    def close(self) -> None:
        # Each held thread ends under a call of its own before its channel closes.
        spin.finish([kept.release(functools.partial(
            stub.Changes.future, mpb.ChangesRequest(), timeout=spin.RELEASE_WAIT_S,
            wait_for_ready=False, metadata=self._metadata()))
            for stub, kept in zip(self._stubs, self._spins, strict=True)])
        for ch in self._channels:
            ch.close()

    async def _batched(self, name: str, request: Any, op: mpb.BatchOp) -> Any:
        """NAME(REQUEST) alone, or OP in a batch call with others (mosafs.client.batching):
        reads and writes in separate batchers, so that a batch of reads is a BatchRead,
        which the channel retries as it retries a lone Lookup or GetAttr."""
        batcher = self.write_batcher if op.WhichOneof("op") == "create" else self.batcher
        return await batcher.call(acting.metadata(), op,
                                  functools.partial(self._call, name, request))

    async def _send_batch(self, ops: Sequence[mpb.BatchOp]) -> list[Any]:
        writes = any(op.WhichOneof("op") == "create" for op in ops)
        reply = await self._call("Batch" if writes else "BatchRead", mpb.BatchRequest(ops=ops))
        if len(reply.outcomes) != len(ops):
            raise errors.Unavailable(f"the manager answered {len(reply.outcomes)} outcomes "
                                     f"for a batch of {len(ops)}")
        return [error_of(o.code, o.kind, o.error) if o.code else o.attr
                for o in reply.outcomes]

    def _metadata(self) -> tuple[tuple[str, str], ...] | None:
        return (*acting.metadata(), *self._mount) or None

    async def _call(self, name: str, request: Any, timeout: float | None = None) -> Any:
        # wait_for_ready: while the manager is unreachable (restarting), a call waits for
        # it to come back (up to the timeout: then ETIMEDOUT) instead of failing at once.
        # Calls that may run twice are retried with backoff by the channel (service
        # config, mosafs.rpc.channels); the others are sent at most once, so a call the
        # manager may have run is never repeated. A gRPC future, not a thread, as puts do:
        # with 8 processes creating files, 1.1-1.2 ms of the mount's CPU per create against
        # 1.2-1.3 through threads, and 709-717 creates/s against 600-661 (docs/benchmarks.md,
        # "Metadata"); the limiter still bounds the calls in flight.
        if len(self._managers) > 1:
            return await self._call_active(name, request, timeout)
        async with self._rpc.slot:
            return await self._at(0, name, request, timeout or self._timeout, True)

    async def _at(self, index: int, name: str, request: Any, timeout: float,
                  wait_for_ready: bool) -> Any:
        """NAME(REQUEST) at manager INDEX, as a future whose completion comes to trio; its
        channel's completion thread held from the first call on (mosafs.rpc.spin)."""
        future = getattr(self._stubs[index], name).future(
            request, timeout=timeout, wait_for_ready=wait_for_ready, metadata=self._metadata())
        self._spins[index].started()
        return await completion(future)

    async def _call_active(self, name: str, request: Any,
                           timeout: float | None = None) -> Any:
        """NAME(REQUEST) at the active one of several managers: the one that answered
        last first, then the others in turn while a failover lasts (up to the timeout),
        where mosafs.rpc.managers says the call may go elsewhere."""
        deadline = trio.current_time() + (timeout or self._timeout)
        idempotent = name in MANAGER_IDEMPOTENT
        pause = FAILOVER_PAUSE_S
        while True:
            index = self._managers.current
            left = deadline - trio.current_time()
            try:
                async with self._rpc.slot:
                    return await self._at(index, name, request,
                                          max(0.1, min(left, FAILOVER_TRY_S)), False)
            except errors.MosafsError as exc:
                if not may_go_elsewhere(exc, idempotent) or left <= pause:
                    raise
                if self._managers.failed(index):  # every one tried: let a failover finish
                    await trio.sleep(pause)
                    pause = min(2 * pause, FAILOVER_PAUSE_MAX_S)

    async def lookup(self, parent: int, name: str) -> mpb.Attr:
        request = mpb.LookupRequest(parent=parent, name=name)
        return await self._batched("Lookup", request, mpb.BatchOp(lookup=request))

    async def getattr(self, inode: int) -> mpb.Attr:
        request = mpb.GetAttrRequest(inode=inode)
        return await self._batched("GetAttr", request, mpb.BatchOp(getattr=request))

    async def changes(self, instance: str, since: int, *, timeout: float) -> mpb.ChangesReply:
        """What changed in the namespace after SINCE of the manager's change list INSTANCE
        (mosafs.client.files.coherence)."""
        return await self._call("Changes", mpb.ChangesRequest(instance=instance, since=since),
                                timeout)

    async def setattr(self, inode: int, **fields: int) -> mpb.Attr:
        return await self._call("SetAttr", mpb.SetAttrRequest(inode=inode, **fields))

    async def readdir(self, inode: int) -> list[mpb.DirEntry]:
        """Every entry of a directory."""
        entries: list[mpb.DirEntry] = []
        async for page in self.readdir_pages(inode):
            entries.extend(page)
        return entries

    async def readdir_pages(self, inode: int, start_after: str = ""
                            ) -> AsyncGenerator[Sequence[mpb.DirEntry], None]:
        """The entries of a directory after START_AFTER, a page at a time."""
        while True:
            page = await self._call(
                "ReadDir", mpb.ReadDirRequest(inode=inode, start_after=start_after))
            yield page.entries
            if not page.more or not page.entries:
                return
            start_after = page.entries[-1].name

    async def mkdir(self, parent: int, name: str, mode: int, uid: int, gid: int) -> mpb.Attr:
        return await self._call(
            "Mkdir", mpb.MkdirRequest(parent=parent, name=name, mode=mode, uid=uid, gid=gid))

    async def create(self, parent: int, name: str, mode: int, uid: int, gid: int,
                     exclusive: bool) -> mpb.Attr:
        request = mpb.CreateRequest(parent=parent, name=name, mode=mode, uid=uid, gid=gid,
                                    exclusive=exclusive)
        return await self._batched("Create", request, mpb.BatchOp(create=request))

    async def unlink(self, parent: int, name: str) -> None:
        await self._call("Unlink", mpb.UnlinkRequest(parent=parent, name=name))

    async def rmdir(self, parent: int, name: str) -> None:
        await self._call("Rmdir", mpb.RmdirRequest(parent=parent, name=name))

    async def rename(self, old_parent: int, old_name: str, new_parent: int, new_name: str,
                     no_replace: bool) -> None:
        await self._call("Rename", mpb.RenameRequest(
            old_parent=old_parent, old_name=old_name, new_parent=new_parent,
            new_name=new_name, no_replace=no_replace))

    async def symlink(self, parent: int, name: str, target: bytes, uid: int,
                      gid: int) -> mpb.Attr:
        return await self._call("Symlink", mpb.SymlinkRequest(
            parent=parent, name=name, target=target, uid=uid, gid=gid))

    async def readlink(self, inode: int) -> bytes:
        reply = await self._call("Readlink", mpb.ReadlinkRequest(inode=inode))
        return bytes(reply.target)

    async def mknod(self, parent: int, name: str, kind: int, mode: int, uid: int,
                    gid: int, rdev: int = 0) -> mpb.Attr:
        return await self._call("Mknod", mpb.MknodRequest(
            parent=parent, name=name, kind=kind, mode=mode, uid=uid,  # type: ignore[arg-type]
            gid=gid, rdev=rdev))

    async def link(self, inode: int, new_parent: int, new_name: str) -> mpb.Attr:
        return await self._call("Link", mpb.LinkRequest(
            inode=inode, new_parent=new_parent, new_name=new_name))

    async def setxattr(self, inode: int, name: str, value: bytes) -> None:
        await self._call("SetXattr", mpb.SetXattrRequest(inode=inode, name=name, value=value))

    async def getxattr(self, inode: int, name: str) -> bytes:
        reply = await self._call("GetXattr", mpb.GetXattrRequest(inode=inode, name=name))
        return bytes(reply.value)

    async def listxattr(self, inode: int) -> list[str]:
        reply = await self._call("ListXattr", mpb.ListXattrRequest(inode=inode))
        return list(reply.names)

    async def removexattr(self, inode: int, name: str) -> None:
        await self._call("RemoveXattr", mpb.RemoveXattrRequest(inode=inode, name=name))

    async def statfs(self) -> mpb.StatFsResponse:
        return await self._call("StatFs", mpb.StatFsRequest())

    async def open_write(self, inode: int, client_id: str) -> mpb.OpenWriteResponse:
        return await self._call("OpenWrite", mpb.OpenWriteRequest(inode=inode, client_id=client_id))

    async def renew_lease(self, lease_id: int) -> bytes:
        """Renew a write lease; the fresh write token (b"": the cluster issues none)."""
        reply = await self._call("RenewLease", mpb.RenewLeaseRequest(lease_id=lease_id))
        return bytes(reply.write_token)

    async def abort_write(self, lease_id: int) -> None:
        await self._call("AbortWrite", mpb.AbortWriteRequest(lease_id=lease_id))

    async def commit_version(self, request: mpb.CommitVersionRequest) -> mpb.CommitVersionResponse:
        return await self._call("CommitVersion", request)

    async def find_chunks(self, chunk_ids: Sequence[bytes]) -> list[bool]:
        reply = await self._call("FindChunks", mpb.FindChunksRequest(ids=chunk_ids))
        return list(reply.present)

    async def locate(self, chunk_ids: Sequence[bytes]) -> Located:
        """Replica addresses of each chunk id the index knows, a read token of each id
        (also of those it does not know: chunks this mount stored and has not committed,
        and fragment ids), and the locations of the erasure-coded ones."""
        out = Located()
        for start in range(0, len(chunk_ids), LOCATE_BATCH):
            reply = await self._call("LocateChunks", mpb.LocateChunksRequest(
                ids=chunk_ids[start:start + LOCATE_BATCH]))
            by_id = {b.id: b.address for b in reply.benefactors}
            out.benefactors.update(by_id)
            for loc in reply.locations:
                out.addresses[loc.id] = [by_id[b] for b in loc.benefactor_ids if b in by_id]
                if loc.ec_k:
                    out.coded.append(loc)
            out.tokens.update((loc.id, loc.token)
                              for loc in (*reply.locations, *reply.unindexed) if loc.token)
        return out

    async def block_map(self, inode: int, version: int = 0) -> mpb.BlockMap:
        return await self._call("GetBlockMap", mpb.GetBlockMapRequest(inode=inode, version=version))

    async def version_stats(self, inode: int, version: int = 0) -> mpb.VersionStats:
        return await self._call(
            "GetVersionStats", mpb.GetVersionStatsRequest(inode=inode, version=version))

    async def list_versions(self, inode: int) -> list[mpb.VersionStats]:
        reply = await self._call("ListVersions", mpb.ListVersionsRequest(inode=inode))
        return list(reply.versions)


async def completion(future: Any) -> Any:
    """The result of a gRPC future, awaited without blocking a thread; a domain error for
    a failed call. Cancelling the waiting task cancels the call."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_: Any) -> None:
        with contextlib.suppress(trio.RunFinishedError):  # unmounting: nobody waits
            token.run_sync_soon(done.set)

    future.add_done_callback(wake)
    try:
        await done.wait()
    except BaseException:
        future.cancel()
        raise
    try:
        return future.result()
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


class _Links:
    """The calls of one benefactor channel. Chunk puts and gets bypass the generated
    (de)serialisers: their messages are framed by mosafs.rpc.chunkwire without copies."""

    def __init__(self, ch: Any) -> None:
        self.stub = bgrpc.BenefactorStub(ch)
        self.put = ch.unary_unary(PUT_METHOD, request_serializer=None,
                                  response_deserializer=bpb.PutChunkResponse.FromString)
        self.puts = ch.unary_unary(PUTS_METHOD, request_serializer=None,
                                   response_deserializer=bpb.PutChunksResponse.FromString)
        self.get = ch.unary_unary(GET_METHOD,
                                  request_serializer=bpb.GetChunkRequest.SerializeToString,
                                  response_deserializer=chunkwire.decode_get_response)


class Benefactors:
    """Channels to benefactors by address, opened on first use and shared by all calls."""

    def __init__(self, rpc: Rpc, *, identity: Any = PROCESS_IDENTITY) -> None:
        self._rpc = rpc
        self._identity = identity
        self._links: dict[str, _Links] = {}
        self._channels: list[Any] = []
        self._lock = threading.Lock()

    def _link(self, address: str) -> _Links:
        with self._lock:
            link = self._links.get(address)
            if link is None:
                ch = channel(address, self._identity)
                self._channels.append(ch)
                link = self._links[address] = _Links(ch)
            return link

    def close(self) -> None:
        for ch in self._channels:
            ch.close()

    def _get(self, address: str, chunk_id: bytes, token: bytes) -> bytes | memoryview:
        data: bytes | memoryview = call(self._link(address).get, bpb.GetChunkRequest(id=chunk_id),
                    timeout=CHUNK_TIMEOUT, metadata=_token(token))
        ids.verify(chunk_id, data)  # readers verify every chunk, whoever sent it
        return data

    async def put(self, target: cpb.BenefactorAddress, message: bytes, token: bytes) -> bool:
        """Store a chunk framed by chunkwire.encode_put, with the write session's TOKEN.
        Started as a gRPC future, not in a thread: the call runs in gRPC's own threads (TLS, the
        socket) and only its completion comes back to trio, which saves the two thread
        hand-offs per put that were a fifth of a data-path worker's CPU (py-spy,
        docs/benchmarks.md)."""
        future = self._link(target.address).put.future(message, timeout=CHUNK_TIMEOUT,
                                                        metadata=_token(token) or None)
        reply = await completion(future)
        return bool(reply.already_present)

    async def put_group(self, target: cpb.BenefactorAddress, message: bytes, count: int,
                        token: bytes) -> list[bool | errors.MosafsError]:
        """Store the COUNT chunks of a PutChunksRequest (chunkwire.encode_puts) in one
        call, with the write session's TOKEN: for each, whether it was there already, or
        the error that refused it. A failure of the call itself (the benefactor
        unreachable, the token refused) is raised: none of them may be taken as stored."""
        future = self._link(target.address).puts.future(
            message, timeout=CHUNK_TIMEOUT, metadata=_token(token) or None)
        reply = await completion(future)
        if len(reply.outcomes) != count:
            raise errors.Unavailable(f"benefactor {target.address} answered "
                                     f"{len(reply.outcomes)} outcomes for {count} chunks")
        return [error_of(o.code, o.kind, o.error) if o.code else bool(o.already_present)
                for o in reply.outcomes]

    async def get(self, address: str, chunk_id: bytes, token: bytes) -> bytes | memoryview:
        """A chunk's verified bytes (a view into the received message); TOKEN: its read
        token from the block-map."""
        return await self._rpc.run(self._get, address, chunk_id, token)

    async def open_local(self, address: str, chunk_ids: Sequence[bytes],
                         tokens: Sequence[bytes], *, put_token: bytes | None = None,
                         put_tickets: int = 1) -> bpb.OpenLocalResponse:
        """A ticket for reading CHUNK_IDS from their files on ADDRESS's host (its local
        reads; TOKENS: their read tokens, or none on a cluster without tokens), or, with
        PUT_TOKEN (a write session's token), PUT_TICKETS tickets for one local put each
        (the benefactor may give fewer)."""
        request = bpb.OpenLocalRequest(ids=chunk_ids, tokens=tokens, put=put_token is not None,
                                       put_tickets=put_tickets if put_token is not None else 0)
        reply: bpb.OpenLocalResponse = await self._rpc.run(functools.partial(
            call, self._link(address).stub.OpenLocal, request, timeout=CHUNK_TIMEOUT,
            metadata=_token(put_token or b"")))
        return reply

    def _report_bad(self, address: str, chunk_id: bytes, token: bytes) -> None:
        call(self._link(address).get, bpb.GetChunkRequest(id=chunk_id, verify=True),
             timeout=CHUNK_TIMEOUT, metadata=_token(token))

    async def report_bad(self, address: str, chunk_id: bytes, token: bytes) -> None:
        """Tell ADDRESS its copy of a chunk did not verify here: it hashes the copy itself
        (a reader's word alone deletes nothing) and, if it is corrupt, deletes it and has
        the manager repair it (DESIGN §3)."""
        await self._rpc.run(self._report_bad, address, chunk_id, token)


def _token(token: bytes) -> tuple[tuple[str, bytes], ...]:
    """The metadata that carries a chunk access token (none without one: plaintext)."""
    return ((chunkwire.TOKEN_KEY, token),) if token else ()
