"""Rebuild time of one benefactor's data against the number of surviving benefactors
(issue 19 point 7, the rebuild part; docs/erasure_pools.md, "Repair"):
`run_rebuild(...)` returns JSON-able figures.

Each case is a cluster of its own (mosafs.bench.testbed): a manager and benefactors each
behind an emulated link of RATE (netns: a veth pair shaped by tc tbf in both directions,
`peers=True` so that benefactors reach each other through the client namespace, every
transfer crossing the sender's link and the receiver's; ratelimit where namespaces cannot
be made: only what a benefactor takes in is shaped). An `ec:K+M` pool is written with new
data (the benchmark writer, mosafs.bench.writer; fixed-size chunks, no dedupe) sized so
that every benefactor holds about DEAD_MIB of fragments; then benefactor 0 is SIGKILLed.
A watcher in the client namespace polls the manager every POLL_S and records when the
benefactor is declared dead (its lease) and when every coded chunk has K+M live fragments
again (`mosafs status`: nothing short, figures made after the death). The rebuild time is
the span between the two: the lease is a setting, not rebuilding. Over the steady middle
of each rebuild, `links` has each link's use from the veths' byte counters and
`in_wire_use` everything each benefactor's link passed inbound (the ACKs of what it sends
included) as the link's token bucket counts it, every segment's headers included (tc's
counts; the veths see one set of headers per offloaded packet, so they understate how
full a link is).

Fairness: every case loses the same amount of data (DEAD_MIB), through the same links,
with the same rebuild machinery; what changes is how many benefactors share the work.

- `ec:1+1`, 2 survivors vs 6 survivors: the same code both times. With two survivors it
  is the widest code that full redundancy can be restored to (K+M must fit on distinct
  survivors), so it is the one code both cases can run: each lost fragment costs one
  transfer (a survivor's fragment to a survivor without one), which two survivors carry
  over two links and six over six; perfect spreading gives 3x.
- `ec:2+1`, 2 survivors + a replacement vs 6 survivors: with two survivors the classic
  RAID way, every lost fragment rebuilt onto one replacement benefactor (a hot spare that
  joined the pool before the failure: it holds nothing, so every rebuilt fragment goes to
  it), against six survivors declustered (each chunk on 3 of 7, rebuilt on whichever
  survivor holds none of it). A rebuild reads K = 2 fragments and writes one: 2 transfers
  per lost fragment (one of them local to the rebuilder); with a replacement they all
  funnel into its link, with six survivors they spread over six.

The target (issue 19): with 6 survivors, rebuilding a dead benefactor's data at least 3x
faster than with 2 (`targets`, on each comparison).

The emulated hosts use reno, a loss-based TCP congestion control as Linux's default
(cubic) is, whatever the host's default (`--congestion`; docs/benchmarks.md, "Pairs, and
the links' congestion control").

Not wired into `mosafs bench`: run it as `python -m mosafs.bench.ec_rebuild [--dead-mib N]
[--rate-mbit R] [--links netns|ratelimit] [--congestion NAME|host] [--keep DIR]` (root
for netns).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mosafs.argtypes import bounded_int
from mosafs.bench.procs import BenchError, _record, kill_pids
from mosafs.bench.storage import Writers
from mosafs.bench.testbed import (
    RATE_1GBIT,
    Links,
    Testbed,
    client_link,
    host_congestion,
    links_unavailable,
)
from mosafs.bench.workloads import MAX_SIZE, Workload
from mosafs.bench.write import _work_dir, machine_info, progress
from mosafs.errors import MosafsError
from mosafs.procutil import python_command

MiB = 1 << 20
POLL_S = 0.02
TIMEOUT_S = 900.0
LEASE_S = 1.0
BIN_S = 0.25  # bins of link traffic: a quarter second
# The links' TCP congestion control: loss-based, as Linux's default (cubic) is. The host
# here defaults to BBR, which over tbf links stalled connections for seconds at random
# (docs/benchmarks.md, "Pairs, and the links' congestion control"); a namespace may always
# take reno.
CONGESTION = "reno"
_S = TypeVar("_S")  # a sample's counts


@dataclass(frozen=True)
class Case:
    name: str
    redundancy: str          # "ec:K+M"
    survivors: int           # benefactors alive after the failure, the replacement aside
    replacement: bool = False  # one more benefactor, empty, joins before the failure


CASES = (
    Case("ec:1+1, 2 survivors", "ec:1+1", 2),
    Case("ec:1+1, 6 survivors", "ec:1+1", 6),
    Case("ec:2+1, 2 survivors + 1 replacement", "ec:2+1", 2, replacement=True),
    Case("ec:2+1, 6 survivors", "ec:2+1", 6),
)
COMPARISONS = (("ec:1+1", CASES[0].name, CASES[1].name),
               ("ec:2+1", CASES[2].name, CASES[3].name))


def _code(redundancy: str) -> tuple[int, int]:
    k, m = redundancy.removeprefix("ec:").split("+")
    return int(k), int(m)


def run_rebuild(*, dead_mib: int = 64, rate_bit: int = RATE_1GBIT, mode: str = "netns",
                chunk_mib: int = 1, cases: tuple[Case, ...] = CASES,
                keep: Path | None = None, congestion: str = CONGESTION) -> dict[str, Any]:
    """Rebuild every case; the figures (JSON-able), with the 6-vs-2 speedups. CONGESTION:
    the namespaces' TCP congestion control ("": the host's)."""
    if mode == "netns" and (reason := links_unavailable()):
        raise BenchError(f"{reason} (use mode='ratelimit')")
    links = Links(rate_bit=rate_bit, mode=mode,
                  congestion=congestion if mode == "netns" else "")
    out: dict[str, Any] = {
        "benchmark": "ec rebuild (mosafs.bench.ec_rebuild.run_rebuild)",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "params": {"dead_mib": dead_mib, "chunk_mib": chunk_mib, "benefactor_lease_s": LEASE_S,
                   "links": {"rate_bit_s": rate_bit, "per": "benefactor", "mode": mode,
                             "congestion": links.congestion or host_congestion()},
                   "units": "seconds; MB/s = 10^6 bytes/s"},
        "cases": [],
    }
    with _work_dir(keep, prefix="mosafs-bench-ec-rebuild-") as workdir:
        for i, case in enumerate(cases):
            progress(f"rebuild {i + 1}/{len(cases)}: {case.name}")
            out["cases"].append(_run_case(workdir / f"case-{i}", case, links, dead_mib,
                                          chunk_mib))
    out["comparisons"] = comparisons(out["cases"])
    return out


def comparisons(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """How much faster 6 survivors rebuild a dead benefactor's data than 2, per code
    (target: 3x). Compared by rate (bytes rebuilt per second): fragments are placed per
    chunk at random (docs/erasure_pools.md), so the dead benefactor's share is DEAD_MIB
    only on average; the rate is the time to rebuild the same amount."""
    by_name = {c["case"]: c for c in cases}
    out = {}
    for code, two, six in COMPARISONS:
        if two in by_name and six in by_name and by_name[two]["rebuilt_bytes"] \
                and by_name[two]["rebuild_s"] > 0 and by_name[six]["rebuild_s"] > 0:
            rate_two = by_name[two]["rebuilt_bytes"] / by_name[two]["rebuild_s"]
            ratio = by_name[six]["rebuilt_bytes"] / by_name[six]["rebuild_s"] / rate_two
            out[code] = {"two": two, "six": six, "speedup": round(ratio, 2), "target": 3.0,
                         "pass": ratio >= 3.0}
    return out


def _run_case(workdir: Path, case: Case, links: Links, dead_mib: int,
              chunk_mib: int) -> dict[str, Any]:
    k, m = _code(case.redundancy)
    members = case.survivors + 1  # in the pool when the data is written
    count = members + case.replacement
    chunk = chunk_mib * MiB
    # Each chunk stores (K+M)/K of its bytes, spread evenly over the pool's benefactors.
    size = -(-dead_mib * MiB * k * members // (k + m) // chunk) * chunk
    # Files of at most a workload's largest size (1 GiB), as many as that takes.
    files = -(-size // MAX_SIZE)
    size = -(-size // files // chunk) * chunk
    with Testbed(workdir, count, links=links, peers=True, manager_args=(
            "--gc-grace", "3600", "--heartbeat-interval", "0.25",
            "--benefactor-lease", str(LEASE_S), "--scan-interval", "3600",
            "--chunker", f"fixed:{chunk}")) as bed:
        if case.replacement:
            spare = bed.benefactors[-1].ready["id"]
            bed.admin("pool", "create", "spare")
            bed.admin("benefactor", "move", spare, "spare")
        bed.admin("pool", "set", "default", "--redundancy", case.redundancy,
                  "--ec-min-chunk", "0", "--stripe-width", str(members))
        run = Writers(bed, workdir).run({
            "hash_backend": "oracle", "content_addressing": False,
            "chunker": f"fixed:{chunk}", "folder": "rebuild", "name_template": "data.{step}",
            "workload": Workload("different", size, files,
                                 seed=f"rebuild {case.name}").to_json()})
        if run["errors"]:
            raise BenchError(f"{case.name}: the write failed: {run['errors']}")
        if case.replacement:  # a hot spare: in the pool, holding nothing, before the failure
            bed.admin("benefactor", "move", spare, "default")
        status = bed.status()
        if status["under_replicated_chunks"]:
            raise BenchError(f"{case.name}: not redundant before the failure: {status}")
        victim = bed.benefactors[0]
        held = next(b for b in status["benefactors"] if b["id"] == victim.ready["id"])
        watched = _watch(bed, workdir, victim.ready["id"], victim.pid)
    rebuilt = watched["rebuilt_bytes"]
    rebuild_s = watched["done"] - watched["detected"]
    return {
        "case": case.name, "redundancy": case.redundancy, "survivors": case.survivors,
        "replacement": case.replacement, "benefactors": count, "written_bytes": size,
        "dead_chunks_stored": held["chunks"], "dead_bytes_stored": held["stored_bytes"],
        "rebuilt_fragments": watched["rebuilt_fragments"], "rebuilt_bytes": rebuilt,
        "detection_s": round(watched["detected"] - watched["killed"], 3),
        "rebuild_s": round(rebuild_s, 3),
        "rebuild_mb_s": round(rebuilt / rebuild_s / 1e6, 1) if rebuild_s > 0 else None,
        "lost_chunks": watched["lost_chunks"],
        **phases(watched["timeline"], watched["detected"], watched["done"]),
        "links": link_use(watched["timeline"], watched["traffic"], links.rate_bit),
        "in_wire_use": wire_use(watched["timeline"], watched["wire"], links.rate_bit),
    }


def _watch(bed: Testbed, workdir: Path, victim: str, pid: int) -> dict[str, Any]:
    """SIGKILL the benefactor PID; the watcher's timings (time.monotonic(), the same clock
    in every namespace)."""
    out_path = workdir / "watch.json"
    ready = workdir / "watch.ready"
    log_path = workdir / "watch.log"
    with open(log_path, "wb") as log_file:
        popen = subprocess.Popen(
            [*bed.prefix(bed.client_ns), *python_command(
                "mosafs.bench.ec_rebuild", "watch", bed.address, victim, str(out_path),
                str(ready))], stdout=log_file, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
    _record("rebuild-watcher", popen.pid)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if popen.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the watcher did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        if popen.wait(timeout=TIMEOUT_S + 60) != 0 or not out_path.exists():
            raise BenchError(f"the watcher failed: {log_path.read_text()[-2000:]}")
    finally:
        if popen.poll() is None:
            kill_pids([popen.pid])
    result = dict(json.loads(out_path.read_text()))
    result["killed"] = killed
    return result


def watch(manager: str, victim: str, out_path: Path, ready: Path) -> None:
    """Poll the manager until VICTIM is dead and every coded chunk whole again (figures
    made after the death was noticed); write the timings to OUT_PATH."""
    from mosafs._proto import manager_pb2 as mpb
    from mosafs._proto import manager_pb2_grpc as mgrpc
    from mosafs.rpc.channels import channel

    with channel(manager, None) as ch:
        stub = mgrpc.ManagerStub(ch)
        stub.GetClusterStatus(mpb.ClusterStatusRequest(), timeout=30)
        ready.touch()
        started = time.monotonic()
        detected = None
        timeline: list[tuple[float, int]] = []  # (clock, bytes rebuilt) at each change
        links = _link_counters()
        traffic: list[tuple[float, dict[str, list[int]]]] = []  # (clock, link counters)
        wire: list[tuple[float, dict[str, int]]] = []  # (clock, tbf byte counts), per bin
        while True:
            status = stub.GetClusterStatus(mpb.ClusterStatusRequest(), timeout=30)
            now = time.monotonic()
            if links:
                traffic.append((now, _read_counters(links)))
                if not wire or now - wire[-1][0] >= BIN_S:
                    wire.append((now, _read_wire()))
            dead = not next(b.alive for b in status.benefactors if b.info.id == victim)
            if dead and detected is None:
                detected = now
            if not timeline or status.ec_rebuilt_bytes != timeline[-1][1]:
                timeline.append((now, status.ec_rebuilt_bytes))
            made = now - status.scanned_age_ms / 1000
            if (detected is not None and made > detected + 0.3 and status.ec_rebuilt_fragments
                    and not status.ec_short_chunks and not status.under_replicated_chunks):
                break
            if now - started > TIMEOUT_S:
                raise BenchError(f"not rebuilt {TIMEOUT_S:.0f}s after the failure: {status}")
            time.sleep(POLL_S)
    out_path.write_text(json.dumps({
        "detected": detected, "done": now, "rebuilt_fragments": status.ec_rebuilt_fragments,
        "rebuilt_bytes": status.ec_rebuilt_bytes, "lost_chunks": status.lost_chunks,
        "timeline": timeline, "traffic": traffic, "wire": wire}))


def _link_counters() -> dict[str, Path]:
    """The client namespace's ends of the benefactors' links (netns mode), by link index:
    what a link's end here receives is what its benefactor sends, and the reverse."""
    found = {}
    for dev in Path("/sys/class/net").glob("mb*"):
        if (link := client_link(dev.name)) is not None:
            found[link] = dev / "statistics"
    return found


