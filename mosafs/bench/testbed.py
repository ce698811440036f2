"""A cluster for the storage benchmarks: a manager, N benefactors and the writers, either on
loopback or behind emulated links.

With links (`Links(rate_bit=..., mode="netns")`), the benchmark makes a network of its
own out of Linux network namespaces and touches nothing else:

    namespace  mbench-PID-c        the manager and every writer (its loopback, and one
                                   end of each link)
    namespace  mbench-PID-bI       benefactor I, behind its link
    link I     veth pair mbPIDcI <-> mbPIDbI, 10.213.I.1/30 <-> 10.213.I.2/30, each end
               shaped by a tc token-bucket filter (tbf) to RATE: a benefactor's NIC

With `peers=True` the client namespace also routes between the links (IP forwarding on,
each benefactor's default route through its link), so benefactors reach each other as
peers do in a cluster (replication, fragment repair): a transfer from benefactor I to J
crosses link I (I's upload) and link J (J's download), each shaped to RATE.

Every address lives inside those namespaces; the host's network is not touched. Deleting
a namespace deletes its end of the links, so `close()` stops the processes and deletes the
namespaces, whatever happened; namespaces left by a run that was killed (their PID no
longer runs) are deleted at the next start. Needs root and iproute2 (`ip`, `tc`).

Where namespaces cannot be made (no root, no iproute2: some GPU machines), `mode=
"ratelimit"` emulates each benefactor's link on its side instead: everything runs on
127.0.0.1 and every benefactor takes chunk bytes no faster than RATE (`mosafs benefactor
--ingest-rate`, a FIFO link model). It shapes the direction writes use; reads are not
limited. Without links everything runs on 127.0.0.1, as the tests do.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mosafs.bench.procs import BenchError, Daemon, alive, kill_pids, log
from mosafs.procutil import python_command

PREFIX = "mbench-"
SUBNET = "10.213"
RATE_1GBIT = 1_000_000_000


@dataclass(frozen=True)
class Links:
    """Each benefactor behind its own link of RATE_BIT bits/s in both directions."""

    rate_bit: int = RATE_1GBIT
    mode: str = "netns"  # netns | ratelimit
    burst_bytes: int = 512 * 1024  # tbf needs a bucket of rate/HZ at least
    latency_ms: int = 20
    # TCP congestion control in every namespace (netns), or "" for the host's default.
    # BBR over these tbf links stalled single connections for 1-2 s at a time (a fifth of
    # the link used while nothing else competed), a loss-based one does not
    # (docs/benchmarks.md, "Pairs, and the links' congestion control"); a namespace may
    # take any of the host's net.ipv4.tcp_allowed_congestion_control, which always has
    # reno.
    congestion: str = ""


def client_link(device: str) -> str | None:
    """The link index of DEVICE if it is a link's end in the client namespace (named
    `mb{tag}c{i}` by Testbed), else None."""
    match = re.fullmatch(r"mb\d+c(\d+)", device)
    return match.group(1) if match else None


def links_unavailable() -> str | None:
    """Why emulated links cannot be made here, or None."""
    if os.geteuid() != 0:
        return "emulated links need root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"emulated links need iproute2 ({tool} is not installed)"
    return None


def _tcp_setting(name: str) -> list[str]:
    """The words of /proc/sys/net/ipv4/NAME ([] where it cannot be read)."""
    try:
        return Path("/proc/sys/net/ipv4", name).read_text().split()
    except OSError:
        return []


def allowed_congestion() -> list[str]:
    """The congestion controls a network namespace may choose here."""
    return _tcp_setting("tcp_allowed_congestion_control")


def host_congestion() -> str:
    """The host's default congestion control (what new namespaces start with)."""
    return " ".join(_tcp_setting("tcp_congestion_control")) or "unknown"


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} failed: {done.stderr.strip() or done.returncode}")


