"""Summarize py-spy raw output (`py-spy record --format raw`, as profile_write.py --py-spy
writes it): the functions that hold the most samples, inclusive and self, with samples
spent waiting (a lock, a queue, epoll, a condition) set apart, since a thread parked in a
wait costs no CPU.

    .venv/bin/python benchmarks/spy_top.py FILE.txt [--top 40] [--thread NAME]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

# Leaf frames of a thread that waits rather than runs.
WAITS = ("epoll_wait", "PyThread_acquire_lock_timed", "_queue_SimpleQueue_get",
         "Condition.wait", "Event.wait", "select", "poll", "pthread_cond", "futex",
         "sem_wait", "nanosleep", "clock_nanosleep", "read_events", "do_futex")


def _name(frame: str) -> str:
    return frame.split(" (")[0]


def summarize(path: Path, top: int, thread: str | None) -> str:
    total = waiting = 0
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if thread and thread not in frames[0]:
            continue
        n = int(count)
        total += n
        if any(w in f for f in frames[-4:] for w in WAITS):
            waiting += n
            continue
        own[_name(frames[-1])] += n
        for name in {_name(f) for f in frames if not f.startswith("0x")}:
            inclusive[name] += n
    running = total - waiting
    rows = [f"{path}: {total} samples, {waiting} waiting, {running} running"]
    if running:
        rows.append("inclusive (% of running samples):")
        rows += [f"  {n / running * 100:5.1f}% {name[:120]}"
                 for name, n in inclusive.most_common(top)]
        rows.append("self:")
        rows += [f"  {n / running * 100:5.1f}% {name[:120]}"
                 for name, n in own.most_common(top // 2)]
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--thread", help="only stacks whose thread frame contains this")
    args = parser.parse_args(argv)
    for path in args.files:
        print(summarize(path, args.top, args.thread))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
