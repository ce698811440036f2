"""A private etcd process: for the tests, and for `mosafs up --managers N` on one machine.

A real deployment runs etcd as a service of its own (three or five members on separate
hosts) and gives the managers its endpoints. Here one member listens on free loopback
ports; its data directory may be reused by a later start (etcd keeps the member's
identity there and accepts new ports).

The etcd process must never outlive whoever started it, even one killed with SIGKILL:
a leftover etcd would hold its ports and data directory and keep granting leases. It is
started through a tiny launcher that asks the kernel to send it SIGTERM when its parent
dies (prctl PR_SET_PDEATHSIG, which survives exec) and then execs etcd; no preexec_fn,
which is unsafe in a process with threads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from etcd3gw import exceptions as etcd_exceptions
from etcd3gw.client import Etcd3Client

from mosafs.coordination.gateway import CoordinationUnavailable
from mosafs.errors import ConfigError
from mosafs.procutil import free_port

log = logging.getLogger("mosafs.coordination")

DEFAULT_BINARY = "/usr/bin/etcd"
DEBIAN_PACKAGE = "etcd-server"
_PORT_TRIES = 5

# Runs as `python -I -S -c LAUNCHER PARENT_PID ETCD ARGS...`. The parent may have died
# before prctl took effect: then getppid() is no longer PARENT_PID, and it gives up.
_LAUNCHER = """\
import ctypes, os, signal, sys
if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM) != 0:  # PR_SET_PDEATHSIG
    sys.exit("prctl(PR_SET_PDEATHSIG) failed")
if os.getppid() != int(sys.argv[1]):
    sys.exit("parent already gone")
os.execv(sys.argv[2], sys.argv[2:])
"""


class EtcdNotFound(ConfigError):
    """The etcd binary is not installed."""


def find_etcd(binary: str | None = None) -> str:
    """The etcd binary to run: BINARY if given, else /usr/bin/etcd or `etcd` on PATH;
    EtcdNotFound naming the Debian package otherwise."""
    candidates = [binary] if binary else [DEFAULT_BINARY, shutil.which("etcd")]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    where = binary or f"{DEFAULT_BINARY} (nor `etcd` on PATH)"
    raise EtcdNotFound(f"etcd is not installed: no {where}. Install the Debian package "
                       f"{DEBIAN_PACKAGE} (apt-get install {DEBIAN_PACKAGE}; "
                       "scripts/setup.sh does) or give the path of an etcd 3.4+ binary")


def die_with_parent(argv: list[str]) -> list[str]:
    """ARGV wrapped so that the program gets SIGTERM when this process dies. The kernel
    ties PR_SET_PDEATHSIG to the *thread* that forked: start the child from a thread that
    lives as long as the process (the main thread)."""
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), *argv]


class EtcdServer:
    """One etcd member on loopback, started by start() (or `with`), stopped by stop().

    `endpoint` is its client URL (http://127.0.0.1:PORT), for Coordinator's endpoints.
    """

    def __init__(self, data_dir: Path | str, *, name: str = "mosafs",
                 log_path: Path | str | None = None, binary: str | None = None,
                 host: str = "127.0.0.1", client_port: int = 0,
                 start_timeout: float = 30.0) -> None:
        self.binary = find_etcd(binary)
        self.data_dir = Path(data_dir)
        self.name = name
        self.log_path = Path(log_path) if log_path else self.data_dir / "etcd.log"
        self.host = host
        self.start_timeout = start_timeout
        self._client_port = client_port
        self.client_port = 0
        self.peer_port = 0
        self.attempts = 0  # starts it took (more than one after a port race)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    # -- what callers use -----------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def endpoints(self) -> list[str]:
        return [self.endpoint]

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> EtcdServer:
        """Start etcd and wait until it answers a read; CoordinationUnavailable (with the
        end of its log) when it does not within start_timeout."""
        if self.alive():
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)  # etcd warns about a data directory others can read
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(_PORT_TRIES):
            self.attempts += 1
            self.client_port = self._client_port or free_port(self.host)
            self.peer_port = free_port(self.host)
            if self._try_start():
                log.info("etcd %s serving at %s (pid %d, data %s)", self.name, self.endpoint,
                         self.pid, self.data_dir)
                return self
            if self._client_port:
                break  # a fixed port that is taken stays taken
        raise CoordinationUnavailable(f"etcd could not bind its ports after {self.attempts} "
                                      f"tries; the end of {self.log_path}:\n{self._log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after TIMEOUT seconds; returns once the process is gone."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("etcd %s ignored SIGTERM for %.0f s: killing it", self.name,
                            timeout)
                proc.kill()
                proc.wait()
        log.info("etcd %s stopped (exit status %s)", self.name, proc.returncode)

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- starting -------------------------------------------------------------------------

    def _command(self) -> list[str]:
        client_url = f"http://{self.host}:{self.client_port}"
        peer_url = f"http://{self.host}:{self.peer_port}"
        return [
            self.binary, "--name", self.name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"{self.name}={peer_url}",
            "--initial-cluster-token", f"mosafs-{self.name}",
            "--initial-cluster-state", "new",
            # zap: one JSON line per record (capnslog, 3.4's default, is deprecated).
            "--logger", "zap", "--log-outputs", "stderr",
        ]

    def _try_start(self) -> bool:
        """One start on the ports chosen: True once etcd answers, False if it lost a port
        race (it exited with "address already in use")."""
        with open(self.log_path, "ab") as log_file:
            self._log_offset = log_file.tell()  # this start's lines begin here
            # Its own session: a Ctrl-C meant for `mosafs up` must not stop etcd before
            # the managers have stepped down.
            self._proc = subprocess.Popen(die_with_parent(self._command()),
                                          stdin=subprocess.DEVNULL, stdout=log_file,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if self._wait_ready():
                return True
        except BaseException:
            self.stop()  # interrupted (Ctrl-C): leave no etcd behind
            raise
        if self._proc is not None and self._proc.poll() is not None:
            return self._exited()
        self.stop()
        raise CoordinationUnavailable(f"etcd did not answer within {self.start_timeout:.0f} s; "
                                      f"the end of {self.log_path}:\n{self._log_tail()}")

    def _wait_ready(self) -> bool:
        """Whether etcd answered before it exited or start_timeout ran out."""
        deadline = time.monotonic() + self.start_timeout
        client = Etcd3Client(host=self.host, port=self.client_port, timeout=1.0,
                             api_path="/v3/")
        try:
            while time.monotonic() < deadline and self.alive():
                if self._answers(client):
                    return True
                time.sleep(0.05)
        finally:
            client.session.close()
        return False

    @staticmethod
    def _answers(client: Etcd3Client) -> bool:
        """Whether etcd serves a linearizable read: it has elected itself leader."""
        try:
            client.get("/mosafs-ready")
        except (etcd_exceptions.Etcd3Exception, OSError, ValueError):
            # OSError: requests' errors are OSErrors; ValueError: a half-written answer.
            return False
        return True

    def _exited(self) -> bool:
        assert self._proc is not None
        code, self._proc = self._proc.wait(), None
        tail = self._log_tail()
        if "address already in use" in self._this_start_log():
            log.info("etcd lost a race for port %d or %d; trying others", self.client_port,
                     self.peer_port)
            return False
        raise CoordinationUnavailable(f"etcd exited with status {code} at start; the end of "
                                      f"{self.log_path}:\n{tail}")

    def _this_start_log(self) -> str:
        with contextlib.suppress(OSError), open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            return f.read().decode(errors="replace")
        return ""

    def _log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""
