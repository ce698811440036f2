"""The manager at scale (issue 21 point 3): a real `mosafs manager` on a synthetic store of
10 million chunk records and 1 million files (mosafs.bench.synthetic, written straight into
LMDB), measured for what a large campaign leaves behind:

- idle CPU: the manager's CPU (/proc, user + system) over IDLE_S with nothing to do but
  heartbeats and its background loops (the safety-net scan included), as a share of one
  core; target under 5 %;
- status latency: GetClusterStatus (what `mosafs status` asks) answered, p50/p99 over
  STATUS_CALLS calls; target under 100 ms;
- failure reaction: one benefactor stops (its heartbeats and its server); the time from
  the manager declaring it dead (GetClusterStatus polled every POLL_S) to the first copy
  request (ReplicateChunks) any surviving benefactor receives; target within 1 s. The
  manager acts on the death the moment the lease lapses, which can be before the poll
  that shows it returns, so the figure is taken from the start of the last poll that
  still showed the benefactor alive (the death came after that answer was made): an
  upper bound, never negative.

The benefactors are stand-ins in this process: one gRPC server each that registers with
the id the store names, sends heartbeats, and answers ReplicateChunks as a benefactor
that copied every chunk (nothing is stored: the manager's side is what is measured).
Everything is plaintext on loopback; every process is stopped at the end, whatever
happened.

    python -m mosafs.bench.manager_scale [--chunks N] [--files N] [--json] [--keep DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from mosafs._proto import benefactor_pb2 as bpb
from mosafs._proto import manager_pb2 as mpb
from mosafs._proto import manager_pb2_grpc as mgrpc
from mosafs.argtypes import bounded_int
from mosafs.bench import synthetic
from mosafs.bench.procs import BenchError, Daemon, kill_pids
from mosafs.bench.write import _work_dir, machine_info, progress
from mosafs.errors import MosafsError
from mosafs.procutil import python_command

BENEFACTORS = [f"syn-b{i}" for i in range(6)]
HEARTBEAT_S = 0.5
LEASE_S = 2.0
SETTLE_S = 10.0
IDLE_S = 30.0
COPY_WINDOW_S = 10.0  # copy requests counted after the death
STATUS_CALLS = 50
POLL_S = 0.02
REACTION_TIMEOUT_S = 60.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


class StandIn:
    """A benefactor stand-in: a server answering ReplicateChunks, and heartbeats."""

    def __init__(self, bid: str, manager: str) -> None:
        self.bid = bid
        self.first_copy: float | None = None
        self.copies = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "mosafs.v1.Benefactor", {"ReplicateChunks": grpc.unary_unary_rpc_method_handler(
                self._replicate, request_deserializer=bpb.ReplicateChunksRequest.FromString,
                response_serializer=bpb.ReplicateChunksResponse.SerializeToString)}),))
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.address = f"127.0.0.1:{port}"
        self._channel = grpc.insecure_channel(manager)
        self._stub = mgrpc.ManagerStub(self._channel)
        self._stub.RegisterBenefactor(mpb.RegisterBenefactorRequest(info=self._info()),
                                      timeout=60)
        self._beats = threading.Thread(target=self._beat, daemon=True)
        self._beats.start()

    def _info(self) -> bpb.BenefactorInfo:
        return bpb.BenefactorInfo(id=self.bid, address=self.address, capacity_bytes=1 << 50,
                                  free_bytes=1 << 49)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._stub.Heartbeat(mpb.HeartbeatRequest(info=self._info()), timeout=10)
            except grpc.RpcError:
                continue  # the manager is busy or stopping: the next beat tries again

    def _replicate(self, request: bpb.ReplicateChunksRequest, context: Any
                   ) -> bpb.ReplicateChunksResponse:
        with self._lock:
            if self.first_copy is None:
                self.first_copy = time.monotonic()
            self.copies += len(request.ids)
        return bpb.ReplicateChunksResponse(copied=[True] * len(request.ids),
                                           errors=[""] * len(request.ids))

    def stop(self) -> None:
        self._stop.set()
        self._server.stop(0)
        self._channel.close()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def run_scale(*, chunks: int, files: int, keep: Path | None = None,
              idle_s: float = IDLE_S) -> dict[str, Any]:
    out: dict[str, Any] = {
        "benchmark": "manager at scale (mosafs.bench.manager_scale)",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "params": {"chunks": chunks, "files": files, "benefactors": len(BENEFACTORS),
                   "replication": 2, "heartbeat_s": HEARTBEAT_S, "lease_s": LEASE_S,
                   "idle_s": idle_s},
    }
    with _work_dir(keep, prefix="mosafs-bench-manager-scale-") as workdir:
        data = workdir / "manager"
        progress(f"generating {chunks} chunk records and {files} files")
        out["generated"] = synthetic.generate(data, chunks=chunks, files=files,
                                              benefactors=BENEFACTORS, replication=2,
                                              progress=progress)
        manager = Daemon("manager", python_command(
            "mosafs", "manager", "--data-dir", str(data), "--listen", "127.0.0.1:0",
            "--insecure", "--heartbeat-interval", str(HEARTBEAT_S), "--benefactor-lease",
            str(LEASE_S), "--log-level", "WARNING", "--ready-file",
            str(workdir / "manager.ready")), workdir / "manager.ready", workdir / "manager.log")
        stand_ins: list[StandIn] = []
        started = time.monotonic()
        try:
            address = manager.start(timeout=600)["address"]
            out["manager_start_s"] = round(time.monotonic() - started, 2)
            progress(f"manager ready in {out['manager_start_s']} s; benefactors joining")
            stand_ins = [StandIn(bid, address) for bid in BENEFACTORS]
            out.update(_measure(manager.pid, address, stand_ins, idle_s))
        finally:
            for s in stand_ins:
                s.stop()
            if manager.popen is not None and manager.popen.poll() is None:
                kill_pids([manager.pid])
    out["targets"] = _targets(out)
    return out


def _measure(pid: int, address: str, stand_ins: list[StandIn], idle_s: float
             ) -> dict[str, Any]:
    window = min(COPY_WINDOW_S, idle_s)  # short runs (tests) wait less everywhere
    time.sleep(min(SETTLE_S, idle_s))
    progress(f"idle for {idle_s:.0f} s")
    cpu0, t0 = _cpu_s(pid), time.monotonic()
    time.sleep(idle_s)
    idle = (_cpu_s(pid) - cpu0) / (time.monotonic() - t0)
    with grpc.insecure_channel(address) as channel:
        stub = mgrpc.ManagerStub(channel)
        latencies = []
        for _ in range(STATUS_CALLS):
            began = time.monotonic()
            status = stub.GetClusterStatus(mpb.ClusterStatusRequest(), timeout=30)
            latencies.append((time.monotonic() - began) * 1000)
        progress("one benefactor stops")
        victim, survivors = stand_ins[1], [s for s in stand_ins if s is not stand_ins[1]]
        stopped = time.monotonic()
        victim.stop()
        detected, alive_until = _wait_dead(stub, victim.bid, stopped)
        first = _wait_first_copy(survivors, detected, window)
    latencies.sort()
    return {
        "chunks_in_status": status.chunks,
        "idle_cpu_share": round(idle, 4),
        "status_ms": {"p50": round(statistics.median(latencies), 2),
                      "p99": round(latencies[int(0.99 * (len(latencies) - 1))], 2),
                      "max": round(latencies[-1], 2)},
        "failure": {"detection_s": round(detected - stopped, 3),
                    "first_copy_after_detection_s": round(first - alive_until, 3),
                    "copy_window_s": window,
                    "chunks_copied_in_window": sum(s.copies for s in survivors)},
    }


def _wait_dead(stub: Any, bid: str, stopped: float) -> tuple[float, float]:
    """(when a poll first showed BID dead, when the last poll that showed it alive was
    sent: the manager declared the death after that, STOPPED at the earliest)."""
    deadline = time.monotonic() + REACTION_TIMEOUT_S
    alive_until = stopped
    while time.monotonic() < deadline:
        sent = time.monotonic()
        status = stub.GetClusterStatus(mpb.ClusterStatusRequest(), timeout=30)
        if any(b.info.id == bid and not b.alive for b in status.benefactors):
            return time.monotonic(), alive_until
        alive_until = sent
        time.sleep(POLL_S)
    raise BenchError(f"benefactor {bid} not declared dead {REACTION_TIMEOUT_S:.0f} s after "
                     f"it stopped")


def _wait_first_copy(survivors: list[StandIn], detected: float, window: float) -> float:
    """When the first copy request came; returns WINDOW seconds after the death was seen
    (the copies asked meanwhile are counted)."""
    deadline = detected + REACTION_TIMEOUT_S
    while time.monotonic() < deadline:
        firsts = [s.first_copy for s in survivors if s.first_copy is not None]
        if firsts:
            time.sleep(max(0.0, detected + window - time.monotonic()))
            return min(firsts)
        time.sleep(POLL_S)
    raise BenchError(f"no copy asked for {REACTION_TIMEOUT_S:.0f} s after the death")


def _targets(out: dict[str, Any]) -> dict[str, Any]:
    if "idle_cpu_share" not in out:
        return {}
    reaction = out["failure"]["first_copy_after_detection_s"]
    return {
        "idle_cpu_under_5pct": {"value": out["idle_cpu_share"], "pass":
                                out["idle_cpu_share"] < 0.05},
        "rereplication_within_1s": {"value": reaction, "pass": reaction <= 1.0},
        "status_under_100ms": {"value": out["status_ms"]["p99"], "pass":
                               out["status_ms"]["p99"] < 100},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m mosafs.bench.manager_scale",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=bounded_int(1, 100_000_000), default=10_000_000)
    parser.add_argument("--files", type=bounded_int(1, 10_000_000), default=1_000_000)
    parser.add_argument("--idle-s", type=bounded_int(1, 3600), default=int(IDLE_S))
    parser.add_argument("--keep", type=Path, help="keep the work directory here")
    parser.add_argument("--json", action="store_true", help="print the JSON result")
    args = parser.parse_args(argv)
    if args.files > args.chunks:
        parser.error("--files must not exceed --chunks (each file has at least one chunk)")
    try:
        result = run_scale(chunks=args.chunks, files=args.files, keep=args.keep,
                           idle_s=args.idle_s)
    except (BenchError, MosafsError) as exc:
        print(f"manager_scale: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else json.dumps(result["targets"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