def remove_stale_namespaces(pattern: str = rf"{PREFIX}(\d+)-(c|b\d+)") -> None:
    """Namespaces of earlier runs whose process is gone: names that PATTERN matches in
    full, its first group the run's PID (mosafs.bench.moosefs passes its own)."""
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    for line in done.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = re.fullmatch(pattern, name)
        if match and not alive(int(match.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


class Testbed:
    """Start with `Testbed(...).start()`; always `close()` (a context manager does)."""

    def __init__(self, workdir: Path, benefactors: int, *, links: Links | None = None,
                 manager_args: tuple[str, ...] = (), peers: bool = False) -> None:
        self.workdir = workdir
        self.count = benefactors
        self.links = links
        self.manager_args = manager_args
        self.peers = peers  # netns: benefactors reach each other (through the client ns)
        self.tag = str(os.getpid())
        self.namespaces: list[str] = []
        self.manager: Daemon | None = None
        self.benefactors: list[Daemon] = []
        self.address = ""  # the manager, as writers reach it

    # -- namespaces ----------------------------------------------------------------------

    @property
    def netns(self) -> bool:
        return self.links is not None and self.links.mode == "netns"

    @property
    def client_ns(self) -> str | None:
        return f"{PREFIX}{self.tag}-c" if self.netns else None

    def prefix(self, ns: str | None) -> list[str]:
        """Command prefix that runs a program in namespace NS (nothing without links)."""
        return ["ip", "netns", "exec", ns] if ns else []

    def _make_network(self) -> None:
        assert self.links is not None and self.client_ns is not None
        reason = links_unavailable()
        if reason:
            raise BenchError(reason)
        remove_stale_namespaces()
        c = self.client_ns
        _run("ip", "netns", "add", c)
        self.namespaces.append(c)
        _run("ip", "-n", c, "link", "set", "lo", "up")
        for i in range(self.count):
            b = f"{PREFIX}{self.tag}-b{i}"
            _run("ip", "netns", "add", b)
            self.namespaces.append(b)
            _run("ip", "-n", b, "link", "set", "lo", "up")
            here, there = f"mb{self.tag}c{i}"[:15], f"mb{self.tag}b{i}"[:15]
            _run("ip", "link", "add", here, "type", "veth", "peer", "name", there)
            _run("ip", "link", "set", here, "netns", c)
            _run("ip", "link", "set", there, "netns", b)
            for ns, dev, host in ((c, here, 1), (b, there, 2)):
                _run("ip", "-n", ns, "addr", "add", f"{SUBNET}.{i}.{host}/30", "dev", dev)
                _run("ip", "-n", ns, "link", "set", dev, "up")
                _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root",
                     "tbf", "rate", f"{self.links.rate_bit}bit",
                     "burst", str(self.links.burst_bytes),
                     "latency", f"{self.links.latency_ms}ms")
            if self.peers:
                _run("ip", "-n", b, "route", "add", "default", "via", f"{SUBNET}.{i}.1")
        if self.peers:
            _run("ip", "netns", "exec", c, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        if self.links.congestion:
            self._set_congestion(self.links.congestion)

    def _set_congestion(self, name: str) -> None:
        allowed = allowed_congestion()
        if name not in allowed:
            raise BenchError(f"congestion control {name!r} is not allowed in a network "
                             f"namespace here (net.ipv4.tcp_allowed_congestion_control: "
                             f"{' '.join(allowed) or 'unreadable'})")
        for ns in self.namespaces:
            _run("ip", "netns", "exec", ns, "sysctl", "-qw",
                 f"net.ipv4.tcp_congestion_control={name}")

    # -- processes -----------------------------------------------------------------------

    def _daemon(self, name: str, ns: str | None, args: list[str]) -> Daemon:
        ready = self.workdir / f"{name}.ready.json"
        # Plaintext: the benchmarks measure the storage path (docs/benchmarks.md).
        return Daemon(name, [*self.prefix(ns), *python_command(
                                 "mosafs", *args, "--ready-file", str(ready),
                                 "--log-level", "WARNING", "--insecure")],
                      ready, self.workdir / f"{name}.log")

    def start(self) -> Testbed:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.netns:
            self._make_network()
        listen = "0.0.0.0:0" if self.netns else "127.0.0.1:0"
        self.manager = self._daemon("manager", self.client_ns, [
            "manager", "--data-dir", str(self.workdir / "manager"), "--listen", listen,
            "--replication", "1", *self.manager_args])
        ready = self.manager.start()
        port = int(ready["address"].rsplit(":", 1)[1])
        self.address = f"127.0.0.1:{port}"
        limit = []
        if self.links is not None and self.links.mode == "ratelimit":
            limit = ["--ingest-rate", str(self.links.rate_bit // 8)]
        for i in range(self.count):
            ns = f"{PREFIX}{self.tag}-b{i}" if self.netns else None
            where = f"{SUBNET}.{i}" if self.netns else None
            daemon = self._daemon(f"benefactor-{i}", ns, [
                "benefactor", "--data-dir", str(self.workdir / f"b{i}"),
                "--listen", f"{where}.2:0" if where else "127.0.0.1:0",
                "--manager", f"{where}.1:{port}" if where else self.address,
                "--scrub-rate", "0", *limit])
            daemon.start()
            self.benefactors.append(daemon)
        self._wait_registered()
        return self

    def _wait_registered(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.status()["benefactors"]) < self.count or not all(
                b["alive"] for b in self.status()["benefactors"]):
            if time.monotonic() > deadline:
                raise BenchError(f"benefactors did not register: {self.status()}")
            time.sleep(0.1)

    def admin(self, *args: str) -> Any:
        """`mosafs ARGS --manager ADDRESS --json` run where the writers run."""
        cmd = [*self.prefix(self.client_ns), *python_command(
            "mosafs", *args, "--manager", self.address, "--json", "--insecure")]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise BenchError(f"mosafs {' '.join(args)}: {done.stderr.strip()}")
        return json.loads(done.stdout)

    def status(self) -> dict[str, Any]:
        return dict(self.admin("status"))

    def stored_bytes(self) -> int:
        """Bytes of chunk files on every benefactor's disk."""
        return sum(p.stat().st_size for i in range(self.count)
                   for p in (self.workdir / f"b{i}" / "chunks").glob("*/*/*") if p.is_file())

    def pids(self) -> dict[str, int]:
        out = {d.name: d.pid for d in self.benefactors if d.popen is not None}
        if self.manager is not None and self.manager.popen is not None:
            out["manager"] = self.manager.pid
        return out

    # -- the end -------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every process (benefactors, then the manager), delete the namespaces."""
        for daemon in [*self.benefactors, *([self.manager] if self.manager else [])]:
            try:
                daemon.stop(timeout=30)
            except Exception:  # keep cleaning up: the namespaces must go
                log.exception("stopping %s", daemon.name)
        kill_pids([pid for pid in self.pids().values() if alive(pid)])
        for ns in reversed(self.namespaces):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.namespaces.clear()

    def __enter__(self) -> Testbed:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