def _read_wire() -> dict[str, int]:
    """Link index -> bytes its link has passed inbound, as the token bucket that shapes
    them counts them (the client namespace's tbf on the link's end here): every
    segment's headers included, where the veth's own counters see one set of headers per
    segmentation-offloaded packet. Empty where tc cannot say."""
    try:
        out = subprocess.run(["tc", "-s", "-j", "qdisc", "show"], capture_output=True,
                             text=True, timeout=5, check=True).stdout
        qdiscs = json.loads(out or "[]")
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}
    found = {}
    for q in qdiscs:
        link = client_link(str(q.get("dev", "")))
        if link is not None and q.get("kind") == "tbf":
            found[link] = int(q.get("bytes", 0))
    return found


def _read_counters(links: dict[str, Path]) -> dict[str, list[int]]:
    """Link index -> [bytes its benefactor sent, bytes it received] so far."""
    return {i: [int((stats / "rx_bytes").read_text()), int((stats / "tx_bytes").read_text())]
            for i, stats in links.items()}


def phases(timeline: list[tuple[float, int]], detected: float, done: float) -> dict[str, Any]:
    """Where a rebuild's time went: from the death declared to the first fragment
    recorded (`start_s`: finding the work, the first round of transfers), the rate
    between 10 % and 90 % of the bytes (`steady_mb_s`: the links' use once under way),
    and from the last fragment recorded to full redundancy seen (`tail_s`)."""
    moving = [(t, b) for t, b in timeline if b > 0]
    if not moving:
        return {"start_s": None, "steady_mb_s": None, "tail_s": None}
    total = moving[-1][1]
    low = next(p for p in moving if p[1] >= 0.1 * total)
    high = next(p for p in moving if p[1] >= 0.9 * total)
    steady = (high[1] - low[1]) / (high[0] - low[0]) / 1e6 if high[0] > low[0] else None
    return {"start_s": round(moving[0][0] - detected, 3),
            "steady_mb_s": round(steady, 2) if steady else None,
            "tail_s": round(done - moving[-1][0], 3)}


