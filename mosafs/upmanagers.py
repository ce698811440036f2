"""The managers of `mosafs up` (mosafs.up): one manager, or with `--managers N` (N >= 2) a
failover group (docs/coordination.md): a private etcd process, then N managers that elect
the active one among themselves (`mosafs manager --etcd`), each on an address of its own
that is kept across its restarts (clients and benefactors are given every address).

A member that exits (SIGKILLed, or deposed: status 75) is started again on its data
directory and address, where it comes back as a standby; a member whose data directory
was lost comes back empty and catches up from a snapshot.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mosafs.errors import MosafsError, Unavailable

log = logging.getLogger("mosafs.up")

ADDRESSES_FILE = "managers.json"  # DATA_DIR/run/: each member's address, kept across starts
ACTIVE_TIMEOUT_S = 60.0


class ManagerGroup:
    """SPAWN(name, args) starts a child and waits for its ready file (mosafs.up.Cluster).
    BASE_ARGS: every member's `mosafs manager` arguments but its data directory."""

    def __init__(self, spawn: Callable[[str, list[str]], Any], data_dir: Path, count: int,
                 base_args: list[str]) -> None:
        self._spawn = spawn
        self._data_dir = data_dir
        self._count = count
        self._base_args = base_args
        self.members: list[Any] = []  # their Child records, in order
        self.etcd: Any = None
        self._args: dict[str, list[str]] = {}

    @property
    def failover(self) -> bool:
        return self._count > 1

    @property
    def addresses(self) -> list[str]:
        return [m.ready["address"] for m in self.members]

    @property
    def address(self) -> str:
        """What to give clients and benefactors: one address, or all of them."""
        return ",".join(self.addresses)

    def start(self) -> None:
        if not self.failover:
            self.members = [self._start("manager", [
                *self._base_args, "--data-dir", str(self._data_dir / "manager")])]
            return
        from mosafs.coordination import EtcdServer

        # Its log stays in its own directory: etcd's warnings (a slow disk) are not ours.
        self.etcd = EtcdServer(self._data_dir / "etcd")
        self.etcd.start()
        from mosafs.manager.ha_main import fixed_listen

        kept = self._kept_addresses()
        for i in range(self._count):
            name = "manager" if i == 0 else f"manager-{i}"
            # A port of its own from the first start on: a restart serves where clients
            # and benefactors were told.
            listen = kept.get(name) or fixed_listen("127.0.0.1:0")
            self.members.append(self._start(name, [
                *self._base_args, "--data-dir", str(self._data_dir / name),
                "--listen", listen, "--etcd", self.etcd.endpoint, "--standbys", "1"]))
            # The first one elects itself before the others start (on a first start
            # anyone may lead; later, the in-sync set says who).
            if i == 0:
                self.wait_active()
        self._keep_addresses()

    def _start(self, name: str, args: list[str]) -> Any:
        self._args[name] = args
        return self._spawn(name, args)

    def _kept_addresses(self) -> dict[str, str]:
        try:
            found = json.loads((self._data_dir / "run" / ADDRESSES_FILE).read_text())
            return {str(k): str(v) for k, v in found.items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def _keep_addresses(self) -> None:
        from mosafs.procutil import write_json_atomic

        write_json_atomic(self._data_dir / "run" / ADDRESSES_FILE,
                          {m.name: m.ready["address"] for m in self.members})

    # -- while running ----------------------------------------------------------------------

    def exited(self, child: Any) -> bool:
        """CHILD, a member that exited: start it again (True) where this is a failover
        group; False where the cluster cannot go on without it. A member that does not
        start again (Unavailable from SPAWN) stops `up` with that error."""
        if not self.failover or child not in self.members:
            return False
        log.warning("manager %s exited with status %s; starting it again on %s",
                    child.name, child.popen.returncode, child.ready["address"])
        self.members[self.members.index(child)] = self._spawn(child.name,
                                                              self._args[child.name])
        return True

    def wait_active(self, timeout: float = ACTIVE_TIMEOUT_S) -> str:
        """The address of the active manager, once one answers as active."""
        from mosafs._proto import manager_pb2 as mpb
        from mosafs.admin.common import Manager, ask
        from mosafs.rpc.channels import PROCESS_IDENTITY

        deadline = time.monotonic() + timeout
        last: MosafsError | None = None
        while time.monotonic() < deadline:
            for address in self.addresses:
                try:
                    ask(Manager(address, PROCESS_IDENTITY), "GetClusterStatus",
                        mpb.ClusterStatusRequest(), timeout=5)
                    return address
                except MosafsError as exc:
                    last = exc
            time.sleep(0.1)
        raise Unavailable(f"no manager became active within {timeout:g} s"
                          + (f" ({last.message})" if last else ""))

    def stop_etcd(self) -> None:
        if self.etcd is not None:
            self.etcd.stop()
