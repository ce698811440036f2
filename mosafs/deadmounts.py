"""Mount points left by a mount process that died (SIGKILL, a crash): how `mosafs up`
recognises one and detaches it before mounting again."""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

from mosafs.errors import ConfigError

log = logging.getLogger("mosafs.up")  # said by `mosafs up`, as its own lines are


def is_dead_mount(path: Path) -> bool:
    """A FUSE mount whose process is gone: every access fails with ENOTCONN ("Transport
    endpoint is not connected"). os.path.ismount() says False for it."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ENOTCONN
    return False


def is_mosafs_mount(path: Path) -> bool:
    """PATH is a mosafs mount (alive or dead) in the mount table."""
    where = os.path.join(os.path.realpath(path.parent), path.name)
    try:
        table = Path("/proc/self/mounts").read_text()
    except OSError:
        return False
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        # The table writes a space in a path as \040, a tab as \011, and so on.
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
        if fields[2] == "fuse.mosafs" and point == where:
            return True
    return False


def recover_dead_mount(mountpoint: Path) -> None:
    """Detach what a killed mosafs mount left: nothing is lost by it (what was not committed
    died with the process). A dead mount of another file system is left to its owner."""
    if not is_mosafs_mount(mountpoint):
        raise ConfigError(f"{mountpoint} is a dead mount of another file system (Transport "
                          f"endpoint is not connected): unmount it first (fusermount3 -u -z "
                          f"{mountpoint}, or umount -l)")
    log.warning("%s is a mosafs mount whose process is gone (Transport endpoint is not "
                "connected): unmounting it", mountpoint)
    for _ in range(8):  # mounts of several crashes may lie on top of each other
        lazy_unmount(mountpoint)
        if not is_dead_mount(mountpoint):
            return
    raise ConfigError(f"{mountpoint} stays a dead mount (Transport endpoint is not "
                      f"connected): try fusermount3 -u -z {mountpoint}")


def lazy_unmount(mountpoint: Path) -> None:
    """A mount whose client died leaves a dead mount behind; detach it."""
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmd = [tool, "-u", "-z", str(mountpoint)] if tool else ["umount", "-l", str(mountpoint)]
    subprocess.run(cmd, check=False, capture_output=True)
