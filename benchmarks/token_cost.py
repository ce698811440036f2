"""What chunk access tokens cost end to end (docs/benchmarks.md, "The cost of chunk access
tokens"): write and read bandwidth through a mount of `mosafs up` (mutual TLS, 3
benefactors on loopback) with the manager issuing and the benefactors checking tokens, and
with `--chunk-tokens off`.

    .venv/bin/python benchmarks/token_cost.py [--size-mib 1024] [--cycles 5]

One data directory throughout; each cycle starts the cluster with one setting (on, off,
alternating, so that drift of the machine falls on both alike), writes a new file of
unique data in 1 MiB writes (stored and committed: ASB), stops the cluster, drops the
page cache, starts it again with the same setting and reads the file twice (cold, warm).
Runs as root (drop_caches). Prints one JSON object: every cycle's MB/s and CPU seconds
per process, the medians per setting, and the cost of tokens in percent of the figure
without them (positive: slower with tokens; CPU: more with tokens).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mosafs.bench import write
from mosafs.bench.timing import drop_caches, make_data

MiB = 1 << 20


def _cpu(result: dict[str, Any], prefix: str) -> float:
    return round(sum(v for k, v in result["cpu"]["cpu_s"].items() if k.startswith(prefix)), 3)


def cycle(workdir: Path, size: int, tokens: bool, n: int) -> dict[str, Any]:
    args = [] if tokens else ["--chunk-tokens", "off"]
    path_name = f"file-{n}.bin"
    data = make_data(f"token-cost/{n}".encode(), size)
    m = write._Mosafs(workdir, args)  # the benchmark's restartable `mosafs up`
    try:
        m.start()
        w = write._timed_write(m, m.mnt / path_name, data, write.LARGE_WRITE)
        del data
        m.stop()
        drop_caches()
        m.start()
        cold = write._timed_read(m, m.mnt / path_name, size, "cold")
        warm = write._timed_read(m, m.mnt / path_name, size, "warm")
    finally:
        m.stop()
    out: dict[str, Any] = {"write_asb": w["asb_mb_s"], "read_cold": cold["mb_s"],
                           "read_warm": warm["mb_s"]}
    for what, result in (("write", w), ("read_cold", cold), ("read_warm", warm)):
        for proc in ("mount", "benefactor"):
            out[f"cpu_{what}_{proc}"] = _cpu(result, proc)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--cycles", type=int, default=5, help="cycles per setting")
    args = parser.parse_args()
    size = args.size_mib * MiB
    runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="mosafs-token-cost-") as tmp:
        for n in range(2 * args.cycles):
            setting = ("on", "off")[n % 2] if n // 2 % 2 == 0 else ("off", "on")[n % 2]
            write.progress(f"cycle {n + 1}/{2 * args.cycles}: tokens {setting}")
            runs[setting].append(cycle(Path(tmp), size, setting == "on", n))
    names = list(runs["on"][0])
    medians = {s: {k: statistics.median(r[k] for r in rs) for k in names}
               for s, rs in runs.items()}
    cost = {}
    for k in names:
        off, on = medians["off"][k], medians["on"][k]
        if off:  # bandwidth: slower is a cost; CPU seconds: more is a cost
            cost[k] = round(100 * ((off - on) if not k.startswith("cpu") else (on - off)) / off,
                            2)
    print(json.dumps({"benchmark": "token_cost", "size_bytes": size, "cycles": args.cycles,
                      "runs": runs, "median": medians, "token_cost_pct": cost,
                      "machine": write.machine_info(), "git": write.git_info()}, indent=1))


if __name__ == "__main__":
    main()
