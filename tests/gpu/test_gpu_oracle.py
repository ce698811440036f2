"""The oracle backend (benchmarks only): unavailable until primed, then the primed chunks
for a primed input, whole or streamed; never computes chunks itself."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from mosafs.chunking import available_backends, make_chunker, make_hasher, oracle
from mosafs.errors import ConfigError

from .conftest import triples


@pytest.fixture
def clean() -> Iterator[None]:
    oracle.clear()
    yield
    oracle.clear()


def test_unavailable_until_primed(clean: None) -> None:
    assert "oracle" not in available_backends()
    with pytest.raises(ConfigError,
                       match=r"^ORACLE hash backend requested but no input has been primed"):
        make_chunker("cdc:2048:8192:32768", "oracle")
    data = random.Random(1).randbytes(300_000)
    oracle.prime("cdc:2048:8192:32768", data)
    assert "oracle" in available_backends()
    assert make_chunker("cdc:2048:8192:32768").backend != "oracle"  # never "auto"
    oracle.clear()
    assert "oracle" not in available_backends()


def test_primed_chunks_whole_and_streamed(clean: None) -> None:
    rng = random.Random(2)
    spec = "cdc:2048:8192:32768"
    data = rng.randbytes(500_000)
    want = make_chunker(spec, "cpu").chunk_all(data)
    oracle.prime(spec, data, want)
    fast = make_chunker(spec, "oracle")
    assert fast.backend == "oracle"
    assert triples(fast.chunk_all(data)) == triples(want)
    stream = fast.stream()
    got = []
    offset = 0
    while offset < len(data):
        piece = data[offset:offset + rng.randrange(1, 100_000)]
        got += stream.feed(piece)
        offset += len(piece)
        assert stream.pending == offset - sum(c.length for c in got)
    got += stream.finish()
    assert triples(got) == triples(want)
    ids = make_hasher("oracle").hash_many([c.data for c in want[:5]])
    assert ids == [c.id for c in want[:5]]
    small = rng.randbytes(1000)  # shorter than the key: the whole input is the key
    oracle.prime(spec, small)
    assert triples(fast.chunk_all(small)) == triples(make_chunker(spec, "cpu").chunk_all(small))


def test_unprimed_inputs_are_refused(clean: None) -> None:
    spec = "fixed:4096"
    data = random.Random(3).randbytes(200_000)
    oracle.prime(spec, data)
    fast = make_chunker(spec, "oracle")
    with pytest.raises(ValueError, match="not primed"):
        fast.chunk_all(data[1:])
    with pytest.raises(ValueError, match="not primed"):
        make_chunker("fixed:8192", "oracle").chunk_all(data)
    with pytest.raises(ValueError, match="bytes"):
        fast.chunk_all(data[:-1])
    stream = fast.stream()
    stream.feed(data[:-5])
    with pytest.raises(ValueError, match="bytes"):
        stream.finish()
    with pytest.raises(ValueError, match="cover"):
        oracle.prime(spec, data, make_chunker(spec, "cpu").chunk_all(data)[:-1])
    with pytest.raises(ValueError, match="same spec"):
        oracle.prime(spec, data + b"more")