def _steady_window(timeline: list[tuple[float, int]]) -> tuple[float, float] | None:
    """The clocks at which 10 % and 90 % of the rebuilt bytes were recorded."""
    moving = [(t, b) for t, b in timeline if b > 0]
    if not moving:
        return None
    total = moving[-1][1]
    low = next(t for t, b in moving if b >= 0.1 * total)
    high = next(t for t, b in moving if b >= 0.9 * total)
    return (low, high) if high > low else None


def _steady_samples(timeline: list[tuple[float, int]], samples: list[tuple[float, _S]],
                    ) -> list[tuple[float, _S]] | None:
    """The non-empty SAMPLES taken within the steady window; None unless two of them span
    some time."""
    window = _steady_window(timeline)
    if window is None:
        return None
    inside = [(t, c) for t, c in samples if window[0] <= t <= window[1] and c]
    return inside if len(inside) >= 2 and inside[-1][0] > inside[0][0] else None


def link_use(timeline: list[tuple[float, int]], traffic: list[Any],
             rate_bit: int) -> dict[str, Any] | None:
    """Per link, over the steady window: the share of its capacity used in each direction
    (wire bytes: headers and framing included), and the share of BIN_S bins in which a
    direction carried under a quarter of its capacity (`idle`). None without netns links."""
    samples = _steady_samples(timeline, traffic)
    if samples is None:
        return None
    capacity = rate_bit / 8
    bins: list[tuple[float, dict[str, list[int]]]] = [samples[0]]
    for t, c in samples[1:]:
        if t - bins[-1][0] >= BIN_S:
            bins.append((t, c))
    out: dict[str, Any] = {}
    span = samples[-1][0] - samples[0][0]
    for link in samples[0][1]:
        use = []
        idle = []
        for d in (0, 1):
            moved = samples[-1][1][link][d] - samples[0][1][link][d]
            use.append(round(moved / capacity / span, 3))
            quiet = sum(1 for (t0, c0), (t1, c1) in itertools.pairwise(bins)
                        if (c1[link][d] - c0[link][d]) < 0.25 * capacity * (t1 - t0))
            idle.append(round(quiet / max(1, len(bins) - 1), 3))
        out[link] = {"out_use": use[0], "in_use": use[1], "out_idle": idle[0],
                     "in_idle": idle[1]}
    return out


