"""`mosafs up`: a whole single-machine cluster on embedded defaults.

Starts the manager and N benefactors as child processes on free loopback ports (each
writes a ready file with its address), waits until every benefactor has registered, mounts
the file system with a `mosafs mount` child, and writes DIR/cluster.json. SIGINT/SIGTERM
(or a child that dies) unmounts and stops everything in reverse order. A later `up` on the
same DIR finds every file again: all state lives under DIR.

Stopping loses nothing that was closed: at the first signal the mount waits, up to
--stop-timeout, for the applications to close the files they are writing (a close commits
the file whole), and `up` shows what it waits for; a second signal stops at once, and a file
still being written keeps its previous version. A mount point left dead by a mount process
that was killed is unmounted, when `up` exits and by the next `up`.

With --managers N (2 or more), N managers elect the active one through a private etcd
and the others follow its log as standbys (mosafs.upmanagers, docs/coordination.md).

DIR layout: manager/ (LMDB), manager-N/ (standbys' LMDB), benefactors/bN/ (chunks),
logs/*.log (or --log-dir), run/*.ready.json, tls/ (the cluster's CA and every process's
certificate, made at the first start: mutual TLS unless --insecure), cluster.json (while
running), up.lock (one `up` per DIR).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mosafs.argtypes import bounded_int, ec_min_chunk_arg, redundancy_arg
from mosafs.client.main import (
    add_coherent_timeout_argument,
    add_hash_backend_argument,
    add_stop_timeout_argument,
    check_stop_timeout,
)
from mosafs.deadmounts import is_dead_mount, is_mosafs_mount, lazy_unmount, recover_dead_mount
from mosafs.errors import ConfigError, Unavailable
from mosafs.procutil import LOG_LEVELS, python_command
from mosafs.running import forget_running, record_running

log = logging.getLogger("mosafs.up")
START_TIMEOUT = 120.0
DEFAULT_REPLICATION = 2  # copies of every chunk, given at least two benefactors
MAX_MANAGERS = 5
STOP_GRACE = 30.0  # seconds a child may take to exit beyond what it was told to wait
PROGRESS_EVERY = 5.0  # seconds between two progress lines when stdout is not a terminal


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mountpoint", help="where to mount (created if missing; must be empty)")
    parser.add_argument("--data-dir", help="all cluster state (default: a per-user data dir)")
    parser.add_argument("--benefactors", type=int, default=3, help="storage daemons (default 3)")
    parser.add_argument("--managers", type=bounded_int(1, MAX_MANAGERS), default=1,
                        metavar="N",
                        help="managers: with 2 or more, a private etcd and N managers that "
                             "elect the active one among themselves; the others are "
                             "standbys with a copy of its metadata, no change is "
                             "acknowledged before they have it on disk, and one takes over "
                             "by itself when the active one is lost (docs/coordination.md; "
                             "needs etcd, which scripts/setup.sh installs; default 1)")
    parser.add_argument("--replication", type=int,
                        help="replication factor R of the default pool (default 2, or 1 "
                             "with a single benefactor); short for --redundancy replicas:R")
    parser.add_argument("--redundancy", type=redundancy_arg, metavar="replicas:R|ec:K+M",
                        help="the default pool's redundancy: R whole copies, or K data + M "
                             "parity fragments on K+M distinct benefactors (ec:4+2 needs "
                             "--benefactors 6 or more; docs/erasure_pools.md)")
    parser.add_argument("--ec-min-chunk", type=ec_min_chunk_arg, metavar="SIZE",
                        help="with ec:K+M, chunks smaller than this are kept as M+1 copies "
                             "(default 128K)")
    parser.add_argument("--write-semantics", choices=["pessimistic", "optimistic"],
                        default="pessimistic",
                        help="close returns once every chunk has R copies (pessimistic, the "
                             "default: what close acknowledged survives the loss of a "
                             "benefactor) or one copy (optimistic: redundant seconds later)")
    parser.add_argument("--chunker", help="chunker spec (default cdc:262144:1048576:4194304)")
    parser.add_argument("--gc-grace", type=float, metavar="SECONDS",
                        help="an unreferenced chunk is deleted only after this long (the "
                             "manager's default: 600)")
    add_hash_backend_argument(parser)
    add_coherent_timeout_argument(parser)
    add_stop_timeout_argument(parser)
    parser.add_argument("--log-dir", metavar="DIR",
                        help="one log file per process here (default DATA_DIR/logs)")
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS, type=str.upper,
                        help="log level of every process (default INFO)")
    parser.add_argument("--log-format", default="text", choices=["text", "json"],
                        help="text lines, or JSON lines with level, logger, pid, message")
    parser.add_argument("--insecure", action="store_true",
                        help="plaintext gRPC: no certificates (default: mutual TLS with "
                             "certificates made in DATA_DIR/tls)")
    parser.add_argument("--chunk-tokens", choices=["on", "off"], default="on",
                        help="off: the manager issues no chunk access tokens and benefactors "
                             "check none; only to measure their cost (default on; "
                             "plaintext clusters have none)")
    parser.add_argument("--ready-file", help=argparse.SUPPRESS)


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    ready: dict[str, Any] = field(default_factory=dict)


def default_data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("mosafs"))


def run(args: argparse.Namespace) -> int:
    from mosafs.procutil import setup_logging

    setup_logging(args.log_level, args.log_format)
    if args.benefactors < 1:
        raise ConfigError("--benefactors must be at least 1")
    if args.replication is not None and not 1 <= args.replication <= args.benefactors:
        raise ConfigError(f"--replication must be 1..{args.benefactors} (the number of "
                          f"benefactors), got {args.replication}")
    if args.redundancy is not None:
        from mosafs.manager.pools import parse_redundancy

        kind = parse_redundancy(args.redundancy)
        if args.replication is not None and str(kind) != f"replicas:{args.replication}":
            raise ConfigError(f"--replication {args.replication} and --redundancy "
                              f"{args.redundancy} disagree: give one of them")
        if kind.width > args.benefactors:
            raise ConfigError(f"--redundancy {kind} needs {kind.width} benefactors (one per "
                              f"{'fragment' if kind.coded else 'copy'}): pass --benefactors "
                              f"{kind.width} or more, got {args.benefactors}")
    if args.gc_grace is not None and not 0 < args.gc_grace < 1e6:
        raise ConfigError(f"--gc-grace must be a positive number of seconds, got {args.gc_grace}")
    check_stop_timeout(args.stop_timeout)
    if args.chunker:
        from mosafs.chunking import parse_spec

        parse_spec(args.chunker)  # a bad spec is a one-line error before anything starts
    if args.hash_backend != "auto":  # auto always finds one; the mount logs which
        from mosafs.chunking import resolve_backend

        resolve_backend(args.hash_backend)
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    mountpoint = Path(args.mountpoint).absolute()
    made = _check_mountpoint(mountpoint)
    cluster: Cluster | None = None
    try:
        args.log_dir = Path(args.log_dir).absolute() if args.log_dir else data_dir / "logs"
        for sub in (args.log_dir, data_dir / "run", data_dir / "benefactors"):
            sub.mkdir(parents=True, exist_ok=True)
        from mosafs.procutil import exclusive

        with exclusive(data_dir / "up.lock", f"another mosafs up is running on {data_dir}"):
            cluster = Cluster(args, data_dir, mountpoint)
            return cluster.run()
    finally:
        if cluster is None or not cluster.started:
            # A start that failed leaves the file system as it found it: no empty
            # mount point directory for the user to find and remove.
            _remove_made(made)


def _check_mountpoint(mountpoint: Path) -> list[Path]:
    """Make MOUNTPOINT usable (created if missing, with its parents); the directories it
    made, outermost first."""
    if is_dead_mount(mountpoint):
        recover_dead_mount(mountpoint)
    missing = []
    path = mountpoint
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    mountpoint.mkdir(parents=True, exist_ok=True)
    made = missing[::-1]
    if os.path.ismount(mountpoint):
        hint = " (of a mosafs that is still running)" if is_mosafs_mount(mountpoint) else ""
        raise ConfigError(f"{mountpoint} is already a mount point{hint}")
    if any(mountpoint.iterdir()):
        raise ConfigError(f"mount point {mountpoint} is not empty")
    return made


def _remove_made(made: list[Path]) -> None:
    """Remove the directories _check_mountpoint made, innermost first, as long as they are
    empty (something put there since, or a mount still on it, stays)."""
    for path in reversed(made):
        try:
            path.rmdir()
        except OSError:
            return


class Cluster:
    def __init__(self, args: argparse.Namespace, data_dir: Path, mountpoint: Path) -> None:
        self.args = args
        self.data_dir = data_dir
        self.mountpoint = mountpoint
        self.children: list[Child] = []
        self.stop = threading.Event()  # the first SIGINT/SIGTERM
        self.abort = threading.Event()  # a second one: stop without waiting for writers
        self.tls_dir: Path | None = None
        self.mount_status = data_dir / "run" / "mount.status.json"
        self.started = False  # every process up and the cluster announced
        self.standbys: list[Child] = []  # standby managers (--managers)

    def run(self) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        self.tls_dir = None if self.args.insecure else self._certificates()
        try:
            self._start_all()
            self._write_cluster_file()
            record_running(self.data_dir)
            self._announce()
            self.started = True
            return self._supervise()
        finally:
            self._stop_all()

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.stop.is_set():
            self.abort.set()
        self.stop.set()

    # -- starting --------------------------------------------------------------------------

    def _certificates(self) -> Path:
        """DATA_DIR/tls: the cluster's CA and a certificate per process, made at the first
        start (and for benefactors added since); this process uses the admin one."""
        from mosafs import certs
        from mosafs.rpc import security

        tls = self.data_dir / "tls"
        if not (tls / "ca.crt").exists():
            certs.init_ca(tls)
        wanted = [("manager", "manager"), ("client", "client"), ("admin", "admin"),
                  *((f"benefactor-{i}", "benefactor") for i in range(self.args.benefactors))]
        for name, role in wanted:
            if not (tls / f"{name}.crt").exists():
                certs.issue(tls, name, role)
        security.configure(certs.load(tls, "admin"))
        return tls

    def _tls_args(self, name: str) -> list[str]:
        if self.tls_dir is None:
            return ["--insecure"]
        return ["--tls-dir", str(self.tls_dir), "--tls-name", name]

    def _spawn(self, name: str, args: list[str]) -> Child:
        ready_file = self.data_dir / "run" / f"{name}.ready.json"
        ready_file.unlink(missing_ok=True)
        cmd = python_command("mosafs", *args, "--ready-file", str(ready_file),
                             "--log-level", self.args.log_level,
                             "--log-format", self.args.log_format,
                             *self._tls_args(_identity(name)))
        # Own process group: a Ctrl-C at the terminal reaches `up` alone, which then stops
        # the children in order (the mount first).
        with open(self.args.log_dir / f"{name}.log", "ab") as log_file:
            popen = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        child = Child(name, popen)
        self.children.append(child)
        child.ready = self._wait_ready(child, ready_file)
        return child

    def _replication(self) -> int:
        if self.args.replication is None:
            return min(DEFAULT_REPLICATION, self.args.benefactors)
        return int(self.args.replication)

    def _wait_ready(self, child: Child, ready_file: Path) -> dict[str, Any]:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready_file.exists():
            if child.popen.poll() is not None:
                raise Unavailable(f"{child.name} exited with status {child.popen.returncode}; "
                                  f"see {self.args.log_dir / (child.name + '.log')}")
            if self.stop.is_set() or time.monotonic() > deadline:
                raise Unavailable(f"{child.name} did not start")
            time.sleep(0.05)
        return dict(json.loads(ready_file.read_text()))

    def _start_all(self) -> None:
        from mosafs.upmanagers import ManagerGroup

        manager_args = ["manager"]
        if self.args.redundancy is not None:
            manager_args += ["--redundancy", self.args.redundancy]
        else:
            manager_args += ["--replication", str(self._replication())]
        if self.args.ec_min_chunk is not None:
            manager_args += ["--ec-min-chunk", str(self.args.ec_min_chunk)]
        manager_args += ["--write-semantics", self.args.write_semantics]
        if self.args.chunker:
            manager_args += ["--chunker", self.args.chunker]
        if self.args.gc_grace is not None:
            manager_args += ["--gc-grace", str(self.args.gc_grace)]
        if self.args.chunk_tokens == "off":
            manager_args += ["--chunk-tokens", "off"]
        self.managers = ManagerGroup(self._spawn, self.data_dir, self.args.managers,
                                     manager_args)
        self.managers.start()
        self.manager = self.managers.members[0]
        self.standbys = self.managers.members[1:]
        address = self.managers.address  # every manager's: the active one is followed
        self.benefactors = [
            self._spawn(f"benefactor-{i}", [
                "benefactor", "--data-dir", str(self.data_dir / "benefactors" / f"b{i}"),
                "--manager", address])
            for i in range(self.args.benefactors)]
        self._wait_registered(self.managers.wait_active(),
                              {b.ready["id"] for b in self.benefactors})
        self.mount_status.unlink(missing_ok=True)
        mount_args = ["mount", str(self.mountpoint), "--manager", address,
                      "--hash-backend", self.args.hash_backend,
                      "--stop-timeout", str(self.args.stop_timeout),
                      "--coherent-timeout", str(self.args.coherent_timeout),
                      "--status-file", str(self.mount_status)]
        if os.geteuid() == 0:
            # A cluster run by root serves every user of the machine; the kernel checks
            # permissions (default_permissions), as on a local file system.
            mount_args.append("--allow-other")
        self.mount = self._spawn("mount", mount_args)

    def _wait_registered(self, address: str, wanted: set[str]) -> None:
        from mosafs._proto import manager_pb2 as mpb
        from mosafs._proto import manager_pb2_grpc as mgrpc
        from mosafs.rpc.channels import channel
        from mosafs.rpc.errors import call

        deadline = time.monotonic() + START_TIMEOUT
        with channel(address) as ch:
            stub = mgrpc.ManagerStub(ch)
            while True:
                reply = call(stub.ListBenefactors, mpb.ListBenefactorsRequest(), timeout=10)
                alive = {b.info.id for b in reply.benefactors if b.alive}
                if wanted <= alive:
                    return
                if self.stop.is_set() or time.monotonic() > deadline:
                    raise Unavailable(f"benefactors {sorted(wanted - alive)} did not register")
                time.sleep(0.05)

    # -- running ---------------------------------------------------------------------------

    def cluster_info(self) -> dict[str, Any]:
        return {
            "manager": self.managers.addresses[0],
            "managers": self.managers.addresses,
            **({"etcd": self.managers.etcd.endpoint} if self.managers.etcd else {}),
            "benefactors": [
                {"id": b.ready["id"], "address": b.ready["address"],
                 "data_dir": b.ready["data_dir"], "pid": b.popen.pid}
                for b in self.benefactors],
            "mountpoint": str(self.mountpoint),
            "pid": os.getpid(),
            "client": {"pid": self.mount.popen.pid},
            "data_dir": str(self.data_dir),
            "logs": str(self.args.log_dir),
            "metrics": {
                "manager": self.manager.ready.get("metrics"),
                "benefactors": {b.ready["id"]: b.ready.get("metrics") for b in self.benefactors},
                "client": self.mount.ready.get("metrics"),
            },
            "tls": {"dir": str(self.tls_dir), "admin": "admin"} if self.tls_dir else None,
        }

    def _write_cluster_file(self) -> None:
        from mosafs.procutil import write_json_atomic, write_ready_file

        info = self.cluster_info()
        write_json_atomic(self.data_dir / "cluster.json", info)
        write_ready_file(self.args.ready_file, address=info["manager"],
                         **{k: v for k, v in info.items() if k != "pid"})

    def _announce(self) -> None:
        info = self.cluster_info()
        print(f"mosafs is mounted at {info['mountpoint']}", flush=True)
        print(f"  manager     {info['manager']}", flush=True)
        for standby in self.standbys:
            print(f"  standby     {standby.ready['address']}", flush=True)
        for b in info["benefactors"]:
            print(f"  benefactor  {b['address']}  {b['data_dir']}", flush=True)
        print(f"  cluster     {self.data_dir / 'cluster.json'}", flush=True)
        print(f"  logs        {info['logs']}", flush=True)
        print("Press Ctrl-C (or send SIGTERM) to unmount and stop; files being written are "
              f"committed when their applications close them (waiting up to "
              f"{self.args.stop_timeout:g} s; Ctrl-C again stops at once).", flush=True)

    def _supervise(self) -> int:
        """Until asked to stop, or the manager or the mount exits. A benefactor that exits
        is reported once and the cluster goes on: its chunks are replicated elsewhere
        (DESIGN §8), and `mosafs benefactor` on its data directory brings it back."""
        gone: set[str] = set()
        while not self.stop.wait(0.5):
            for child in self.children:
                if child.popen.poll() is None or child.name in gone:
                    continue
                if child.name.startswith("benefactor-"):
                    gone.add(child.name)
                    log.warning("%s exited with status %s; going on without it (its chunks "
                                "are copied to the other benefactors)", child.name,
                                child.popen.returncode)
                    continue
                if child.name.startswith("manager") and self.managers.exited(child):
                    self.children.remove(child)  # started again: a new child
                    break
                log.error("%s exited with status %s; stopping the cluster",
                          child.name, child.popen.returncode)
                return 1
        log.info("stopping")
        return 0

    # -- stopping --------------------------------------------------------------------------

    def _stop_all(self) -> None:
        self.stop.set()  # a signal from now on (a child exited first) is the second one
        # The mount first, then the benefactors, the managers last, all at once: stopped
        # one by one, each standby left would be elected in turn.
        managers = [c for c in self.children if c.name.startswith("manager")]
        for child in reversed([c for c in self.children if c not in managers]):
            if child.name == "mount":
                self._stop_mount(child)
            else:
                self._stop_child(child)
        self._stop_children(managers)
        if getattr(self, "managers", None) is not None:
            self.managers.stop_etcd()
        if is_dead_mount(self.mountpoint) or os.path.ismount(self.mountpoint):
            # The mount process died without unmounting: its mount point would answer
            # ENOTCONN to every access, and refuse the next `up`.
            log.info("unmounting %s, left behind by the mount process", self.mountpoint)
            lazy_unmount(self.mountpoint)
        (self.data_dir / "cluster.json").unlink(missing_ok=True)
        self.mount_status.unlink(missing_ok=True)
        forget_running()

    def _stop_mount(self, child: Child) -> None:
        """SIGTERM, then wait while the mount waits for the files open for writing to be
        closed (it gives up after --stop-timeout by itself), showing what it waits for. A
        second Ctrl-C is passed on as SIGINT, a signal other than the first (the mount could
        merge two of one kind), and the mount stops at once."""
        if child.popen.poll() is not None:
            return
        child.popen.send_signal(signal.SIGTERM)
        progress = _StopProgress(self.args.stop_timeout)
        deadline = time.monotonic() + self.args.stop_timeout + STOP_GRACE
        passed_on = False
        while not _exited(child, timeout=0.2):
            if self.abort.is_set() and not passed_on:
                passed_on = True
                child.popen.send_signal(signal.SIGINT)
                progress.aborting()
                deadline = min(deadline, time.monotonic() + STOP_GRACE)
            if time.monotonic() > deadline:
                log.error("mount did not stop; killing it")
                child.popen.kill()
                child.popen.wait()
                break
            progress.show(self._read_mount_status())
        progress.finish(self._read_mount_status())

    def _read_mount_status(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.mount_status.read_text()))
        except (OSError, ValueError):
            return {}

    def _stop_child(self, child: Child) -> None:
        self._stop_children([child])

    def _stop_children(self, children: list[Child]) -> None:
        """SIGTERM to every one of CHILDREN at once; SIGKILL to those still running 30 s
        later."""
        running = [c for c in children if c.popen.poll() is None]
        for child in running:
            child.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for child in running:
            try:
                child.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("%s ignored SIGTERM; killing it", child.name)
                child.popen.kill()
                child.popen.wait()


def _identity(name: str) -> str:
    """The certificate a child process uses: benefactors their own, the mount the client's,
    every manager the manager's."""
    if name == "mount":
        return "client"
    return "manager" if name.startswith("manager") else name


