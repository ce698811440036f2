"""A standby manager's Follow stream to the active manager (docs/standby.md): say where it
stands, install a snapshot if one comes, apply the log entries as they come, confirm
each batch once it is durable; reconnect with backoff when the stream breaks."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from mosafs._proto import replication_pb2 as pb
from mosafs._proto import replication_pb2_grpc
from mosafs.errors import MosafsError
from mosafs.rpc.channels import channel
from mosafs.rpc.errors import from_rpc_error

log = logging.getLogger("mosafs.rpc.follow")

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
        self._call: Any = None
        self._lock = threading.Lock()
        self.connected = threading.Event()  # set while a stream is up
        self._thread = threading.Thread(target=self._run, name="follow", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        self._thread.join()

    def _run(self) -> None:
        wait = RETRY_S
        while not self._stop.is_set():
            was_up = False
            try:
                self._follow_once()
                wait = RETRY_S
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return
                was_up = self.connected.is_set()
                # A stream that was up and ends is the active manager stopping or dying:
                # news, not yet trouble; failing to get one back is.
                report = log.info if was_up or self._quiet else log.warning
                report("following %s: %s; again in %.1f s", self._address,
                       from_rpc_error(exc).message, wait)
            except MosafsError as exc:
                log.error("following %s: %s; again in %.1f s", self._address, exc.message,
                          wait)
            finally:
                self.connected.clear()
            self._stop.wait(wait)
            wait = RETRY_S if was_up else min(wait * 2, RETRY_MAX_S)

    def _follow_once(self) -> None:
        seq, epoch = self._standby.position()
        acks: queue.SimpleQueue[int | None] = queue.SimpleQueue()

        def requests() -> Iterator[pb.FollowRequest]:
            yield pb.FollowRequest(hello=pb.FollowHello(member=self._member, last_seq=seq,
                                                        last_epoch=epoch))
            while (acked := acks.get()) is not None:
                yield pb.FollowRequest(acked_seq=acked)

        to_active = channel(self._address)
        stub = replication_pb2_grpc.ManagerReplicationStub(to_active)
        with self._lock:
            if self._stop.is_set():
                to_active.close()
                return
            self._call = stub.Follow(requests())
        try:
            for message in self._call:
                self.connected.set()
                reached = self._take(message)
                if reached is not None:
                    acks.put(reached)
        finally:
            acks.put(None)
            with self._lock:
                self._call = None
            to_active.close()

    def _take(self, message: pb.FollowMessage) -> int | None:
        """Apply MESSAGE; the seq reached durably, if it reached one."""
        if message.WhichOneof("msg") == "snapshot":
            return self._standby.snapshot_part(message.snapshot)  # type: ignore[no-any-return]
        entries = [pb.LogEntry.FromString(raw) for raw in message.entries.entries]
        if not entries:
            return None
        return self._standby.apply(entries)  # type: ignore[no-any-return]
