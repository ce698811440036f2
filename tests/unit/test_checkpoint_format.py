"""The safetensors layout mosafs.checkpoint makes (mosafs.checkpoint.format): the header is
byte for byte the library's for random state dicts (every dtype numpy has, odd shapes,
empty tensors, non-ASCII and control characters in names, metadata of one key), tensors
sit in the library's order; parse() reads the library's files back and refuses files
that are not safetensors; several metadata keys are sorted (the library's own order
changes from process to process)."""

from __future__ import annotations

import json
import random
import struct

import numpy as np
import pytest

from mosafs.checkpoint.format import TensorSpec, layout, parse
from mosafs.checkpoint.sources import sources
from mosafs.errors import InvalidArgument

safetensors_numpy = pytest.importorskip("safetensors.numpy",
                                        reason="safetensors is a test dependency")

DTYPES = ["float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint64",
          "uint32", "uint16", "uint8", "bool", "complex64"]
NAMES = ["w", "layer.0.weight", "ß-ü", "tab\tname", 'quote"back\\slash', "\x01ctl", "日本",
         "a/b", "z", "Z", "_"]


def random_state(rng: random.Random) -> dict[str, np.ndarray]:
    out = {}
    for name in rng.sample(NAMES, rng.randint(1, len(NAMES))):
        shape = tuple(rng.choice([0, 1, 3, 7, 16]) for _ in range(rng.randint(0, 3)))
        dtype = np.dtype(rng.choice(DTYPES))
        out[name] = (np.arange(int(np.prod(shape)), dtype=np.float64) * 1.5).astype(
            dtype).reshape(shape)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_layouts_are_the_library_s_bytes(seed: int) -> None:
    rng = random.Random(seed)
    tensors = random_state(rng)
    metadata = {"format": "pt"} if seed % 2 else None
    expected = safetensors_numpy.save(tensors, metadata=metadata)
    found = sources(tensors)
    plan = layout([s.spec for s in found], metadata)
    by_name = {s.spec.name: s for s in found}
    body = b"".join(bytes(by_name[e.spec.name].host or b"") for e in plan.entries)
    assert plan.header + body == expected
    assert plan.size == len(expected)
    again = parse(expected, len(expected))
    assert again.entries == plan.entries and again.metadata == metadata


def test_several_metadata_keys_are_sorted_and_the_library_reads_them() -> None:
    tensors = {"a": np.ones(3, dtype=np.float32)}
    meta = {"z": "1", "a": "2", "m": "3"}
    plan = layout([s.spec for s in sources(tensors)], meta)
    text = plan.header[8:].decode().rstrip()
    assert list(json.loads(text)["__metadata__"]) == ["a", "m", "z"]
    loaded = safetensors_numpy.load(plan.header + tensors["a"].tobytes())
    assert np.array_equal(loaded["a"], tensors["a"])


@pytest.mark.parametrize(("spec", "why"), [
    (TensorSpec("x", "F32", (2, 2), 15), "do not hold"),
    (TensorSpec("x", "Q8", (1,), 1), "no safetensors name"),
    (TensorSpec("__metadata__", "U8", (1,), 1), "reserved"),
])
def test_bad_specs_are_refused(spec: TensorSpec, why: str) -> None:
    with pytest.raises(InvalidArgument, match=why):
        layout([spec])


def test_repeated_names_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="repeated"):
        layout([TensorSpec("x", "U8", (1,), 1), TensorSpec("x", "U8", (1,), 1)])


def header(body: bytes) -> bytes:
    return struct.pack("<Q", len(body)) + body


@pytest.mark.parametrize(("data", "why"), [
    (b"\x01\x02", "shorter than its length prefix"),
    (struct.pack("<Q", 1 << 40), "does not fit"),
    (header(b"not json"), "not JSON"),
    (header(b"[1, 2]"), "not a JSON object"),
    (header(b'{"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}}') + b"\0" * 8,
     "do not hold"),
    (header(b'{"x": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}') + b"\0" * 3,
     "does not start"),
    (header(b'{"x": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}') + b"\0" * 5,
     "the file at"),
    (header(b'{"x": {"dtype": "U8", "shape": [-2], "data_offsets": [0, 2]}}') + b"\0" * 2,
     "bad entry"),
])
def test_files_that_are_not_safetensors_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(InvalidArgument, match=why):
        parse(data, len(data))


def test_gpu_loads_read_whole_chunks_in_windows() -> None:
    from mosafs.checkpoint.gpuload import windows

    starts = (0, 5, 10, 30, 31, 60, 61)  # six chunks
    assert windows(starts, 10) == [[0, 1], [2], [3, 4], [5]]
    assert windows(starts, 1000) == [[0, 1, 2, 3, 4, 5]]
    assert windows((0,), 10) == []
    covered = [i for w in windows(starts, 7) for i in w]
    assert covered == list(range(6))
