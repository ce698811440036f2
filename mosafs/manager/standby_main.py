"""`mosafs manager --standby-of ADDR`: a standby manager process (docs/standby.md). It
holds the data directory's lock, follows the active manager's log into its own LMDB
(mosafs.rpc.follow), answers every Manager RPC with FAILED_PRECONDITION naming the active
manager, and stops cleanly on SIGTERM/SIGINT. Its data directory is that of a manager: a
standby stopped and started without --standby-of is an active manager with every change
it confirmed."""

from __future__ import annotations

import argparse
import logging
import threading
import uuid
from pathlib import Path

log = logging.getLogger("mosafs.manager")

MEMBER_FILE = "manager.id"
STOP_GRACE_S = 2.0


def member_id(data_dir: Path) -> str:
    """This data directory's manager id (made at its first start)."""
    path = data_dir / MEMBER_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        member = uuid.uuid4().hex
        path.write_text(member + "\n")
        return member


def run_standby(args: argparse.Namespace, data_dir: Path, stop: threading.Event,
                listen_host: str) -> int:
    from mosafs.addresses import advertised_address
    from mosafs.manager.follow_servicer import add_refusals
    from mosafs.manager.standby import Standby
    from mosafs.procutil import exclusive, listen, serving, wait_for_stop
    from mosafs.rpc.follow import Follower

    with exclusive(data_dir / "manager.lock", f"another manager is running on {data_dir}"):
        standby = Standby(data_dir, map_size=args.map_size)
        try:
            member = member_id(data_dir)
            srv, port = listen(add_refusals(args.standby_of), args.listen, label="manager")
            follower = Follower(args.standby_of, standby, member)
            follower.start()
            try:
                seq, epoch = standby.position()
                address = advertised_address(listen_host, port)
                serving(args.ready_file, address=address, data_dir=str(data_dir),
                        role="standby", member=member)
                log.info("standby %s of %s on %s, at log entry %d (epoch %d)", member,
                         args.standby_of, address, seq, epoch)
                wait_for_stop(stop)
                log.info("stopping")
            finally:
                follower.stop()
                srv.stop(STOP_GRACE_S).wait()
        finally:
            standby.close()
    log.info("stopped")
    return 0
