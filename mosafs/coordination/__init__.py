"""Coordination of standby managers through etcd: exactly one active manager at a time,
decided by an etcd lease, never by consensus of our own (docs/coordination.md).

- `Coordinator`: campaign for leadership, follow the leader, the in-sync set, member
  records; `Leadership`: a won term, with the fencing rule (`valid()`) and its epoch.
- `EtcdServer`: a private etcd process for the tests and `mosafs up --managers N`.
- `CoordinationUnavailable`: every etcd or network failure.
"""

from mosafs.coordination.etcd_server import EtcdNotFound, EtcdServer, find_etcd
from mosafs.coordination.gateway import CoordinationUnavailable
from mosafs.coordination.layout import Keys, LeaderInfo, MemberInfo
from mosafs.coordination.leadership import Coordinator, Leadership, boottime

__all__ = [
    "CoordinationUnavailable",
    "Coordinator",
    "EtcdNotFound",
    "EtcdServer",
    "Keys",
    "LeaderInfo",
    "Leadership",
    "MemberInfo",
    "boottime",
    "find_etcd",
]
