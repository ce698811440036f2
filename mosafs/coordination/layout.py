"""Where mosafs keeps its coordination state in etcd, and how each value is written:

    /mosafs/<cluster>/leader            {"member", "address"}, under the leader's lease;
                                        its create revision is the leader's epoch
    /mosafs/<cluster>/in_sync           {"members": [...], "epoch": the writer's epoch}
    /mosafs/<cluster>/members/<member>  {"address"}, under the lease of the process that
                                        published it

Values are JSON so that `etcdctl get --prefix /mosafs/` reads well to a person.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from mosafs.coordination.gateway import CoordinationUnavailable, KeyValue
from mosafs.errors import ConfigError

log = logging.getLogger("mosafs.coordination")


@dataclass(frozen=True)
class LeaderInfo:
    member: str
    address: str  # the leader's gRPC address
    epoch: int  # the create revision of the leader key: the fencing token


@dataclass(frozen=True)
class MemberInfo:
    """What a manager published about itself: where it serves (`mosafs status` shows it
    beside each standby; how far a standby is comes from the active manager's log)."""

    member: str
    address: str


class Keys:
    """The keys of one cluster."""

    def __init__(self, cluster: str) -> None:
        check_name("cluster", cluster)
        self.prefix = f"/mosafs/{cluster}/".encode()
        self.leader = self.prefix + b"leader"
        self.in_sync = self.prefix + b"in_sync"
        self.members = self.prefix + b"members/"

    def member(self, name: str) -> bytes:
        check_name("member", name)
        return self.members + name.encode()


def check_name(what: str, name: str) -> None:
    """A cluster or member name is one key segment: with a '/' one member's record could
    reach into another's keys."""
    if not name or "/" in name or not name.isprintable():
        raise ConfigError(f"a {what} name must be printable, without '/', got {name!r}")


def encode_leader(member: str, address: str) -> bytes:
    return json.dumps({"member": member, "address": address}).encode()


def decode_leader(kvs: list[KeyValue]) -> LeaderInfo | None:
    """The leader in KVS (a read of the leader key), None when there is none."""
    if not kvs:
        return None
    try:
        body = json.loads(kvs[0].value)
        return LeaderInfo(str(body["member"]), str(body["address"]), kvs[0].create_revision)
    except (ValueError, KeyError, TypeError) as exc:
        raise CoordinationUnavailable(f"the leader key holds something that is not "
                                      f"mosafs's: {kvs[0].value!r}") from exc


def encode_in_sync(members: set[str], epoch: int) -> bytes:
    return json.dumps({"members": sorted(members), "epoch": epoch}).encode()


def decode_in_sync(value: bytes) -> set[str]:
    try:
        return {str(m) for m in json.loads(value)["members"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise CoordinationUnavailable(f"the in-sync set holds something that is not "
                                      f"mosafs's: {value!r}") from exc


def encode_member(address: str) -> bytes:
    return json.dumps({"address": address}).encode()


def decode_member(name: str, kv: KeyValue) -> MemberInfo | None:
    """The record in KV, or None (logged) for one that is not mosafs's."""
    try:
        body = json.loads(kv.value)
        return MemberInfo(name, str(body["address"]))
    except (ValueError, KeyError, TypeError) as exc:
        log.debug("member record %r is malformed: %r", kv.key, exc)
        return None