def wire_use(timeline: list[tuple[float, int]], wire: list[tuple[float, dict[str, int]]],
             rate_bit: int) -> dict[str, float] | None:
    """Per link, over the steady window: the share of its inbound token bucket's capacity
    used (all it passed, headers of every segment included: what the bucket charges).
    None without tc's counts."""
    samples = _steady_samples(timeline, wire)
    if samples is None:
        return None
    (t0, first), (t1, last) = samples[0], samples[-1]
    capacity = rate_bit / 8 * (t1 - t0)
    return {link: round((last[link] - first[link]) / capacity, 3)
            for link in first if link in last}


def format_table(result: dict[str, Any]) -> str:
    rows = [f"{'case':<38} {'rebuilt':>10} {'time':>8} {'MB/s':>7} {'start':>7} "
            f"{'steady':>7} {'tail':>6}"]
    for c in result["cases"]:
        rows.append(f"{c['case']:<38} {c['rebuilt_bytes'] / MiB:>7.1f} MiB {c['rebuild_s']:>7.2f}s "
                    f"{c['rebuild_mb_s']:>7} {c['start_s']:>7} {c['steady_mb_s']:>7} "
                    f"{c['tail_s']:>6}")
    for code, comp in result["comparisons"].items():
        rows.append(f"{code}: 6 survivors {comp['speedup']}x faster than 2 (target 3x: "
                    f"{'pass' if comp['pass'] else 'FAIL'})")
    return "\n".join(rows)


