"""One client of `mosafs bench metadata`: `python -m mosafs.bench.metadata_ops`.

Every client is a process of its own (no GIL shared between clients, and the same process
model on mosafs and on MooseFS). It reads one JSON command a line on stdin; for each it
does the untimed preparation, answers {"ready": true}, waits for the line "go", runs the
operations and answers one JSON line:

    {"start": T0, "end": T1, "ops": N, "latencies": [seconds, ...], "cpu_s": S, ...}

T0 and T1 are perf_counter values: CLOCK_MONOTONIC on Linux, one clock for every process
of the machine, so the benchmark takes the aggregate span from the first start to the last
end. A failed operation answers {"error": "..."} instead: a figure over operations that
failed would be no figure. End of stdin: the process exits 0.

Commands ("op"), each on DIR with the names PREFIX + a 7-digit index FIRST..FIRST+COUNT-1:

- create: open(O_CREAT|O_EXCL|O_WRONLY) and close of each name (an empty new file);
- stat: os.stat of each (names made by an earlier create);
- missing: os.stat of each, which must fail with ENOENT (names nobody made);
- commit: each a new file of CHUNKS x CHUNK_BYTES bytes written in one os.write, then
  closed: "latencies" are the close() calls (the mount's flush and commit of the
  block-map), "write_latencies" open -> last write returned;
- ls: os.scandir of DIR and lstat of every entry, what `ls -l` does (ops = entries);
- listdir: os.listdir of DIR (ops = entries).

Only the standard library: a client starts in a fraction of a second.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

CREATE_FLAGS = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC
STAMP_BYTES = 8


def name(prefix: str, index: int) -> str:
    return f"{prefix}{index:07d}"


def paths(command: dict[str, Any]) -> list[str]:
    first = int(command.get("first", 0))
    return [os.path.join(command["dir"], name(command["prefix"], i))
            for i in range(first, first + int(command["count"]))]


# -- the operations ----------------------------------------------------------------------

def _create(path: str) -> None:
    os.close(os.open(path, CREATE_FLAGS, 0o644))


def _missing(path: str) -> None:
    try:
        os.stat(path)
    except FileNotFoundError:
        return
    raise OSError(errno.EEXIST, "exists (the benchmark looks up names that do not)", path)


def each(targets: list[str], op: Callable[[str], object]) -> dict[str, Any]:
    """OP on every target, each timed."""
    latencies = []
    clock = time.perf_counter
    start = clock()
    for target in targets:
        t = clock()
        op(target)
        latencies.append(clock() - t)
    return {"start": start, "end": clock(), "ops": len(targets), "latencies": latencies}


def stamp(buf: bytearray, index: int, chunk: int) -> None:
    """Make each CHUNK-byte chunk of BUF unique to file INDEX: nothing of one file
    dedupes against another (the base bytes are random, so chunks of one file differ)."""
    mark = index.to_bytes(STAMP_BYTES, "little")
    for offset in range(0, len(buf), chunk):
        buf[offset:offset + STAMP_BYTES] = mark


def commits(targets: list[str], chunks: int, chunk: int) -> dict[str, Any]:
    """Write each target whole and close it: close() is the commit on mosafs."""
    buf = bytearray(os.urandom(chunks * chunk))
    view = memoryview(buf)
    closes, writes = [], []
    clock = time.perf_counter
    start = clock()
    for i, target in enumerate(targets):
        stamp(buf, i, chunk)
        t = clock()
        fd = os.open(target, CREATE_FLAGS, 0o644)
        try:
            written = 0
            while written < len(buf):
                written += os.write(fd, view[written:])
        finally:
            w = clock()
            os.close(fd)
        closes.append(clock() - w)
        writes.append(w - t)
    return {"start": start, "end": clock(), "ops": len(targets), "latencies": closes,
            "write_latencies": writes, "file_bytes": len(buf)}


def ls_l(directory: str) -> dict[str, Any]:
    clock = time.perf_counter
    start = clock()
    entries = 0
    with os.scandir(directory) as listing:
        for entry in listing:
            entry.stat(follow_symlinks=False)
            entries += 1
    return {"start": start, "end": clock(), "ops": entries, "latencies": []}


def listdir(directory: str) -> dict[str, Any]:
    clock = time.perf_counter
    start = clock()
    entries = len(os.listdir(directory))
    return {"start": start, "end": clock(), "ops": entries, "latencies": []}


OPS = ("create", "stat", "missing", "commit", "ls", "listdir")


def prepare(command: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """The untimed part of COMMAND (its names); the timed part, to call at "go"."""
    op = command["op"]
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}")
    if op in ("ls", "listdir"):
        directory = command["dir"]
        return lambda: (ls_l if op == "ls" else listdir)(directory)
    targets = paths(command)
    if op == "create":
        return lambda: each(targets, _create)
    if op == "stat":
        return lambda: each(targets, os.stat)
    if op == "missing":
        return lambda: each(targets, _missing)
    chunks, chunk = int(command["chunks"]), int(command["chunk_bytes"])
    return lambda: commits(targets, chunks, chunk)


# -- the process ---------------------------------------------------------------------------

def _answer(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def serve() -> int:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            run = prepare(json.loads(line))
        except (ValueError, KeyError, TypeError) as exc:
            _answer({"error": f"bad command: {exc}"})
            continue
        _answer({"ready": True})
        if sys.stdin.readline().strip() != "go":
            return 1
        cpu = _cpu()
        try:
            out = run()
        except OSError as exc:  # the file system refused: the benchmark reports it
            out = {"error": str(exc)}
        out["cpu_s"] = round(_cpu() - cpu, 3)
        _answer(out)
    return 0


if __name__ == "__main__":
    sys.exit(serve())
