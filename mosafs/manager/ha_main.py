"""`mosafs manager --etcd ENDPOINTS`: a manager that takes part in failover
(docs/coordination.md). One process, two phases:

1. **standby**: it serves refusals naming the active manager (FAILED_PRECONDITION, as a
   `--standby-of` standby does), follows whichever manager etcd names as leader into
   its own LMDB, and campaigns for the leader key whenever it is eligible: a member of
   the in-sync set the last leader published (or of a cluster that never had one);
2. **active**: once elected it stops following, opens its store as the active manager on
   the same address, and acknowledges a change only while its leadership is valid and
   every standby etcd names as in sync has it (mosafs.manager.replog).

A manager whose leadership lapses stops at once with EXIT_DEPOSED; whoever supervises it
(`mosafs up`, systemd's Restart=) starts it again, and it comes back as a standby.
"""

from __future__ import annotations

import argparse
import logging
import socket
import threading
from pathlib import Path
from typing import Any

from mosafs.errors import ConfigError
from mosafs.manager.active import STOP_GRACE_S

log = logging.getLogger("mosafs.manager")


def fixed_listen(listen: str) -> str:
    """LISTEN with a port of its own: both phases serve on the one address that clients
    and benefactors were given, so port 0 is replaced by a free port, once."""
    from mosafs.addresses import split_address

    host, port = split_address(listen, "--listen")
    if port:
        return listen
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host.strip("[]"), 0))
        return f"{host}:{s.getsockname()[1]}"


def run_ha(args: argparse.Namespace, data_dir: Path, stop: threading.Event,
           listen_host: str, metrics_url: str | None) -> int:
    from mosafs.addresses import advertised_address, split_address
    from mosafs.coordination import CoordinationUnavailable, Coordinator
    from mosafs.manager.active import serve_active
    from mosafs.manager.standby_main import member_id

    if not args.standbys:
        raise ConfigError("--etcd needs --standbys N (at least 1): a manager that takes "
                          "over must have every change its predecessor acknowledged")
    args.listen = fixed_listen(args.listen)
    address = advertised_address(listen_host, split_address(args.listen, "--listen")[1])
    member = member_id(data_dir)
    endpoints = [e for e in args.etcd.split(",") if e]
    with Coordinator(endpoints, args.cluster_name, member, ttl_s=args.lease_ttl) as coord:
        leadership = _standby_until_elected(args, data_dir, stop, coord, member, address)
        if leadership is None:
            log.info("stopping")
            return 0

        def publish(members: frozenset[str]) -> bool:
            # The leader is a member of its own set: restarted on its own data, it may
            # lead again. Not landed while etcd cannot be reached: writers wait, and
            # the standby's confirmation stream goes on.
            try:
                return bool(coord.set_in_sync(leadership, set(members) | {member}))
            except CoordinationUnavailable as exc:
                log.warning("the in-sync set could not be published: %s", exc.message)
                return False

        def directory() -> dict[str, str]:
            try:
                return {m: info.address for m, info in coord.members().items()}
            except CoordinationUnavailable:
                return {}  # `mosafs status` shows the members without their addresses

        _publish_member(coord, member, address)
        try:
            return serve_active(args, data_dir, stop, listen_host, metrics_url,
                                leadership=leadership, on_in_sync=publish,
                                directory=directory)
        finally:
            if leadership.valid():
                leadership.resign()


def _standby_until_elected(args: argparse.Namespace, data_dir: Path, stop: threading.Event,
                           coord: Any, member: str, address: str) -> Any:
    """Serve as a standby until this member wins the leader key (its Leadership) or STOP
    is set (None)."""
    from mosafs.manager.follow_servicer import add_refusals
    from mosafs.manager.standby import Standby
    from mosafs.procutil import listen, serving

    standby = Standby(data_dir, map_size=args.map_size)
    following = _Following(standby, member)
    try:
        srv, _ = listen(add_refusals(following.active), args.listen, label="manager")
        try:
            done = threading.Event()
            watcher = threading.Thread(
                target=coord.watch_leader, args=(following.leader_is, done), daemon=True,
                name="mosafs-leader-watch")
            watcher.start()
            seq, epoch = standby.position()
            _publish_member(coord, member, address)
            serving(args.ready_file, address=address, data_dir=str(data_dir),
                    role="standby", member=member)
            log.info("manager %s on %s: a standby at log entry %d (epoch %d), "
                     "campaigning through etcd %s", member, address, seq, epoch,
                     ",".join(coord.endpoints))
            try:
                return coord.campaign(address, lambda: _eligible(coord, member), stop)
            finally:
                done.set()
                watcher.join()
                following.stop()
        finally:
            srv.stop(STOP_GRACE_S).wait()
    finally:
        standby.close()


def _publish_member(coord: Any, member: str, address: str) -> None:
    """This member's record in etcd (its address, for `mosafs status`); best effort."""
    from mosafs.coordination import CoordinationUnavailable

    try:
        coord.publish(member, address)
    except CoordinationUnavailable as exc:
        log.info("member record not published (etcd: %s)", exc)


def _eligible(coord: Any, member: str) -> bool:
    """May MEMBER lead? Only a member of the in-sync set the last leader published: it
    holds every change that was acknowledged. A cluster that never had a leader (no set
    written) lets anyone start it."""
    members, revision = coord.in_sync()
    return revision == 0 or member in members


class _Following:
    """The standby's follower of the current leader, replaced when etcd names another."""

    def __init__(self, standby: Any, member: str) -> None:
        self._standby = standby
        self._member = member
        self._lock = threading.Lock()
        self._follower: Any = None
        self._active = ""

    def active(self) -> str:
        with self._lock:
            return self._active or "(none elected yet)"

    def leader_is(self, leader: Any) -> None:
        from mosafs.rpc.follow import Follower

        with self._lock:
            if self._follower is not None:
                self._follower.stop()
                self._follower = None
            self._active = "" if leader is None else leader.address
            if leader is None or leader.member == self._member:
                return
            log.info("following the active manager %s at %s", leader.member, leader.address)
            self._follower = Follower(leader.address, self._standby, self._member,
                                      quiet=True)
            self._follower.start()

    def stop(self) -> None:
        with self._lock:
            if self._follower is not None:
                self._follower.stop()
                self._follower = None

