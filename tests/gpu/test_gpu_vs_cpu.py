"""GPU == CPU on randomized inputs: sizes from 0 to 64 MiB, random feed splits, fixed and
several cdc chunkers (tiny ones to the default), one and several buffers in flight."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from mosafs.chunking import DEFAULT_SPEC, make_chunker

from .conftest import (
    GPU,
    MiB,
    chunker_on,
    feed_pieces,
    feed_pinned,
    mixed,
    random_bytes,
    triples,
)

pytestmark = GPU

SPECS = [
    "fixed:1048576",
    "fixed:4096",
    "fixed:1000",
    "cdc:1:256:1024",
    "cdc:64:1024:1024",
    "cdc:2048:8192:32768",
    "cdc:4096:16384:65536",
    "cdc:65536:262144:1048576",
    DEFAULT_SPEC,
]
SIZES = [0, 1, 63, 64, 65, 1000, 4097, 65536 + 7, MiB - 1, 3 * MiB + 5, 17 * MiB + 3]
LARGEST = {"fixed:1048576": 64 * MiB, "cdc:4096:16384:65536": 64 * MiB,
           "cdc:1:256:1024": 24 * MiB, DEFAULT_SPEC: 64 * MiB}
"""The 64 MiB case for the default, a small and the fixed chunker (and ~100k chunks of
the tiniest); the others stop at 17 MiB to keep the suite's time on a lent GPU short."""


def inputs(spec: str) -> list[tuple[str, bytes]]:
    rng = random.Random(spec)
    out = []
    for i, size in enumerate([*SIZES, LARGEST.get(spec, 0)]):
        if size or i < len(SIZES):
            out.append((f"random-{size}", random_bytes(rng.randrange(1 << 30) + i, size)))
    out.append(("mixed", mixed(rng, 5 * MiB + 77)))
    out.append(("zeros", bytes(3 * MiB + 1)))
    out.append(("pattern", (b"checkpoint-" * (MiB // 4))[:2 * MiB + 9]))
    return out


@pytest.mark.parametrize("spec", SPECS)
def test_gpu_equals_cpu(spec: str, runtimes: dict[str, Any]) -> None:
    cpu = make_chunker(spec, "cpu")
    rng = random.Random(f"splits-{spec}")
    for name, data in inputs(spec):
        want = triples(cpu.chunk_all(data))
        gpu = chunker_on(spec, None)
        got = gpu.chunk_all(data)
        assert triples(got) == want, (name, "chunk_all")
        assert all(c.data == data[c.offset:c.offset + c.length] for c in got[:50]), name
        runtime = rng.choice(["small", "lanes"])
        streamed = chunker_on(spec, runtimes[runtime])
        # Log-uniform pieces up to `largest`: tiny ones only where the input is small
        # (a feed costs microseconds: keep it to a few thousand feeds).
        largest = max(1 << rng.randrange(1, 25), len(data) // 2000, 2)
        assert triples(feed_pieces(streamed.stream(pipelined=True), data, rng, largest)) \
            == want, (name, runtime, "pipelined", largest)
        assert triples(feed_pinned(streamed.stream(pipelined=True), data, rng, 8 * MiB)) \
            == want, (name, runtime, "pinned")
        if len(data) <= 3 * MiB + 5:
            assert triples(feed_pieces(streamed.stream(), data, rng, 128 * 1024)) == want, \
                (name, runtime, "waiting")


def test_split_at_the_cuts_and_next_to_them(runtimes: dict[str, Any]) -> None:
    """Pieces ending exactly at, one before and one after every cut point."""
    data = mixed(random.Random(5), 3 * MiB)
    for spec in ("cdc:2048:8192:32768", "cdc:1:256:1024", "fixed:4096"):
        want = triples(make_chunker(spec, "cpu").chunk_all(data))
        ends = [o + n for o, n, _ in want]
        chunker = chunker_on(spec, runtimes["small"])
        for shift in (0, -1, 1):
            points = sorted({e + shift for e in ends if 0 < e + shift < len(data)})
            bounds = [0, *points, len(data)]
            for pipelined in (False, True):
                stream = chunker.stream(pipelined=pipelined)
                chunks = []
                for a, b in itertools.pairwise(bounds):
                    chunks += stream.feed(data[a:b])
                chunks += stream.finish()
                assert triples(chunks) == want, (spec, shift, pipelined)


def test_many_streams_share_the_pool(runtimes: dict[str, Any]) -> None:
    """Interleaved streams take and give back pooled buffers without mixing bytes."""
    spec = "cdc:4096:16384:65536"
    rt = runtimes["lanes"]
    rng = random.Random(6)
    datas = [random_bytes(100 + i, 5 * MiB + i * 1001) for i in range(4)]
    wants = [triples(make_chunker(spec, "cpu").chunk_all(d)) for d in datas]
    chunker = chunker_on(spec, rt)
    streams = [chunker.stream(pipelined=bool(i % 2)) for i in range(4)]
    got: list[list[Any]] = [[] for _ in datas]
    offsets = [0] * 4
    while any(o < len(d) for o, d in zip(offsets, datas, strict=True)):
        i = rng.randrange(4)
        if offsets[i] >= len(datas[i]):
            continue
        size = rng.randrange(1, 1 * MiB)
        got[i] += streams[i].feed(datas[i][offsets[i]:offsets[i] + size])
        offsets[i] += size
    for i, stream in enumerate(streams):
        got[i] += stream.finish()
        assert triples(got[i]) == wants[i]


def test_threads_share_the_runtime() -> None:
    """Streams in several threads at once (the client chunks files in threads)."""
    from concurrent.futures import ThreadPoolExecutor

    spec = "cdc:2048:8192:32768"
    datas = [random_bytes(200 + i, 4 * MiB + 3 * i) for i in range(6)]
    wants = [triples(make_chunker(spec, "cpu").chunk_all(d)) for d in datas]
    chunker = make_chunker(spec, "gpu")

    def run(i: int) -> list[Any]:
        stream = chunker.stream()
        rng = random.Random(i)
        return triples(feed_pieces(stream, datas[i], rng, 2 * MiB))

    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(run, range(6))) == wants
