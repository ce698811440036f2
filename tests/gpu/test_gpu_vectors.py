"""Every case of the chunking-v1 test vectors (DESIGN §5) through the GPU backend: whole
buffers, streams in random pieces (waiting and pipelined), pinned buffers filled in
place, small buffers (the open chunk carried from buffer to buffer) and alternating
queues/devices."""

from __future__ import annotations

import random
from typing import Any

import pytest

from mosafs.chunking import make_chunker, make_hasher

from .conftest import (
    GPU,
    MiB,
    chunker_on,
    feed_pieces,
    feed_pinned,
    load_vectors,
    triples,
    vector_input,
)

pytestmark = GPU

CASES = load_vectors()
IDS = [f"{c['input']['kind']}-{c['input'].get('seed', '')}-{c['input']['length']}-{c['chunker']}"
       for c in CASES]
_DATA: dict[int, bytes] = {}


def data_of(index: int) -> bytes:
    if index not in _DATA:
        _DATA[index] = vector_input(CASES[index]["input"])
        assert len(_DATA[index]) == CASES[index]["total_length"]
    return _DATA[index]


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_vector_chunk_all(index: int) -> None:
    case = CASES[index]
    data = data_of(index)
    chunker = make_chunker(case["chunker"], "gpu")
    assert chunker.backend == "gpu"
    chunks = chunker.chunk_all(data)
    assert triples(chunks) == case["chunks"]
    assert b"".join(c.data for c in chunks) == data


@pytest.mark.parametrize("runtime", ["default", "small", "lanes"])
@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_vector_streams(index: int, runtime: str, runtimes: dict[str, Any]) -> None:
    case = CASES[index]
    data = data_of(index)
    chunker = chunker_on(case["chunker"], runtimes[runtime])
    rng = random.Random(index)
    largest = 4 * MiB
    runs = {
        "pipelined": feed_pieces(chunker.stream(pipelined=True), data, rng, largest),
        "pinned": feed_pinned(chunker.stream(pipelined=True), data, rng, largest),
        "pinned-waiting": feed_pinned(chunker.stream(), data, rng, 2 * largest),
    }
    if len(data) <= 4 * MiB:  # a GPU round trip per piece: keep the piece count modest
        runs["waiting"] = feed_pieces(chunker.stream(), data, rng, 256 * 1024)
    for name, chunks in runs.items():
        assert triples(chunks) == case["chunks"], name
        assert all(c.data == data[c.offset:c.offset + c.length] for c in chunks), name


def test_vector_chunk_ids_through_hash_many() -> None:
    hasher = make_hasher("gpu")
    for index, case in enumerate(CASES):
        data = data_of(index)
        pieces = [data[o:o + n] for o, n, _ in case["chunks"]]
        assert [i.hex() for i in hasher.hash_many(pieces)] == [h for _, _, h in case["chunks"]]
