"""The active manager's side of its standbys' feed (docs/standby.md, "The feed
connection"), thin as every servicer here: the ManagerReplication gRPC service says where
the feed listens, and the feed's framed connections (mosafs.rpc.framed) carry what
mosafs.manager.feed decides. A malformed frame ends that connection with an error frame;
the manager serves on."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError

from mosafs._proto import replication_pb2 as pb
from mosafs._proto import replication_pb2_grpc
from mosafs.errors import FailedPrecondition, InvalidArgument, MosafsError
from mosafs.manager import feed
from mosafs.manager.metadata import MetadataStore
from mosafs.manager.replog import ReplicationLog
from mosafs.rpc import framed
from mosafs.rpc.access import FEED_ACCESS
from mosafs.rpc.errors import servicer
from mosafs.rpc.handlers import add_decoding_in_handlers
from mosafs.rpc.managers import STANDBY_REFUSAL

log = logging.getLogger("mosafs.manager.feed")


class Feed:
    """The feed's listener on HOST:PORT (0: a free port) while the manager runs."""

    def __init__(self, journal: ReplicationLog, store: MetadataStore, spool: Path,
                 host: str, port: int) -> None:
        self._journal, self._store, self._spool = journal, store, spool
        self._listener = framed.Listener(host, port, self._serve, method="Follow",
                                         allowed=FEED_ACCESS, refuse=_send_error)
        self.port = self._listener.port

    def start(self) -> Feed:
        self._listener.start()
        return self

    def close(self) -> None:
        self._listener.close()

    def _serve(self, conn: framed.Connection) -> None:
        try:
            for message in feed.follow(self._journal, self._store, self._spool,
                                       _requests(conn)):
                conn.send(message.SerializeToString())
        except framed.Closed:
            return  # the standby went away, or the manager stops: its log says which
        except MosafsError as exc:
            log.info("feed to %s ended: %s", _name(conn), exc.message)
            _send_error(conn, exc)


def _requests(conn: framed.Connection) -> Iterator[pb.FollowRequest]:
    while (frame := conn.receive()) is not None:
        try:
            yield pb.FollowRequest.FromString(frame)
        except DecodeError as exc:
            raise InvalidArgument(f"malformed Follow request: {exc}") from None


def _send_error(conn: framed.Connection, exc: MosafsError) -> None:
    with contextlib.suppress(framed.Closed):
        conn.send(pb.FollowMessage(error=pb.FeedError(kind=exc.kind, message=exc.message))
                  .SerializeToString())


def _name(conn: framed.Connection) -> str:
    return conn.peer.name if conn.peer is not None else "a standby"


@servicer
class FeedAddressServicer(replication_pb2_grpc.ManagerReplicationServicer):
    def __init__(self, port: int | None) -> None:
        self._port = port

    def FeedAddress(self, request: pb.FeedAddressRequest,
                    context: grpc.ServicerContext) -> pb.FeedAddressReply:
        if self._port is None:
            raise FailedPrecondition(feed.NO_LOG)
        return pb.FeedAddressReply(port=self._port)


def add_to_server(feed_port: int | None) -> Callable[[grpc.Server], None]:
    """The part of the manager's `add_servicer` callback that tells standbys where its
    feed listens (FEED_PORT; None: it keeps no log to feed)."""
    def add(server: grpc.Server) -> None:
        add_decoding_in_handlers(replication_pb2_grpc.add_ManagerReplicationServicer_to_server,
                                 FeedAddressServicer(feed_port), server)
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
