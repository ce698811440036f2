"""Shared pieces of the GPU backend's tests.

Tests that need a GPU carry `GPU` (the `gpu` marker plus a skip, with probe_gpu()'s
reason, where CuPy or a device is missing); the rest run everywhere.
"""

from __future__ import annotations

import json
import random
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from mosafs.chunking import Chunk
from mosafs.chunking.gpu import probe_gpu
from tests.conftest import VECTORS
from tests.unit.test_chunking import mixed as mixed  # shared with the unit tests
from tests.unit.test_chunking import triples as triples
from tests.unit.test_chunking import vector_input as vector_input

REASON = probe_gpu()
GPU = [pytest.mark.gpu,
       pytest.mark.skipif(REASON is not None, reason=f"no usable GPU here: {REASON}")]

MiB = 1 << 20


def load_vectors() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads(VECTORS.read_text())["cases"]
    assert cases, f"{VECTORS} holds no cases"
    return cases


def random_sizes(total: int, rng: random.Random, largest: int) -> Iterator[int]:
    """Log-uniform piece sizes between 1 and `largest` covering `total` bytes."""
    offset = 0
    while offset < total:
        size = min(total - offset, int(2 ** rng.uniform(0, np.log2(max(2, largest)))))
        yield size
        offset += size


def feed_pieces(stream: Any, data: bytes, rng: random.Random, largest: int) -> list[Chunk]:
    view = memoryview(data)
    chunks: list[Chunk] = []
    offset = 0
    for size in random_sizes(len(data), rng, largest):
        chunks += stream.feed(view[offset:offset + size])
        offset += size
    return chunks + stream.finish()


def feed_pinned(stream: Any, data: bytes, rng: random.Random, largest: int) -> list[Chunk]:
    """Write the data straight into the stream's pinned buffers, in random amounts."""
    src = np.frombuffer(data, dtype=np.uint8)
    chunks: list[Chunk] = []
    offset = 0
    while offset < len(data):
        view = stream.pinned_buffer()
        size = min(view.shape[0], len(data) - offset, int(2 ** rng.uniform(0, np.log2(largest))))
        view[:size] = src[offset:offset + size]
        chunks += stream.feed_pinned(size)
        offset += size
    return chunks + stream.finish()


def random_bytes(seed: int, n: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.fixture(scope="session")
def runtimes() -> dict[str, Any]:
    """GPU runtimes: the default one, small buffers (many tail carries), and small
    buffers over two queues per GPU (every GPU visible, each listed twice), so buffers
    alternate between queues (and devices) as on a multi-GPU host."""
    from mosafs.chunking import gpu_runtime

    count = len(gpu_runtime.visible_devices())
    return {
        "default": None,
        "small": gpu_runtime.GpuRuntime(buffer_size=1 * MiB),
        "lanes": gpu_runtime.GpuRuntime(buffer_size=1 * MiB,
                                        devices=[d for d in range(count) for _ in (0, 1)]),
    }


_BIGGER: dict[tuple[int, tuple[int, ...]], Any] = {}


def chunker_on(spec: str, rt: Any) -> Any:
    """A GPU chunker for spec on runtime rt (None: the process-wide default); where a MAX
    chunk does not fit rt's buffers, a runtime like rt with buffers of MAX bytes."""
    from mosafs.chunking import gpu_runtime, parse_spec
    from mosafs.chunking.gpu import GpuChunker

    parsed = parse_spec(spec)
    if rt is not None and parsed.max_size > rt.buffer_size:
        key = (parsed.max_size, tuple(d.index for d in rt.devices))
        if key not in _BIGGER:
            _BIGGER[key] = gpu_runtime.GpuRuntime(buffer_size=key[0], devices=list(key[1]))
        rt = _BIGGER[key]
    return GpuChunker(parsed, rt)


@pytest.fixture(scope="module")
def cp() -> Any:
    """CuPy, imported quietly (its import warns about the CUDA path on some hosts)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import cupy
    return cupy
