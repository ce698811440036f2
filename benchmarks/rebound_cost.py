"""The CPU of the fragment repairer's dispatch (mosafs.manager.ec_repair._dispatch): every
rebuild waiting for link slots is bound again when it may start (ec_plans.rebound), under
the repairer's lock. The repairer keeps up to four rounds of slots of plans waiting (2 per
benefactor and round), so a pool of N benefactors has about 8 N of them.

Synthetic `ec:4+2` rebuilds of a chunk lost with a dead benefactor, on random survivors;
a share of the benefactors with both link slots busy each way; one dispatch as the
repairer runs it (each plan that starts reserves its links). With `--full`, rebound runs
without its per-link shortcut (`per_link=None`: every choice made and checked), as before
it had one (docs/erasure_pools.md, "Concurrency, priority and limits").

    .venv/bin/python benchmarks/rebound_cost.py [--benefactors N ...] [--full]
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter

from mosafs.manager.ec_plans import REBUILD, Plan, fits, rebound
from mosafs.manager.metadata import FragmentMove, Layout

PER_LINK = 2
K, M = 4, 2


def waiting_plans(bids: list[str], rng: random.Random) -> list[Plan]:
    """8 per benefactor: fragment 5 lost with dead b0, the others on random survivors."""
    ids = tuple(bytes([i]) * 32 for i in range(K + M))
    plans = []
    for c in range(8 * len(bids)):
        holders = rng.sample(bids[1:], K + M - 1)
        spare = [b for b in bids[1:] if b not in holders]
        plans.append(Plan(c.to_bytes(32, "big"), REBUILD, holders[0], "default", 1 << 20,
                          read_bytes=(K - 1) << 18, store_bytes=1 << 18,
                          moves=(FragmentMove(K + M - 1, ids[-1], "b0", spare[0]),),
                          expect=Layout(K, M, ids), fragments=tuple(enumerate(holders)),
                          spare=tuple(spare[1:])))
    return plans


def dispatch(plans: list[Plan], bids: list[str], busy: float,
             per_link: int | None) -> tuple[float, int]:
    """Seconds of one dispatch over PLANS with BUSY of the links full; plans started."""
    sending: Counter[str] = Counter()
    receiving: Counter[str] = Counter()
    pairs: Counter[tuple[str, str]] = Counter()
    for b in bids[:int(len(bids) * busy)]:
        sending[b] = receiving[b] = PER_LINK
    started = 0
    clock = time.perf_counter()
    for p in plans:
        q = rebound(p, lambda x: fits(x, sending, receiving, PER_LINK), sending, receiving,
                    pairs, per_link)
        if q is not None:
            started += 1
            for s, r in q.transfers():
                sending[s] += 1
                receiving[r] += 1
                pairs[s, r] += 1
    return time.perf_counter() - clock, started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benefactors", type=int, nargs="+", default=[30, 100])
    parser.add_argument("--full", action="store_true", help="without the per-link shortcut")
    args = parser.parse_args()
    for n in args.benefactors:
        bids = [f"b{i}" for i in range(n)]
        plans = waiting_plans(bids, random.Random(0))
        for busy in (0.0, 0.5, 0.98):
            seconds, started = dispatch(plans, bids, busy, None if args.full else PER_LINK)
            print(f"{n} benefactors, {len(plans)} plans waiting, {busy:.0%} of the links "
                  f"busy: {seconds * 1000:.0f} ms, {started} started")


if __name__ == "__main__":
    main()
