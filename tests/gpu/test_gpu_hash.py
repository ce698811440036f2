"""hash_many on the GPU equals blake3.blake3(x).digest(): empty, tiny and odd lengths
(around the 64-byte block and 1 KiB chunk edges, and BLAKE3 tree levels), unaligned
buffers, batches spread over buffers and devices, buffers larger than a pinned buffer."""

from __future__ import annotations

import random
from typing import Any

import blake3
import numpy as np

from mosafs.chunking import make_hasher
from mosafs.chunking.gpu import GpuHasher

from .conftest import GPU, MiB, random_bytes

pytestmark = GPU

EDGES = [0, 1, 2, 3, 4, 5, 31, 32, 33, 63, 64, 65, 127, 128, 129, 191, 255, 256, 511, 512,
         1000, 1023, 1024, 1025, 1087, 1088, 2047, 2048, 2049, 3071, 3072, 3073, 4095, 4096,
         4097, 8191, 8193, 63 * 1024, 64 * 1024 - 1, 64 * 1024, 64 * 1024 + 1, 65 * 1024,
         65 * 1024 + 1, 128 * 1024 + 3, 129 * 1024, MiB - 1, MiB, MiB + 1, 4 * MiB + 3,
         4 * MiB + 64 * 1024 + 1]


def blake(b: Any) -> bytes:
    return blake3.blake3(bytes(b)).digest()


def test_edge_lengths() -> None:
    data = random_bytes(1, sum(EDGES) + 64)
    buffers = []
    offset = 0
    for n in EDGES:
        buffers.append(data[offset:offset + n])
        offset += n
    ids = make_hasher("gpu").hash_many(buffers)
    assert [i.hex() for i in ids] == [blake(b).hex() for b in buffers]


def test_tiny_buffers_every_alignment() -> None:
    rng = random.Random(2)
    base = random_bytes(2, 70_000)
    view = memoryview(base)
    buffers = []
    for _ in range(2000):
        start = rng.randrange(0, 60_000)
        n = rng.choice([0, 1, rng.randrange(0, 70), rng.randrange(0, 2100)])
        buffers.append(view[start:start + n])
    assert make_hasher("gpu").hash_many(buffers) == [blake(b) for b in buffers]


def test_buffer_kinds_and_empty_list() -> None:
    hasher = make_hasher("gpu")
    data = random_bytes(3, 5000)
    doubled = np.frombuffer(data + data, dtype=np.uint8)
    kinds: list[Any] = [data, bytearray(data), memoryview(data),
                        np.frombuffer(data, dtype=np.uint8), memoryview(data).cast("b"),
                        memoryview(doubled[::2])]  # not contiguous
    assert hasher.hash_many(kinds) == [blake(data)] * 5 + [blake(doubled[::2].tobytes())]
    assert hasher.hash_many([]) == []
    assert hasher.hash_many([b""]) == [blake(b"")]


def test_many_batches_and_big_buffers(runtimes: dict[str, Any]) -> None:
    """Small pinned buffers (1 MiB): thousands of batches over the queues/devices, and
    buffers larger than a pinned buffer (copied to the device as they are)."""
    rng = random.Random(4)
    data = random_bytes(4, 20 * MiB)
    view = memoryview(data)
    sizes = [rng.choice([rng.randrange(0, 5000), rng.randrange(0, 300_000)]) for _ in range(300)]
    sizes += [MiB, MiB + 1, 3 * MiB + 7, 17 * MiB]
    rng.shuffle(sizes)
    buffers = []
    for n in sizes:
        start = rng.randrange(0, len(data) - n + 1)
        buffers.append(view[start:start + n])
    want = [blake(b) for b in buffers]
    for name in ("small", "lanes"):
        assert GpuHasher(runtimes[name]).hash_many(buffers) == want, name


def test_largest_chunk() -> None:
    data = random_bytes(5, 64 * MiB)
    assert make_hasher("gpu").hash_many([data, data[1:], data[:-1]]) == [
        blake(data), blake(data[1:]), blake(data[:-1])]
