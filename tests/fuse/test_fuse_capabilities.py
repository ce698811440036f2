"""A mount with a restricted client certificate (`mosafs certs issue --path /jobA --uid
1000`): the mount sends the uid of each process (mosafs.client.acting) and the manager
holds it to the capability, so that certificate's mount shows /jobA only, to uid 1000
only, while the cluster's own full-access mount sees everything."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from tests import harness
from tests.harness import cli


def _probe(mnt: Path) -> dict[str, object]:
    """What uid 1000 can do through MNT."""
    out: dict[str, object] = {}

    def attempt(name: str, fn: Callable[[], object]) -> None:
        try:
            out[name] = fn()
        except OSError as exc:
            out[name] = errno.errorcode[exc.errno or 0]

    data = bytes(range(256)) * 4096

    def write_read() -> bool:
        (mnt / "jobA" / "mine").write_bytes(data)
        return (mnt / "jobA" / "mine").read_bytes() == data

    attempt("write_read", write_read)
    attempt("root_listing", lambda: sorted(os.listdir(mnt)))
    attempt("jobB", lambda: os.listdir(mnt / "jobB"))
    attempt("create_at_root", lambda: (mnt / "x").write_bytes(b""))
    return out


def as_uid_1000(mnt: Path) -> dict[str, object]:
    """_probe in a child process that runs as uid/gid 1000 (forked: the interpreter's
    files under /root are not readable to uid 1000)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.close(reader)
            os.setgroups([])
            os.setgid(1000)
            os.setuid(1000)
            os.write(writer, json.dumps(_probe(mnt)).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(writer)
    with os.fdopen(reader, "rb") as f:
        raw = f.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0 and raw, f"the uid 1000 probe failed (status {status})"
    result: dict[str, object] = json.loads(raw)
    return result


def test_fuse_restricted_certificate_mount(start_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = start_cluster()
    full = cluster.mountpoint
    (full / "jobA").mkdir()
    os.chown(full / "jobA", 1000, 1000)
    (full / "jobB").mkdir(mode=0o755)
    (full / "jobB" / "secret").write_bytes(b"root's")
    tls = cluster.data_dir / "tls"
    done = cli("certs", "issue", "jobA", "--role", "client", "--dir", str(tls),
               "--path", "/jobA", "--uid", "1000", "--gids", "1000")
    assert done.returncode == 0, done.stderr
    # Not under tmp_path: pytest's base directory is 0700, which uid 1000 cannot cross.
    base = Path(tempfile.mkdtemp(prefix="mosafs-caps-"))
    base.chmod(0o755)
    mnt = base / "restricted"
    mnt.mkdir()
    mount = harness.start("restricted", ["mount", str(mnt), "--manager", cluster.manager,
                                         "--tls-dir", str(tls), "--tls-name", "jobA",
                                         "--allow-other"], tmp_path / "procs")
    try:
        seen = as_uid_1000(mnt)
        # root itself, through this mount, is not uid 1000: refused by the manager (what
        # the mount has cached it may still show root, who holds the mount's key anyway).
        try:
            (mnt / "jobA" / "roots").write_bytes(b"x")
            root_refused = False
        except PermissionError:
            root_refused = True
    finally:
        try:
            mount.stop()
        finally:
            if os.path.ismount(mnt):
                os.system(f"fusermount3 -u -z {mnt}")
            shutil.rmtree(base, ignore_errors=True)
    assert seen == {"write_read": True, "root_listing": ["jobA"], "jobB": "EACCES",
                    "create_at_root": "EACCES"}, seen
    assert root_refused
    # The full-access mount sees the file, owned by uid 1000, within the coherence bound
    # for another mount's change (about 1 s, docs/client.md "Coherent caches"): it made
    # jobA itself and knows it whole, so the name comes with its next change list.
    mine = full / "jobA" / "mine"
    harness.wait_for(mine.exists, timeout=2.0, what="the other mount's file to be seen")
    st = mine.stat()
    assert (st.st_uid, st.st_size) == (1000, 1 << 20)
