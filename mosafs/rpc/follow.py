"""A standby manager's feed from the active manager (docs/standby.md, "The feed
connection"): ask the active manager where its feed listens, connect there (a framed TLS
connection, mosafs.rpc.framed), say where it stands, install a snapshot if one comes,
take the log entries as they come and confirm each batch once it is durable (journaled),
apply what was taken to the database every SETTLE_ENTRIES entries or when the feed is
quiet; reconnect with backoff when the connection breaks, or when anything else fails
(an unexpected exception is a bug, logged with its traceback: the thread lives on, since
a standby whose thread died would look alive and follow nothing)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from google.protobuf.message import DecodeError

from mosafs import errors
from mosafs._proto import replication_pb2 as pb
from mosafs._proto import replication_pb2_grpc
from mosafs.addresses import split_address
from mosafs.errors import InvalidArgument, MosafsError
from mosafs.rpc import framed
from mosafs.rpc.channels import channel
from mosafs.rpc.errors import call

log = logging.getLogger("mosafs.rpc.follow")

ASK_TIMEOUT_S = 10.0  # the FeedAddress call
BATCH_BYTES = 16 << 20  # of messages taken in one append
SETTLE_IDLE_S = 0.05  # entries taken are applied after the feed was quiet this long
RETRY_S = 0.5      # first wait before reconnecting; doubles up to RETRY_MAX_S
RETRY_MAX_S = 5.0


class Follower:
    """Follows the manager at ADDRESS into STANDBY (mosafs.manager.standby.Standby) as
    MEMBER, in a thread, until stop()."""

    def __init__(self, address: str, standby: Any, member: str, *,
                 quiet: bool = False) -> None:
        """QUIET: failing to reach ADDRESS is no news (a failover group's member: the
        coordination service names the next active manager, and its log says so)."""
        self._quiet = quiet
        self._address = address
        self._standby = standby
        self._member = member
        self._stop = threading.Event()
        self._conn: framed.Connection | None = None
        self._lock = threading.Lock()
        self.connected = threading.Event()  # set while a stream is up
        self._thread = threading.Thread(target=self._run, name="follow", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
        self._thread.join()

    def _run(self) -> None:
        wait = RETRY_S
        while not self._stop.is_set():
            was_up = False
            try:
                self._follow_once()
                wait = RETRY_S
            except errors.Unavailable as exc:  # unreachable, or the connection ended
                if self._stop.is_set():
                    return
                was_up = self.connected.is_set()
                # A feed that was up and ends is the active manager stopping or dying:
                # news, not yet trouble; failing to get one back is.
                report = log.info if was_up or self._quiet else log.warning
                report("following %s: %s; again in %.1f s", self._address, exc.message, wait)
            except MosafsError as exc:
                if self._stop.is_set():
                    return
                log.error("following %s: %s; again in %.1f s", self._address, exc.message,
                          wait)
            except Exception:
                if self._stop.is_set():
                    return
                log.exception("bug while following %s; again in %.1f s", self._address,
                              wait)
            finally:
                self.connected.clear()
            self._stop.wait(wait)
            wait = RETRY_S if was_up else min(wait * 2, RETRY_MAX_S)

    def _follow_once(self) -> None:
        standby = self._standby
        standby.ready()  # open again if a snapshot's failed install left it closed
        conn = self._connect()
        with self._lock:
            if self._stop.is_set():
                conn.close()
                return
            self._conn = conn
        try:
            seq, epoch = standby.position()
            conn.send(pb.FollowRequest(hello=pb.FollowHello(
                member=self._member, last_seq=seq, last_epoch=epoch)).SerializeToString())
            while True:
                if standby.unsettled and not conn.readable(SETTLE_IDLE_S):
                    standby.settle()
                if (frame := conn.receive()) is None:
                    raise framed.Closed("the active manager ended the feed")
                self.connected.set()
                reached = self._take(self._arrived(conn, frame))
                if reached is not None:
                    # Confirmed from this thread, at once: a hand-off to a thread of its
                    # own put a wake-up on every change's path (docs/benchmarks.md).
                    conn.send(pb.FollowRequest(acked_seq=reached).SerializeToString())
                if standby.due:  # after the confirmation left
                    standby.settle()
        finally:
            with self._lock:
                self._conn = None
            conn.close()

    def _connect(self) -> framed.Connection:
        """A connection to the active manager's feed; Unavailable where there is none (a
        manager that keeps no log, or is no longer active, is reported as one that is
        down: in a failover group the next active one is named soon)."""
        host, _ = split_address(self._address, "the active manager's address")
        to_active = channel(self._address)
        try:
            stub = replication_pb2_grpc.ManagerReplicationStub(to_active)
            reply = call(stub.FeedAddress, pb.FeedAddressRequest(), timeout=ASK_TIMEOUT_S)
        except MosafsError as exc:
            raise errors.Unavailable(f"no feed there: {exc.message}") from None
        finally:
            to_active.close()
        return framed.connect(host, reply.port, role="manager")

    @staticmethod
    def _arrived(conn: framed.Connection, frame: bytes) -> list[pb.FollowMessage]:
        """FRAME's message and those that arrived behind it, up to BATCH_BYTES: entries
        that arrive while a batch is taken are taken together, in one append and one
        flush, not one each (8 writers: 7 % more creates/s, docs/benchmarks.md)."""
        messages, size = [_message(frame)], len(frame)
        while size < BATCH_BYTES and (more := conn.receive_ready()) is not None:
            messages.append(_message(more))
            size += len(more)
        return messages

    def _take(self, messages: list[pb.FollowMessage]) -> int | None:
        """Take MESSAGES in order; the seq reached durably, if it reached one."""
        reached: int | None = None
        entries: list[bytes] = []
        for message in messages:
            kind = message.WhichOneof("msg")
            if kind == "entries":
                entries += message.entries.entries
                continue
            if entries:
                reached = self._standby.take(entries)
                entries = []
            if kind == "error":
                cls = errors.BY_KIND.get(message.error.kind, MosafsError)
                raise cls(f"the active manager ended the feed: {message.error.message}")
            if kind == "snapshot":
                reached = self._standby.snapshot_part(message.snapshot) or reached
        if entries:
            reached = self._standby.take(entries)
        return reached


def _message(frame: bytes) -> pb.FollowMessage:
    try:
        return pb.FollowMessage.FromString(frame)
    except DecodeError as exc:
        raise InvalidArgument(f"malformed message from the active manager: {exc}") from None