def _pick(spec: str) -> tuple[Case, ...]:
    """The cases SPEC names ("1,2"), all for an empty SPEC."""
    if not spec:
        return CASES
    picked = []
    for part in spec.split(","):
        if not part.strip().isdigit() or not 1 <= int(part) <= len(CASES):
            raise ValueError(f"--cases: {part!r} is not a case number 1..{len(CASES)}")
        picked.append(CASES[int(part) - 1])
    return tuple(picked)


def main(argv: list[str]) -> int:
    if argv[:1] == ["watch"]:
        watch(argv[1], argv[2], Path(argv[3]), Path(argv[4]))
        return 0
    parser = argparse.ArgumentParser(prog="python -m mosafs.bench.ec_rebuild",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--dead-mib", type=bounded_int(1, 64 * 1024), default=64,
                        help="MiB of fragments the failed benefactor holds (default 64)")
    parser.add_argument("--rate-mbit", type=bounded_int(1, 100_000),
                        default=RATE_1GBIT // 1_000_000,
                        help="each benefactor's link, Mbit/s (default 1000; on a small "
                             "machine, slow enough that the links and not the CPUs limit "
                             "the rebuild: 20 on 2 cores)")
    parser.add_argument("--links", choices=["netns", "ratelimit"], default="netns")
    parser.add_argument("--chunk-mib", type=bounded_int(1, 64), default=1)
    parser.add_argument("--cases", default="",
                        help="comma-separated case numbers to run, from 1 (default: all: "
                             + "; ".join(f"{i + 1} {c.name}" for i, c in enumerate(CASES))
                             + ")")
    parser.add_argument("--congestion", default=CONGESTION, metavar="NAME",
                        help=f"TCP congestion control of the emulated hosts (netns; "
                             f"default {CONGESTION}; 'host': the host's default)")
    parser.add_argument("--keep", type=Path, help="keep the work directory here")
    parser.add_argument("--json", action="store_true", help="print the JSON result")
    args = parser.parse_args(argv)
    try:
        cases = _pick(args.cases)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        result = run_rebuild(dead_mib=args.dead_mib, rate_bit=args.rate_mbit * 1_000_000,
                             mode=args.links, chunk_mib=args.chunk_mib, cases=cases,
                             keep=args.keep,
                             congestion="" if args.congestion == "host" else args.congestion)
    except (BenchError, MosafsError) as exc:  # said in one message, no traceback
        print(f"ec_rebuild: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
