"""The ManagerReplication gRPC service (docs/standby.md): thin, as every servicer here;
the stream's content comes from mosafs.manager.feed. Requests arrive as bytes and are
decoded here, so that a malformed one is INVALID_ARGUMENT, not a server error."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError

from mosafs._proto import replication_pb2 as pb
from mosafs._proto import replication_pb2_grpc
from mosafs.errors import InvalidArgument
from mosafs.manager import feed
from mosafs.manager.metadata import MetadataStore
from mosafs.manager.replog import ReplicationLog
from mosafs.rpc.errors import servicer
from mosafs.rpc.managers import STANDBY_REFUSAL

SERVICE = "mosafs.v1.ManagerReplication"


def _decoded(raw: Iterator[bytes]) -> Iterator[pb.FollowRequest]:
    for data in raw:
        try:
            yield pb.FollowRequest.FromString(data)
        except DecodeError as exc:
            raise InvalidArgument(f"malformed Follow request: {exc}") from None


@servicer
class FollowServicer(replication_pb2_grpc.ManagerReplicationServicer):
    def __init__(self, journal: ReplicationLog | None, store: MetadataStore,
                 spool: Path) -> None:
        self._journal, self._store, self._spool = journal, store, spool

    def Follow(self, request_iterator: Iterator[bytes],  # type: ignore[override]
               context: grpc.ServicerContext) -> Iterator[pb.FollowMessage]:
        yield from feed.follow(self._journal, self._store, self._spool,
                               _decoded(request_iterator))


def add_to_server(journal: ReplicationLog | None, store: MetadataStore,
                  spool: Path) -> Callable[[grpc.Server], None]:
    """The part of the manager's `add_servicer` callback that serves standbys."""
    def add(server: grpc.Server) -> None:
        follow = FollowServicer(journal, store, spool).Follow
        handler = grpc.stream_stream_rpc_method_handler(
            follow, request_deserializer=None,
            response_serializer=pb.FollowMessage.SerializeToString)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"Follow": handler}),))
    return add


def add_refusals(active: str | Callable[[], str]) -> Callable[[grpc.Server], None]:
    """A standby's `add_servicer` callback: every Manager RPC is refused with
    FAILED_PRECONDITION naming the active manager (ACTIVE, or what ACTIVE() says now: a
    standby of a failover cluster follows whoever leads) (docs/standby.md: standbys serve
    no reads; clients go to the active manager, mosafs.rpc.managers)."""
    from mosafs._proto import manager_pb2

    def refuse(request: object, context: grpc.ServicerContext) -> None:
        now = active() if callable(active) else active
        context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      f"{STANDBY_REFUSAL} {now}; ask the active manager")

    def add(server: grpc.Server) -> None:
        handlers = {}
        for method in manager_pb2.DESCRIPTOR.services_by_name["Manager"].methods:
            make = (grpc.unary_stream_rpc_method_handler if method.server_streaming
                    else grpc.unary_unary_rpc_method_handler)
            handlers[method.name] = make(refuse)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("mosafs.v1.Manager", handlers),))
    return add
