"""`mosafs.checkpoint.load` / `load_numpy` to the host building tensors from a file's
bytes (docs/checkpoint.md, "Loading"): files of other writers load as long as they are
safetensors files, tensors at offsets that are not a multiple of their element size
included (the format does not ask for alignment; mosafs and the library align theirs).

The file's bytes reach load() as read_file gives them: parsed by the real parser into
the buffer read_file allocates. Only the cluster is left out (tests/fuse covers it)."""

from __future__ import annotations

import concurrent.futures
import json
import struct
from typing import Any

import numpy as np
import pytest

from mosafs.checkpoint import api
from mosafs.checkpoint.format import parse
from mosafs.checkpoint.loading import Loaded

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
safetensors_numpy = pytest.importorskip("safetensors.numpy")


def packed_file(arrays: dict[str, np.ndarray]) -> bytes:
    """ARRAYS as a safetensors file, in this order, each right after the previous one (no
    padding between tensors, as another writer may pack them)."""
    names = {"uint8": "U8", "float32": "F32", "int64": "I64", "float16": "F16",
             "bool": "BOOL", "complex64": "C64", "int16": "I16", "float64": "F64"}
    header, body = {}, b""
    for name, array in arrays.items():
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": names[array.dtype.name], "shape": list(array.shape),
                        "data_offsets": [len(body), len(body) + len(data)]}
        body += data
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body


class Cluster:
    """What `api.client(where)` gives, over the bytes of one file."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def submit(self, fn: Any, where: Any, alloc: Any) -> concurrent.futures.Future[Loaded]:
        buffer = alloc(len(self.data))
        buffer[:] = np.frombuffer(self.data, dtype=np.uint8)
        future: concurrent.futures.Future[Loaded] = concurrent.futures.Future()
        future.set_result(Loaded(parse(self.data, len(self.data)), buffer, 1))
        return future


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Any:
    def serve_file(data: bytes) -> None:
        monkeypatch.setattr(api, "target", lambda path: path)
        monkeypatch.setattr(api, "client", lambda where: Cluster(data))

    return serve_file


UNALIGNED = {  # offsets 0, 3, 19, 27, 33, 34, 34, 42, 48
    "a.bytes": np.array([1, 2, 3], dtype=np.uint8),
    "b.f32": np.array([[1.5, -2.5], [3.25, 1e30]], dtype=np.float32),
    "c.scalar": np.array(-(2**40), dtype=np.int64),
    "d.f16": np.array([0.5, 65504.0, -1.0], dtype=np.float16),
    "e.flag": np.array([True]),
    "f.empty": np.zeros((0, 4), dtype=np.float64),
    "g.c64": np.array([1 + 2j], dtype=np.complex64),
    "h.i16": np.array([-7, 300, 12345], dtype=np.int16),
    "i.f64": np.array([np.pi], dtype=np.float64),
}


def test_unit_checkpoint_load_of_an_unaligned_file_is_the_library_s(serve: Any) -> None:
    data = packed_file(UNALIGNED)
    serve(data)
    expected = safetensors_torch.load(data)  # the library reads it
    got = api.load("/unused/model.safetensors")
    assert list(got) == sorted(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name], tensor), name
    expected_np = safetensors_numpy.load(data)
    got_np = api.load_numpy("/unused/model.safetensors")
    for name, array in expected_np.items():
        assert got_np[name].dtype == array.dtype, name
        assert np.array_equal(got_np[name], array), name
        assert got_np[name].flags.aligned and got_np[name].flags.owndata, name


def test_unit_checkpoint_load_of_an_aligned_file_is_the_library_s(serve: Any) -> None:
    tensors = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
               "b": torch.tensor([1, 2, 3], dtype=torch.uint8),
               "s": torch.tensor(5, dtype=torch.int64)}
    data = safetensors_torch.save(tensors)
    serve(data)
    got = api.load("/unused/model.safetensors")
    for name, tensor in tensors.items():
        assert torch.equal(got[name], tensor), name
