"""Keepalive pings and what servers accept of them (issue 16): a client's channel left idle
is pinged every keepalive interval, and the manager must take those pings without hanging
up (GOAWAY ENHANCE_YOUR_CALM "too_many_pings", which every process logged about 2 minutes
after it started). MOSAFS_GRPC_KEEPALIVE_MS shortens the interval for both ends, so that
10 seconds here show what a deployment sees after minutes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests import harness

KEEPALIVE = {"MOSAFS_GRPC_KEEPALIVE_MS": "1000"}
IDLE_S = 10

# A channel of mosafs.rpc.channels to the manager: one call, IDLE_S seconds with nothing
# but keepalive pings on the connection, then one more call.
CLIENT = """
import sys, time
from mosafs._proto import manager_pb2 as mpb
from mosafs._proto import manager_pb2_grpc as mgrpc
from mosafs.rpc.channels import channel
from mosafs.rpc.errors import call

with channel(sys.argv[1], identity=None) as ch:
    stub = mgrpc.ManagerStub(ch)
    call(stub.ListBenefactors, mpb.ListBenefactorsRequest(), timeout=10)
    time.sleep(float(sys.argv[2]))
    call(stub.ListBenefactors, mpb.ListBenefactorsRequest(), timeout=10)
print("both calls answered")
"""
PING_SENT = re.compile(r"\bPing \d+ sent\b")  # gRPC's http_keepalive trace
# A hang-up, and any error line of gRPC C-core (its debug lines, and a warning that debug
# logging is on, are what this test asks for).
HANG_UP = re.compile(r"GOAWAY|too_many_pings|ENHANCE_YOUR_CALM|^[EF]\d{4} ")


def _idle_client(address: str) -> subprocess.CompletedProcess[str]:
    # gRPC C-core logs the GOAWAY it receives (an E line); the trace shows every ping sent.
    env = {**os.environ, **KEEPALIVE, "GRPC_VERBOSITY": "debug", "GRPC_TRACE": "http_keepalive"}
    return subprocess.run([sys.executable, "-P", "-c", CLIENT, address, str(IDLE_S)],
                          env=env, capture_output=True, text=True, timeout=IDLE_S + 60)


def test_an_idle_channel_is_pinged_and_the_manager_accepts_it(tmp_path: Path) -> None:
    manager = harness.start("manager", ["manager", "--data-dir", str(tmp_path / "m"),
                                        "--listen", "127.0.0.1:0"], tmp_path / "procs",
                            env=KEEPALIVE)
    try:
        client = _idle_client(manager.address)
    finally:
        manager.stop()  # and its log holds no noise, GOAWAY included
    log = client.stderr
    assert client.returncode == 0 and "both calls answered" in client.stdout, log[-3000:]
    pings = len(PING_SENT.findall(log))
    assert pings >= IDLE_S // 2, f"{pings} keepalive pings in {IDLE_S} s idle:\n{log[-3000:]}"
    hang_ups = [line for line in log.splitlines() if HANG_UP.search(line)]
    assert not hang_ups, "the manager hung up on an idle client:\n" + "\n".join(hang_ups)


def test_a_bad_keepalive_setting_is_a_one_line_error(tmp_path: Path) -> None:
    done = harness.cli("status", "--manager", "127.0.0.1:1", "--insecure",
                       env={"MOSAFS_GRPC_KEEPALIVE_MS": "soon"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "mosafs status: MOSAFS_GRPC_KEEPALIVE_MS must be 100..3600000 milliseconds, "
        "got 'soon'"], done.stderr
