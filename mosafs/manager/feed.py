"""The active manager's side of one standby's feed (docs/standby.md, "The feed
connection"): the messages to send, from a snapshot if the standby needs one and then the
log, while a thread takes the standby's confirmations. Transport-free: the requests come
in, and the messages go out, through whatever carries them (mosafs.manager.
follow_servicer)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from mosafs._proto import replication_pb2 as pb
from mosafs.errors import FailedPrecondition, InvalidArgument, MosafsError
from mosafs.manager.metadata import MetadataStore
from mosafs.manager.replog import Follower, ReplicationLog

log = logging.getLogger("mosafs.manager.feed")

PART_BYTES = 1 << 20  # snapshot bytes per message
WAIT_S = 1.0          # how long a wait for new entries lasts before it looks again
NO_LOG = ("this manager keeps no replication log: start it with --standbys N to have "
          "standbys follow it")


def follow(journal: ReplicationLog | None, store: MetadataStore, spool: Path,
           requests: Iterator[pb.FollowRequest]) -> Iterator[pb.FollowMessage]:
    """What the active manager sends a standby whose stream's requests are REQUESTS: a
    hello first, then confirmations. SPOOL: a folder for snapshot files."""
    if journal is None:
        raise FailedPrecondition(NO_LOG)
    first = next(requests, None)
    if first is None or first.WhichOneof("msg") != "hello" or not first.hello.member:
        raise InvalidArgument("a feed starts with a hello naming the standby")
    hello = first.hello
    follower = journal.attach(hello.member, hello.last_seq, hello.last_epoch)

    broke: list[MosafsError] = []  # why the confirmations ended, when they were bad

    def take_confirmations() -> None:
        try:
            for request in requests:
                if request.WhichOneof("msg") == "acked_seq":
                    journal.confirmed(follower, request.acked_seq)
        except MosafsError as exc:  # a bad request, or the connection broke
            broke.append(exc)
        except Exception as exc:  # the stream broke: the generator below ends too
            log.info("standby %s: confirmations ended: %s", hello.member, exc)
        finally:
            journal.detach(follower)

    taker = threading.Thread(target=take_confirmations, daemon=True,
                             name=f"follow-{hello.member[:16]}")
    taker.start()
    try:
        while follower.attached:
            if follower.needs_snapshot:
                yield from _snapshot(journal, follower, store, spool)
            batch = journal.next_entries(follower, WAIT_S)
            if batch:
                yield pb.FollowMessage(entries=pb.LogEntries(entries=batch))
    finally:
        journal.detach(follower)
    taker.join()
    if broke:
        raise broke[0]  # the standby is told, where it can still hear it


def _snapshot(journal: ReplicationLog, follower: Follower, store: MetadataStore,
              spool: Path) -> Iterator[pb.FollowMessage]:
    spool.mkdir(parents=True, exist_ok=True)
    path = spool / f"snapshot-{threading.get_ident()}.mdb"
    journal.snapshot_started(follower)
    try:
        seq, epoch = store.snapshot_to(path)
        total = path.stat().st_size
        log.info("sending a snapshot of %d bytes (log entry %d) to standby %s", total, seq,
                 follower.member)
        with path.open("rb") as f:
            offset = 0
            while True:
                data = f.read(PART_BYTES)
                done = offset + len(data) >= total
                if done:  # before the last part: its confirmation may come at once
                    journal.snapshot_taken(follower, seq)
                yield pb.FollowMessage(snapshot=pb.SnapshotPart(
                    offset=offset, data=data, total_bytes=total, done=done, seq=seq,
                    epoch=epoch))
                offset += len(data)
                if done:
                    break
    finally:
        if path.exists():
            os.unlink(path)
