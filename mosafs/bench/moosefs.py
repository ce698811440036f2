"""MooseFS, the peer of `mosafs bench write` (issue 17): a private cluster on this machine.

One master, three chunkservers (each with a directory-backed disk of its own under the
bench's work directory), goal 2 (every chunk on two chunkservers, as mosafs' R=2), and
mfsmount. Nothing of the system's MooseFS set-up is used: the configuration files, the
metadata, the disks and the logs all live under the work directory (never /etc/mfs or
/var/lib/mfs, whose empty metadata file is only copied).

Why a network namespace: the master refuses chunkservers that connect from a loopback
address (it would hand 127.x to clients as the chunks' location), so the cluster needs an
address of another kind. The bench makes a namespace `mfsbench-PID`, brings its
loopback device up with the private address 10.214.0.1/32 on it, and runs the master,
the chunkservers and mfsmount in it. Packets between them still go through a loopback
device, as those of mosafs' processes on 127.0.0.1 do: same machine, same kind of link,
no rate limit, so the comparison is one of CPU and design. mfsmount joins the namespace's
network only (`nsenter --net`), so its mount is in this mount namespace, where the
bench's writer processes use it like any other directory. The host's network is not
touched; deleting the namespace removes the address.

Fairness: MooseFS' daemons raise their own priority to nice -19 by default; here they run
at nice 0 like mosafs' processes (NICE_LEVEL = 0, mfsmount -o mfsnice=0). mfsmount
flushes its write cache to the chunkservers before close returns (its default
mfsfsyncmintime=0); the chunkservers do not fsync a chunk before closing it unless
`fsync=True` (HDD_FSYNC_BEFORE_CLOSE = 1), where mosafs' benefactors fsync every chunk.

Every process runs in a session of its own and is stopped by its pid: mfsmount (after
fusermount3 -u), the chunkservers, the master; then the namespace is deleted, whatever
happened. A namespace left by a run that was killed is deleted at the next start.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mosafs.bench import procs
from mosafs.bench.procs import BenchError, alive, kill_pids, log
from mosafs.bench.testbed import _run, remove_stale_namespaces
from mosafs.errors import ConfigError

DAEMONS = ("mfsmaster", "mfschunkserver", "mfsmount")
TOOLS = ("mfssetgoal", "mfsgetgoal", "mfsfileinfo")  # moosefs-client, beside mfsmount
SYSTEM_TOOLS = ("ip", "nsenter", "fusermount3")
APT_COMMAND = "apt-get install -y moosefs-master moosefs-chunkserver moosefs-client"
EMPTY_METADATA = Path("/var/lib/mfs/metadata.mfs.empty")
PEERS = ("auto", "moosefs", "none")

NAMESPACE = "mfsbench-{pid}"  # not testbed's "mbench-": its tests expect only their own there
ADDRESS = "10.214.0.1"   # private; lives only on the namespace's loopback device
MASTER_PORTS = {"MATOML": 9419, "MATOCS": 9420, "MATOCL": 9421}  # metaloggers, cs, clients
CHUNKSERVER_PORT = 9422  # chunkserver I listens on 9422 + I
CHUNKSERVERS = 3
GOAL = 2
LEAVE_SPACE = 256 << 20  # a chunkserver's HDD_LEAVE_SPACE_DEFAULT: never filled
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0


# -- whether it can run ---------------------------------------------------------------------

def unavailable_reason() -> str | None:
    """Why a MooseFS peer cannot run here (one line, with the fix), or None."""
    missing = [b for b in (*DAEMONS, *TOOLS) if shutil.which(b) is None]
    if missing:
        return f"MooseFS is not installed ({', '.join(missing)} not on PATH); " \
               f"install it with: {APT_COMMAND}"
    if not EMPTY_METADATA.is_file():
        return f"MooseFS' empty metadata file {EMPTY_METADATA} is missing; reinstall " \
               f"moosefs-master: {APT_COMMAND}"
    if os.geteuid() != 0:
        return "the MooseFS peer needs root (it makes a network namespace and mounts)"
    tools = [t for t in SYSTEM_TOOLS if shutil.which(t) is None]
    if tools:
        return f"the MooseFS peer needs {', '.join(tools)} (iproute2, util-linux, fuse3)"
    return None


def choose_peer(peer: str) -> str | None:
    """Whether the run has a MooseFS peer: None if it has, else why not. `moosefs` that
    cannot run here is an error (ConfigError, exit code 2) before anything starts; `auto`
    skips it with the reason."""
    if peer not in PEERS:
        raise ConfigError(f"--peer must be one of {', '.join(PEERS)}, got {peer!r}")
    if peer == "none":
        return "not asked for (--peer none)"
    reason = unavailable_reason()
    if reason and peer == "moosefs":
        raise ConfigError(f"--peer moosefs: {reason}")
    return reason


def space_reason(where: Path, need: int) -> str | None:
    """Why the chunkservers' disks (directories on WHERE's file system) cannot take NEED
    bytes (every copy counted), or None."""
    free = shutil.disk_usage(where).free
    want = need + CHUNKSERVERS * LEAVE_SPACE + (1 << 30)  # and a GiB for everything else
    if free < want:
        return (f"MooseFS peer: {free >> 20} MiB free under {where}, {want >> 20} MiB "
                f"needed ({need >> 20} MiB of chunk copies)")
    return None


# -- configuration --------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """Where everything of one private cluster lives, and its configuration files' text."""

    root: Path
    chunkservers: int = CHUNKSERVERS
    address: str = ADDRESS
    fsync: bool = False      # chunkservers fsync each chunk before closing it
    user: str = "root"
    group: str = "root"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def master_data(self) -> Path:
        return self.root / "master"

    def chunkserver_data(self, i: int) -> Path:
        return self.root / f"cs{i}"

    def disk(self, i: int) -> Path:
        return self.root / f"hdd{i}"

    @property
    def mountpoint(self) -> Path:
        return self.root / "mnt"

    def chunkserver_port(self, i: int) -> int:
        return CHUNKSERVER_PORT + i

    def master_cfg(self) -> str:
        ports = "".join(f"{k}_LISTEN_HOST = {self.address}\n{k}_LISTEN_PORT = {p}\n"
                        for k, p in MASTER_PORTS.items())
        return (self._common(self.master_data)
                + f"EXPORTS_FILENAME = {self.etc / 'mfsexports.cfg'}\n"
                f"TOPOLOGY_FILENAME = {self.etc / 'mfstopology.cfg'}\n" + ports)

    def chunkserver_cfg(self, i: int) -> str:
        return (self._common(self.chunkserver_data(i))
                + f"HDD_CONF_FILENAME = {self.etc / f'mfshdd{i}.cfg'}\n"
                f"HDD_FSYNC_BEFORE_CLOSE = {int(self.fsync)}\n"
                f"MASTER_HOST = {self.address}\n"
                f"MASTER_PORT = {MASTER_PORTS['MATOCS']}\n"
                f"BIND_HOST = {self.address}\n"
                f"CSSERV_LISTEN_HOST = {self.address}\n"
                f"CSSERV_LISTEN_PORT = {self.chunkserver_port(i)}\n")

    def hdd_cfg(self, i: int) -> str:
        return f"{self.disk(i)}\n"  # the whole file system, less HDD_LEAVE_SPACE_DEFAULT

    def exports_cfg(self) -> str:
        # Only the namespace's own address can reach the master; root stays root.
        return f"{self.address}/32 / rw,alldirs,maproot=0\n"

    def _common(self, data: Path) -> str:
        # Nice 0 like mosafs' processes (MooseFS' default is -19); no mlockall.
        return (f"WORKING_USER = {self.user}\nWORKING_GROUP = {self.group}\n"
                f"NICE_LEVEL = 0\nLOCK_MEMORY = 0\nDATA_PATH = {data}\n")

    def write(self) -> None:
        """Make the directories, write the configuration, seed the master's metadata."""
        for d in (self.etc, self.master_data, self.mountpoint,
                  *(self.chunkserver_data(i) for i in range(self.chunkservers)),
                  *(self.disk(i) for i in range(self.chunkservers))):
            d.mkdir(parents=True, exist_ok=True)
        (self.etc / "mfsmaster.cfg").write_text(self.master_cfg())
        (self.etc / "mfsexports.cfg").write_text(self.exports_cfg())
        (self.etc / "mfstopology.cfg").write_text("")
        for i in range(self.chunkservers):
            (self.etc / f"mfschunkserver{i}.cfg").write_text(self.chunkserver_cfg(i))
            (self.etc / f"mfshdd{i}.cfg").write_text(self.hdd_cfg(i))
        metadata = self.master_data / "metadata.mfs"
        if not metadata.exists():  # a fresh file system
            shutil.copyfile(EMPTY_METADATA, metadata)