def _exited(child: Child, timeout: float) -> bool:
    try:
        child.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


class _StopProgress:
    """What the terminal shows while the mount waits for files open for writing: one line
    rewritten in place on a terminal; elsewhere (a log file), a line when the number of
    files changes and every PROGRESS_EVERY seconds."""

    def __init__(self, stop_timeout: float) -> None:
        self.started = time.monotonic()
        self.stop_timeout = stop_timeout
        self.tty = sys.stdout.isatty()
        self.last: tuple[int, float] | None = None  # files shown, and when
        self.aborted = False

    def show(self, status: dict[str, Any]) -> None:
        files = int(status.get("files", 0)) if status.get("state") == "stopping" else 0
        now = time.monotonic()
        if not files or self.aborted or (not self.tty and self.last is not None and
                                         self.last[0] == files and
                                         now - self.last[1] < PROGRESS_EVERY):
            return
        left = max(0.0, self.stop_timeout - (now - self.started))
        it = "it" if files == 1 else "them"
        text = (f"waiting for {_files(files)} open for writing to be closed and committed: "
                f"{_size(int(status.get('bytes', 0)))} written (at most {left:.0f} s more; "
                f"Ctrl-C again to stop now and discard {it})")
        print(f"\r\x1b[K{text}" if self.tty else text, end="" if self.tty else "\n",
              flush=True)
        self.last = (files, now)

    def aborting(self) -> None:
        self._end_line()
        self.aborted = True
        if self.last is not None:
            print("stopping now: what is not committed is discarded (such files keep their "
                  "previous version)", flush=True)

    def finish(self, status: dict[str, Any]) -> None:
        self._end_line()
        discarded = int(status.get("discarded", 0)) if status.get("state") == "stopped" else 0
        if discarded:
            their, keep = (("its", "it keeps its") if discarded == 1 else
                           ("their", "they keep their"))
            print(f"{_files(discarded)} not closed in time: {their} uncommitted writes were "
                  f"discarded, {keep} previous version", flush=True)
        elif status.get("state") == "stopped" and self.last is not None:
            print("every file open for writing was closed and committed", flush=True)
        elif self.last is not None:  # killed: no last word from the mount
            print("the mount did not stop cleanly: files still open for writing keep their "
                  "previous version", flush=True)

    def _end_line(self) -> None:
        if self.tty and self.last is not None and not self.aborted:
            print(flush=True)


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    power = min(3, (n.bit_length() - 1) // 10)
    return f"{n / (1 << 10 * power):.1f} {('KiB', 'MiB', 'GiB')[power - 1]}"
