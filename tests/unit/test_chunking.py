"""Chunking spec v1 (DESIGN §5): vectors, the definition, specs, backends, streaming."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import blake3
import numpy as np
import pytest

from mosafs.chunking import (
    DEFAULT_SPEC,
    MAX_CHUNK,
    Chunk,
    ChunkerSpec,
    available_backends,
    make_chunker,
    make_hasher,
    parse_spec,
)
from mosafs.errors import ConfigError
from mosafs.ids import chunk_id
from tests.conftest import VECTORS

MiB = 1 << 20


def _load_vectors() -> list[dict[str, Any]]:
    # Never skip: without the vectors nothing proves the chunker matches the contract.
    if not VECTORS.is_file():
        raise FileNotFoundError(
            f"chunking test vectors not found at {VECTORS}: the repository carries them "
            "(DESIGN §5, docs/design.md)"
        )
    cases: list[dict[str, Any]] = json.loads(VECTORS.read_text())["cases"]
    assert cases, f"{VECTORS} holds no cases"
    return cases


CASES = _load_vectors()
BACKENDS = available_backends()


def _case_id(case: dict[str, Any]) -> str:
    inp = case["input"]
    return f"{inp['kind']}-{inp.get('seed', '')}-{inp['length']}-{case['chunker']}"


def vector_input(inp: dict[str, Any]) -> bytes:
    """The recipes of DESIGN §5."""
    kind = inp["kind"]
    if kind == "xof":
        return blake3.blake3(inp["seed"].encode()).digest(length=inp["length"])
    if kind == "zeros":
        return bytes(inp["length"])
    if kind == "pattern":
        pattern = inp["pattern"].encode()
        return (pattern * (inp["length"] // len(pattern) + 1))[:inp["length"]]
    if kind == "edit":
        base = blake3.blake3(inp["seed"].encode()).digest(length=inp["length"])
        at = inp["insert_at"]
        return base[:at] + inp["insert"].encode() + base[at:]
    raise AssertionError(f"unknown vector input kind {kind!r}")


def triples(chunks: list[Chunk]) -> list[list[Any]]:
    return [[c.offset, c.length, c.id.hex()] for c in chunks]


def random_pieces(data: bytes, rng: random.Random, largest: int) -> Iterator[memoryview]:
    """Pieces of log-uniform size between 1 byte and `largest`."""
    view = memoryview(data)
    offset = 0
    while offset < len(data):
        size = int(2 ** rng.uniform(0, np.log2(largest)))
        yield view[offset:offset + size]
        offset += size


def split_at(data: bytes, points: list[int]) -> Iterator[bytes]:
    """Pieces of data cut at the given offsets."""
    bounds = [0, *sorted({p for p in points if 0 < p < len(data)}), len(data)]
    return (data[a:b] for a, b in itertools.pairwise(bounds))


def stream_all(chunker: Any, pieces: Iterator[Any]) -> list[Chunk]:
    stream = chunker.stream()
    chunks: list[Chunk] = []
    for piece in pieces:
        chunks += stream.feed(piece)
    return chunks + stream.finish()


# --- test vectors -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vector_data() -> Callable[[int], bytes]:
    cache: dict[int, bytes] = {}

    def get(index: int) -> bytes:
        if index not in cache:
            data = vector_input(CASES[index]["input"])
            assert len(data) == CASES[index]["total_length"]
            cache[index] = data
        return cache[index]

    return get


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index", range(len(CASES)), ids=[_case_id(c) for c in CASES])
def test_vector_chunk_all(backend: str, index: int, vector_data: Callable[[int], bytes]) -> None:
    case = CASES[index]
    data = vector_data(index)
    chunks = make_chunker(case["chunker"], backend).chunk_all(data)
    assert triples(chunks) == case["chunks"]
    assert b"".join(c.data for c in chunks) == data


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index", range(len(CASES)), ids=[_case_id(c) for c in CASES])
def test_vector_stream_random_pieces(backend: str, index: int,
                                     vector_data: Callable[[int], bytes]) -> None:
    case = CASES[index]
    data = vector_data(index)
    chunker = make_chunker(case["chunker"], backend)
    chunks = stream_all(chunker, random_pieces(data, random.Random(index), 4 * MiB))
    assert triples(chunks) == case["chunks"]
    assert all(c.data == data[c.offset:c.offset + c.length] for c in chunks)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vector_stream_tiny_pieces(backend: str, vector_data: Callable[[int], bytes]) -> None:
    """1..64-byte pieces over every small case (hundreds of chunk boundaries)."""
    for index, case in enumerate(CASES):
        if case["total_length"] > 1100 * 1024:
            continue
        data = vector_data(index)
        chunks = stream_all(make_chunker(case["chunker"], backend),
                            random_pieces(data, random.Random(1000 + index), 64))
        assert triples(chunks) == case["chunks"], _case_id(case)


def test_vectors_cover_the_interesting_cases() -> None:
    kinds = {c["input"]["kind"] for c in CASES}
    assert {"xof", "zeros", "pattern", "edit"} <= kinds
    assert {c["chunker"] for c in CASES} >= {DEFAULT_SPEC, "fixed:1048576"}


# --- the definition: gear table, windowed hash, selection -------------------------------

def reference_gear() -> list[int]:
    return [int.from_bytes(blake3.blake3(b"mosafs-gear-v1" + bytes([i])).digest()[:8], "little")
            for i in range(256)]


GEAR_REF = reference_gear()
GEAR_NP = np.array(GEAR_REF, dtype=np.uint64)
WORD = (1 << 64) - 1


def windowed_hash_python(data: bytes, p: int) -> int:
    """h_p = sum over k = 0..63 of (G[b_(p-k)] << k) mod 2^64, bytes before 0 absent."""
    return sum(GEAR_REF[data[p - k]] << k for k in range(64) if p - k >= 0) & WORD


def windowed_hashes(data: bytes) -> np.ndarray:
    """The windowed definition for every position at once (uint64 wraps like mod 2^64)."""
    g = GEAR_NP[np.frombuffer(data, dtype=np.uint8)]
    h = np.zeros(len(data), dtype=np.uint64)
    for k in range(min(64, len(data))):
        h[k:] += g[:len(data) - k] << np.uint64(k)
    return h


def reference_cuts(data: bytes, spec: ChunkerSpec) -> list[int]:
    """Chunk ends straight from DESIGN §5, using the windowed hash of every position."""
    n = len(data)
    if spec.kind == "fixed":
        return [min(end, n) for end in range(spec.max_size, n + spec.max_size, spec.max_size)]
    top = lambda bits: (WORD >> (64 - bits)) << (64 - bits)  # noqa: E731
    lg = spec.avg_size.bit_length() - 1
    h = windowed_hashes(data)
    cand_s = np.flatnonzero((h & np.uint64(top(lg + 2))) == 0)
    cand_l = np.flatnonzero((h & np.uint64(top(lg - 2))) == 0)
    cuts, start = [], 0
    while start < n:
        first = start + spec.min_size - 1          # size = p + 1 - start >= MIN
        small_end = start + spec.avg_size - 1      # from here size >= AVG
        end = min(start + spec.max_size, n)
        cut = end
        i = int(np.searchsorted(cand_s, first))
        if i < len(cand_s) and cand_s[i] < min(small_end, end):
            cut = int(cand_s[i]) + 1
        else:
            j = int(np.searchsorted(cand_l, max(first, small_end)))
            if j < len(cand_l) and cand_l[j] < end:
                cut = int(cand_l[j]) + 1
        cuts.append(cut)
        start = cut
    return cuts


def bytewise_cuts(data: bytes, spec: ChunkerSpec) -> list[int]:
    """DESIGN §5 one byte at a time: the rolling hash from the stream start, every p."""
    lg = spec.avg_size.bit_length() - 1
    mask_s = (WORD >> (64 - lg - 2)) << (64 - lg - 2)
    mask_l = (WORD >> (64 - lg + 2)) << (64 - lg + 2)
    cuts, start, h = [], 0, 0
    for p, byte in enumerate(data):
        h = ((h << 1) + GEAR_REF[byte]) & WORD
        size = p + 1 - start
        if size >= spec.min_size and (
                (size < spec.avg_size and h & mask_s == 0)
                or (size >= spec.avg_size and h & mask_l == 0) or size == spec.max_size):
            cuts.append(p + 1)
            start = p + 1
    if start < len(data):
        cuts.append(len(data))
    return cuts


@pytest.mark.parametrize("text", ["cdc:1:256:1024", "cdc:64:256:2048", "cdc:300:512:700",
                                  "cdc:2048:8192:32768"])
def test_selection_matches_bytewise_definition(text: str) -> None:
    spec = parse_spec(text)
    rng = random.Random(text)
    chunker = make_chunker(spec, "cpu")
    for data in (rng.randbytes(30_000), mixed(rng, 30_000), b"", b"x"):
        want = bytewise_cuts(data, spec)
        assert reference_cuts(data, spec) == want
        assert [c.offset + c.length for c in chunker.chunk_all(data)] == want


def test_gear_table_matches_the_definition() -> None:
    from mosafs.chunking.gear import GEAR

    assert GEAR.dtype == np.uint64
    assert [int(x) for x in GEAR] == GEAR_REF


def test_rolling_form_equals_windowed_definition() -> None:
    rng = random.Random(7)
    for length in (1, 2, 63, 64, 65, 200, 500):
        data = rng.randbytes(length)
        h = 0
        for p in range(length):
            h = ((h << 1) + GEAR_REF[data[p]]) & WORD
            assert h == windowed_hash_python(data, p), (length, p)
        assert [int(x) for x in windowed_hashes(data)] == [
            windowed_hash_python(data, p) for p in range(length)]


def test_windowed_hash_depends_only_on_the_last_64_bytes() -> None:
    rng = random.Random(8)
    tail = rng.randbytes(64)
    for _ in range(5):
        a = rng.randbytes(rng.randrange(0, 100)) + tail
        b = rng.randbytes(rng.randrange(0, 100)) + tail
        assert windowed_hash_python(a, len(a) - 1) == windowed_hash_python(b, len(b) - 1)


def mixed(rng: random.Random, n: int) -> bytes:
    """Random bytes with runs of zeros and of a short pattern (periodic hashes)."""
    out = bytearray()
    while len(out) < n:
        kind = rng.randrange(3)
        size = rng.randrange(1, 40000)
        out += (rng.randbytes(size) if kind == 0 else bytes(size) if kind == 1
                else (b"ckpt" * size)[:size])
    return bytes(out[:n])


REFERENCE_SPECS = [
    "cdc:1:256:1024",          # MIN < 64: hashes need bytes before the chunk start
    "cdc:16:256:4096",
    "cdc:256:256:256",         # MIN = AVG = MAX: every chunk is MAX
    "cdc:64:1024:1024",
    "cdc:2048:8192:32768",
    "cdc:4096:65536:262144",   # long regions: the 4-lane path of the scan
    "cdc:100:32768:131072",
    "fixed:1000",
    "fixed:1",
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("text", REFERENCE_SPECS)
def test_chunker_matches_reference_implementation(backend: str, text: str) -> None:
    spec = parse_spec(text)
    rng = random.Random(text)
    chunker = make_chunker(spec, backend)
    size = 20000 if spec.max_size == 1 else 600_000
    for data in (rng.randbytes(size), mixed(rng, size), bytes(size // 3), rng.randbytes(777)):
        expected = reference_cuts(data, spec)
        got = chunker.chunk_all(data)
        assert [c.offset + c.length for c in got] == expected
        streamed = stream_all(chunker, random_pieces(data, rng, 70000))
        assert [c.offset + c.length for c in streamed] == expected


def test_scan_kernel_lanes_find_the_first_hit() -> None:
    """The 4-lane scan against the definition, with hits in every lane and none."""
    from mosafs.chunking import _kernels
    from mosafs.chunking.gear import GEAR

    rng = random.Random(9)
    data = rng.randbytes(600_000)
    array = np.frombuffer(data, dtype=np.uint8)
    h = windowed_hashes(data)
    block = _kernels.LANES * _kernels.LANE
    for bits in (10, 13, 15, 17, 30):
        mask = (WORD >> (64 - bits)) << (64 - bits)
        hits = np.flatnonzero((h & np.uint64(mask)) == 0)
        for _ in range(40):
            lo = rng.randrange(0, len(data))
            hi = min(len(data), lo + rng.choice([1, 100, block - 1, block, 3 * block + 5,
                                                 rng.randrange(0, 300_000)]))
            i = int(np.searchsorted(hits, lo))
            want = int(hits[i]) if i < len(hits) and hits[i] < hi else -1
            assert _kernels.first_hit(array, GEAR, np.uint64(mask), lo, hi) == want
            assert _kernels.first_hit_scalar(array, GEAR, np.uint64(mask), lo, hi) == want


# --- specs --------------------------------------------------------------------------------

def test_default_spec() -> None:
    spec = parse_spec(DEFAULT_SPEC)
    assert DEFAULT_SPEC == "cdc:262144:1048576:4194304"
    assert (spec.kind, spec.min_size, spec.avg_size, spec.max_size) == (
        "cdc", 262144, 1048576, 4194304)
    assert str(spec) == DEFAULT_SPEC
    assert spec.mask_s == ((1 << 22) - 1) << 42   # top L+2 bits, L = 20
    assert spec.mask_l == ((1 << 18) - 1) << 46   # top L-2 bits
    assert 64 * MiB == MAX_CHUNK


@pytest.mark.parametrize("text", [
    "fixed:1", "fixed:1048576", f"fixed:{MAX_CHUNK}", "cdc:1:256:256",
    "cdc:2048:8192:32768", f"cdc:{MAX_CHUNK}:{MAX_CHUNK}:{MAX_CHUNK}",
])
def test_spec_round_trips(text: str) -> None:
    spec = parse_spec(text)
    assert str(spec) == text
    assert parse_spec(str(spec)) == spec
    if spec.kind == "fixed":
        assert spec.min_size == spec.avg_size == spec.max_size == int(text.split(":")[1])


def test_spec_is_frozen_and_checked_when_built_directly() -> None:
    spec = parse_spec("fixed:4096")
    with pytest.raises(AttributeError):
        spec.max_size = 5  # type: ignore[misc]
    with pytest.raises(ConfigError, match="power of two"):
        ChunkerSpec("cdc", 1, 1000, 5000)
    with pytest.raises(ConfigError, match="one size"):
        ChunkerSpec("fixed", 1, 2, 3)


@pytest.mark.parametrize(("text", "fragment"), [
    ("", "unknown kind"),
    ("rabin:1:2:3", "unknown kind"),
    ("CDC:2048:8192:32768", "unknown kind"),
    ("cdc", "takes 3 size"),
    ("cdc:2048:8192", "takes 3 size"),
    ("cdc:1:2:3:4", "takes 3 size"),
    ("fixed", "takes 1 size"),
    ("fixed:1:2", "takes 1 size"),
    ("fixed:", "whole number"),
    ("fixed:abc", "whole number"),
    ("fixed:1.5", "whole number"),
    ("fixed:+5", "whole number"),
    ("fixed:-5", "whole number"),
    ("fixed:1_000", "whole number"),
    ("cdc:2048:8k:32768", "whole number"),
    ("fixed:0", "between 1 and"),
    (f"fixed:{MAX_CHUNK + 1}", "between 1 and"),
    ("cdc:0:256:1024", "between 1 and"),
    (f"cdc:1024:4096:{MAX_CHUNK + 1}", "between 1 and"),
    ("cdc:2048:8000:32768", "power of two"),
    ("cdc:1:3:4", "power of two"),
    ("cdc:64:128:1024", "at least 256"),
    ("cdc:1:1:1", "at least 256"),
    ("cdc:16384:8192:32768", "MIN <= AVG <= MAX"),
    ("cdc:2048:8192:4096", "MIN <= AVG <= MAX"),
])
def test_bad_spec_is_a_config_error(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_spec(text)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message and len(message) < 200
    assert info.value.exit_code == 2


def test_spec_must_be_text() -> None:
    with pytest.raises(ConfigError, match="must be text"):
        parse_spec(1024)  # type: ignore[arg-type]


def test_spec_ignores_surrounding_whitespace() -> None:
    assert str(parse_spec(" fixed:4096\n")) == "fixed:4096"


# --- backends -----------------------------------------------------------------------------

def test_cpu_backend_is_always_available() -> None:
    assert "cpu" in available_backends()
    chunker = make_chunker(DEFAULT_SPEC, "cpu")
    assert chunker.backend == "cpu"
    assert str(chunker.spec) == DEFAULT_SPEC
    assert make_hasher("cpu").backend == "cpu"


def test_auto_picks_an_available_backend() -> None:
    chunker = make_chunker("fixed:4096")
    assert chunker.backend in available_backends()
    if "gpu" not in available_backends():
        assert chunker.backend == "cpu"
        assert make_hasher().backend == "cpu"


def test_gpu_backend_without_gpu_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from mosafs.chunking import gpu

    if "gpu" not in available_backends():  # this machine as it is
        with pytest.raises(ConfigError, match=r"^GPU hash backend requested but \S"):
            make_chunker(DEFAULT_SPEC, "gpu")
    # and wherever it runs: a GPU host whose device is gone
    monkeypatch.setattr(gpu, "gpu_unavailable_reason", lambda: "CuPy sees no CUDA device")
    assert "gpu" not in available_backends()
    for make in (lambda: make_chunker(DEFAULT_SPEC, "gpu"), lambda: make_hasher("gpu")):
        with pytest.raises(ConfigError) as info:
            make()
        assert str(info.value) == "GPU hash backend requested but CuPy sees no CUDA device"
    assert make_chunker(DEFAULT_SPEC, "auto").backend == "cpu"  # auto never fails for it


def test_gpu_probe_explains_a_missing_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    from mosafs import gpuprobe as gpu

    monkeypatch.setattr(gpu.importlib.util, "find_spec", lambda name: None)
    reason = gpu.probe_gpu()
    assert reason is not None and "CuPy is not installed" in reason


def test_gpu_probe_explains_a_failing_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    from mosafs import gpuprobe as gpu

    def broken(name: str) -> Any:
        raise ImportError("libcudart.so.12: cannot open shared object file")

    monkeypatch.setattr(gpu.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(gpu.importlib, "import_module", broken)
    reason = gpu.probe_gpu()
    assert reason is not None and "libcudart" in reason


@pytest.mark.parametrize("name", ["tpu", "CPU", ""])
def test_unknown_backend_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match="unknown hash backend"):
        make_chunker(DEFAULT_SPEC, name)


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_bad_thread_count_is_a_config_error(threads: Any) -> None:
    with pytest.raises(ConfigError, match="threads"):
        make_hasher("cpu", threads=threads)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("threads", [1, 3])
def test_hash_many_gives_blake3_ids(backend: str, threads: int) -> None:
    rng = random.Random(threads)
    buffers: list[Any] = [b"", b"a", rng.randbytes(1025), bytearray(rng.randbytes(700_000)),
                          memoryview(rng.randbytes(600_000)), rng.randbytes(5000)]
    ids = make_hasher(backend, threads=threads).hash_many(buffers)
    assert ids == [blake3.blake3(bytes(b)).digest() for b in buffers]
    assert all(len(i) == 32 for i in ids)
    assert make_hasher(backend).hash_many([]) == []


# --- chunker behaviour --------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_input_gives_no_chunks(backend: str) -> None:
    for text in (DEFAULT_SPEC, "fixed:4096"):
        chunker = make_chunker(text, backend)
        assert chunker.chunk_all(b"") == []
        stream = chunker.stream()
        assert stream.feed(b"") == []
        assert stream.feed(bytearray()) == []
        assert stream.finish() == []
        assert chunker.stream().finish() == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_fixed_chunker_cuts_every_size_bytes(backend: str) -> None:
    chunker = make_chunker("fixed:1000", backend)
    data = random.Random(3).randbytes(3500)
    chunks = chunker.chunk_all(data)
    assert [(c.offset, c.length) for c in chunks] == [(0, 1000), (1000, 1000), (2000, 1000),
                                                      (3000, 500)]
    assert all(c.id == chunk_id(c.data) and c.data == data[c.offset:c.offset + c.length]
               for c in chunks)
    assert [c.length for c in chunker.chunk_all(data[:3000])] == [1000] * 3  # no empty tail
    stream = chunker.stream()
    assert [c.offset for c in stream.feed(data[:2500])] == [0, 1000]
    assert stream.pending == 500
    assert [c.offset for c in stream.feed(data[2500:])] == [2000]
    assert [(c.offset, c.length) for c in stream.finish()] == [(3000, 500)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_size_cut(backend: str) -> None:
    """Zeros never hit a mask here, so every chunk but the last is exactly MAX."""
    spec = parse_spec("cdc:2048:8192:32768")
    h = int(windowed_hashes(bytes(100))[-1])
    assert h & spec.mask_s and h & spec.mask_l  # no candidate at all in a run of zeros
    data = bytes(5 * 32768 + 123)
    lengths = [c.length for c in make_chunker(spec, backend).chunk_all(data)]
    assert lengths == [32768] * 5 + [123]
    chunks = stream_all(make_chunker(spec, backend), iter([data[:40000], data[40000:]]))
    assert [c.length for c in chunks] == lengths


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunks_cover_the_stream_and_respect_bounds(backend: str) -> None:
    spec = parse_spec("cdc:2048:8192:32768")
    data = mixed(random.Random(11), 2 * MiB)
    chunks = make_chunker(spec, backend).chunk_all(data)
    assert [c.offset for c in chunks] == [0, *np.cumsum([c.length for c in chunks])[:-1]]
    assert sum(c.length for c in chunks) == len(data)
    assert all(spec.min_size <= c.length <= spec.max_size for c in chunks[:-1])
    assert all(c.id == chunk_id(c.data) and len(c.data) == c.length for c in chunks)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_split_invariance(backend: str) -> None:
    """Any split gives the chunks of chunk_all: random sizes, cuts at boundaries, 1 byte."""
    rng = random.Random(12)
    data = mixed(rng, 3 * MiB)
    for text in ("cdc:2048:8192:32768", "cdc:1:256:1024", "cdc:65536:262144:1048576",
                 "fixed:4096"):
        chunker = make_chunker(text, backend)
        want = triples(chunker.chunk_all(data))
        ends = [offset + length for offset, length, _ in want]
        splits = [
            random_pieces(data, rng, 1 << rng.randrange(1, 23)),
            split_at(data, ends),                              # exactly at the cuts
            split_at(data, [e + 1 for e in ends]),             # one byte past each cut
            split_at(data, [e - 1 for e in ends]),             # one byte before each cut
            iter([data]),
        ]
        for pieces in splits:
            assert triples(stream_all(chunker, pieces)) == want, text


def strided(data: bytes) -> memoryview:
    """A non-contiguous view holding `data`."""
    spread = np.zeros(2 * len(data), dtype=np.uint8)
    spread[::2] = np.frombuffer(data, dtype=np.uint8)
    return memoryview(spread[::2])  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_takes_any_buffer_and_copies_it(backend: str) -> None:
    data = random.Random(13).randbytes(300_000)
    chunker = make_chunker("cdc:2048:8192:32768", backend)
    want = triples(chunker.chunk_all(data))
    stream = chunker.stream()
    got: list[Chunk] = []
    scratch = bytearray(7000)
    for offset in range(0, len(data), 7000):
        piece = data[offset:offset + 7000]
        scratch[:len(piece)] = piece
        got += stream.feed(memoryview(scratch)[:len(piece)])
        scratch[:] = bytes(len(scratch))  # the caller reuses its buffer at once
    assert triples(got + stream.finish()) == want
    converts: list[Callable[[bytes], Any]] = [
        bytearray, memoryview, lambda b: np.frombuffer(b, dtype=np.uint8),
        lambda b: memoryview(b).cast("b"), strided]
    for convert in converts:
        assert triples(chunker.chunk_all(convert(data))) == want
        assert triples(stream_all(chunker, iter([convert(data)]))) == want


@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_accounting_and_end(backend: str) -> None:
    chunker = make_chunker("cdc:2048:8192:32768", backend)
    data = random.Random(14).randbytes(100_000)
    stream = chunker.stream()
    returned = sum(c.length for c in stream.feed(data[:60_000]))
    assert stream.fed == 60_000
    assert stream.pending == 60_000 - returned
    returned += sum(c.length for c in stream.feed(data[60_000:]))
    returned += sum(c.length for c in stream.finish())
    assert returned == len(data)
    assert stream.pending == 0
    with pytest.raises(ValueError, match="finished"):
        stream.feed(b"more")
    with pytest.raises(ValueError, match="finished"):
        stream.finish()


def test_large_pieces_are_taken_in_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    from mosafs.chunking import cpu

    data = random.Random(15).randbytes(1 * MiB)
    chunker = make_chunker("cdc:2048:8192:32768", "cpu")
    want = triples(chunker.chunk_all(data))
    monkeypatch.setattr(cpu, "_FEED_SLICE", 10_000)
    stream = chunker.stream()
    assert triples(stream.feed(data) + stream.finish()) == want


def test_stream_window_stays_bounded() -> None:
    """The buffered tail is moved down, not kept: memory does not grow with the stream."""
    spec = parse_spec("cdc:4096:16384:65536")
    stream = make_chunker(spec, "cpu").stream()
    piece = random.Random(16).randbytes(50_000)
    for _ in range(200):  # 10 MB
        stream.feed(piece)
        assert stream.pending < spec.max_size
    capacity = stream._window._buf.shape[0]  # type: ignore[attr-defined]
    assert capacity <= 4 * (spec.max_size + len(piece))


def test_single_chunk_of_bytes_input_is_not_copied() -> None:
    data = random.Random(17).randbytes(5000)
    (chunk,) = make_chunker("cdc:2048:8192:32768", "cpu").chunk_all(data)
    assert chunk.data is data
    assert "data" not in repr(chunk)