def this_user() -> tuple[str, str]:
    """The daemons' WORKING_USER and WORKING_GROUP: the bench's own (so they can use the
    work directory, which mkdtemp makes 0700)."""
    return pwd.getpwuid(os.geteuid()).pw_name, grp.getgrgid(os.getegid()).gr_name


# -- processes ------------------------------------------------------------------------------

class _Process:
    """A MooseFS program in the foreground (-f), in a session of its own, logging to a
    file. `ip netns exec` and `nsenter` exec the program, so the pid is the program's."""

    def __init__(self, name: str, cmd: list[str], log_path: Path) -> None:
        self.name, self.cmd, self.log_path = name, cmd, log_path
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log_file:
            self.popen = subprocess.Popen(self.cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        procs.STARTED.append((self.name, self.popen.pid))

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_until(self, ready: Any, what: str, timeout: float = START_TIMEOUT) -> None:
        """Poll READY() until true; BenchError with the log's tail if the process exits
        or TIMEOUT passes first."""
        deadline = time.monotonic() + timeout
        while not ready():
            if not self.running():
                code = self.popen.returncode if self.popen else None
                raise BenchError(f"{self.name} exited with status {code} before {what}; "
                                 f"log {self.log_path}:\n{self._tail()}")
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: no {what} after {timeout:.0f}s; "
                                 f"log {self.log_path}:\n{self._tail()}")
            time.sleep(0.05)

    def _tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM (MooseFS daemons save their state and exit), wait, SIGKILL if needed."""
        if self.popen is not None:
            procs.terminate(self.popen, self.name, timeout)


def listening(pid: int, port: int) -> bool:
    """Whether a TCP socket in PID's network namespace listens on PORT (/proc/PID/net/tcp:
    read from here, no process in the namespace needed)."""
    try:
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
            return True
    return False


def registered_ports(master_log: str) -> set[int]:
    """Ports of the chunkservers the master finished registering (its log, -f mode)."""
    return {int(p) for p in re.findall(r"chunkserver register end\b.*?port: (\d+)", master_log)}


def parse_fileinfo(text: str) -> dict[str, Any]:
    """`mfsfileinfo PATH`: chunks, and valid copies of each (min and max)."""
    copies: list[int] = []
    for line in text.splitlines():
        if re.match(r"\s*chunk \d+:", line):
            copies.append(0)
        elif copies and re.match(r"\s*copy \d+:.*status:VALID", line):
            copies[-1] += 1
    return {"chunks": len(copies), "min_copies": min(copies, default=0),
            "max_copies": max(copies, default=0)}


# -- the cluster ----------------------------------------------------------------------------

class MooseFs:
    """`MooseFs(workdir).start()`; always `stop()` (a context manager does)."""

    def __init__(self, workdir: Path, *, fsync: bool = False,
                 chunkservers: int = CHUNKSERVERS) -> None:
        user, group = this_user()
        self.layout = Layout(workdir.absolute(), chunkservers, fsync=fsync, user=user,
                             group=group)
        self.namespace = NAMESPACE.format(pid=os.getpid())
        self.made_namespace = False
        self.master: _Process | None = None
        self.chunkservers: list[_Process] = []
        self.client: _Process | None = None
        self.helpers: list[int] = []  # the master's children (its "data writer")
        self.mounts = 0

    @property
    def mnt(self) -> Path:
        return self.layout.mountpoint

    def _in_namespace(self) -> list[str]:
        """Run a program in the namespace, network and all (`ip netns exec`)."""
        return ["ip", "netns", "exec", self.namespace]

    def _network_only(self) -> list[str]:
        """Join only the namespace's network: a mount made so is seen from here."""
        return ["nsenter", f"--net=/run/netns/{self.namespace}"]

    # -- start ------------------------------------------------------------------------------

    def start(self) -> MooseFs:
        lay = self.layout
        lay.write()
        self._make_namespace()
        self.master = _Process("mfsmaster", [*self._in_namespace(), "mfsmaster", "-c",
                                             str(lay.etc / "mfsmaster.cfg"), "-f"],
                               lay.root / "mfsmaster.log")
        self.master.start()
        master = self.master
        self.master.wait_until(lambda: listening(master.pid, MASTER_PORTS["MATOCL"]),
                               "client port open")
        self.helpers = procs.children(master.pid)
        procs.STARTED.extend(("mfsmaster-helper", pid) for pid in self.helpers)
        for i in range(lay.chunkservers):
            cs = _Process(f"mfschunkserver-{i}", [
                *self._in_namespace(), "mfschunkserver", "-c",
                str(lay.etc / f"mfschunkserver{i}.cfg"), "-f"], lay.root / f"mfschunkserver{i}.log")
            cs.start()
            self.chunkservers.append(cs)
        want = {lay.chunkserver_port(i) for i in range(lay.chunkservers)}
        self.master.wait_until(lambda: want <= registered_ports(master.log_text()),
                               f"registration of {lay.chunkservers} chunkservers")
        for cs in self.chunkservers:  # each disk scanned: its space is known to the master
            cs.wait_until(lambda c=cs: "complete" in c.log_text(), "disk scan")
        self.mount()
        self._set_goal()
        return self

    def _make_namespace(self) -> None:
        remove_stale_namespaces(NAMESPACE.format(pid=r"(\d+)"))
        _run("ip", "netns", "add", self.namespace)
        self.made_namespace = True
        _run("ip", "-n", self.namespace, "link", "set", "lo", "up")
        _run("ip", "-n", self.namespace, "addr", "add", f"{self.layout.address}/32",
             "dev", "lo")

    def mount(self) -> None:
        """Start mfsmount in the foreground; ready once mounted and the chunkservers'
        space shows (the master places chunks only on servers that reported space)."""
        self.mounts += 1
        mnt = self.mnt
        self.client = _Process("mfsmount", [
            *self._network_only(), "mfsmount", str(mnt), "-f",
            "-H", self.layout.address, "-P", str(MASTER_PORTS["MATOCL"]),
            "-o", "mfsnice=0"], self.layout.root / f"mfsmount.{self.mounts}.log")
        self.client.start()
        self.client.wait_until(lambda: os.path.ismount(mnt) and os.statvfs(mnt).f_blocks > 0,
                               "mount with space")

    def _set_goal(self) -> None:
        self.tool("mfssetgoal", "-r", str(GOAL), str(self.mnt))
        out = self.tool("mfsgetgoal", str(self.mnt))
        if not out.strip().endswith(f": {GOAL}"):
            raise BenchError(f"MooseFS goal of {self.mnt} is not {GOAL}: {out.strip()}")

    def tool(self, *args: str) -> str:
        """A MooseFS client tool on the mount (it talks to mfsmount's master proxy, which
        listens in the namespace)."""
        done = subprocess.run([*self._network_only(), *args], capture_output=True, text=True,
                              timeout=60)
        if done.returncode != 0:
            raise BenchError(f"{' '.join(args)} failed: {done.stderr.strip() or done.stdout}")
        return done.stdout

    def copies(self, path: Path) -> dict[str, Any]:
        return parse_fileinfo(self.tool("mfsfileinfo", str(path)))

    # -- figures ----------------------------------------------------------------------------

    def pids(self) -> dict[str, int]:
        """Every MooseFS process by role, for CpuMeter."""
        out: dict[str, int] = {}
        if self.master is not None and self.master.popen is not None:
            out["mfsmaster"] = self.master.pid
            for n, pid in enumerate(self.helpers):
                out[f"mfsmaster-helper-{n}"] = pid
        for i, cs in enumerate(self.chunkservers):
            if cs.popen is not None:
                out[f"mfschunkserver-{i}"] = cs.pid
        if self.client is not None and self.client.popen is not None:
            out["mfsmount"] = self.client.pid
        return out

    def describe(self) -> dict[str, Any]:
        version = subprocess.run(["mfsmaster", "-v"], capture_output=True, text=True,
                                 timeout=10).stdout.strip()
        return {"version": version, "chunkservers": self.layout.chunkservers, "goal": GOAL,
                "address": self.layout.address, "namespace": self.namespace,
                "chunkserver_fsync_before_close": self.layout.fsync,
                "mount_options": ["mfsnice=0"], "nice_level": 0}

    # -- stop -------------------------------------------------------------------------------

    def unmount(self) -> None:
        """fusermount3 -u, then mfsmount exits by itself; made sure of by pid."""
        if self.client is None:
            return
        if os.path.ismount(self.mnt):
            subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True,
                           timeout=60, check=False)
        if self.client.popen is not None:
            try:
                self.client.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.client.stop(timeout=10)
        procs.unmount(self.mnt)  # lazily, if it is still there
        self.client = None

    def stop(self) -> None:
        """Everything this cluster started, in order; each step runs whatever the one
        before did. Never raises for a process that is already gone."""
        steps = [self.unmount, *(cs.stop for cs in self.chunkservers),
                 *([self.master.stop] if self.master else [])]
        for step in steps:
            try:
                step()
            except Exception:  # keep going: the namespace must go too
                log.exception("stopping MooseFS")
        left = [pid for pid in self.pids().values() if alive(pid)]
        if left:
            log.error("MooseFS processes %s outlived SIGTERM; killing them", left)
            kill_pids(left)
        if self.made_namespace:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True,
                               timeout=30)
            self.made_namespace = False

    def __enter__(self) -> MooseFs:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
