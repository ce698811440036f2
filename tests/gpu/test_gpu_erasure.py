"""The GPU erasure coder agrees with ISA-L (DESIGN §10), bit for bit.

    pytest -m gpu tests/gpu/test_gpu_erasure.py

* encode of a chunk already on the device, parity copied back only, for every K 1..16
  with every M 1..4 (chunks ending anywhere in a fragment; coefficients compiled in and
  passed as parameters);
* decode and rebuild on the device after every erasure pattern of up to M fragments, for
  every K+M up to 16+4 (small fragments, so it is quick);
* batches of equal chunks in one launch (rows contiguous, strided, or at an address
  that is not 16-byte aligned: the byte path), a large chunk, a non-default stream, the
  host API, and the benchmark's GPU figures.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import numpy as np
import pytest

from mosafs.erasure.isal import IsalCoder, isal_unavailable_reason
from tests.gpu.conftest import GPU

ISAL_REASON = isal_unavailable_reason()
pytestmark = [*GPU, pytest.mark.skipif(ISAL_REASON is not None,
                                       reason=f"the GPU coder needs ISA-L: {ISAL_REASON}")]
MiB = 1 << 20


@pytest.fixture(scope="module")
def gpu() -> Any:
    from mosafs.erasure import make_coder

    return make_coder("gpu")


@pytest.fixture(scope="module")
def cpu() -> IsalCoder:
    return IsalCoder()


def chunk_bytes(rng: random.Random, length: int) -> bytes:
    return rng.randbytes(length)


def lengths_for(k: int) -> tuple[int, ...]:
    """1 byte; ending mid-fragment (partial 16-byte group); whole fragments of 128."""
    return (1, max(1, 128 * k - 7), 128 * k)


def on_device(cp: Any, data: bytes | np.ndarray) -> Any:
    return cp.asarray(np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data)


@pytest.mark.parametrize("k", range(1, 17))
def test_encode_matches_isal(cp: Any, gpu: Any, cpu: IsalCoder, k: int) -> None:
    rng = random.Random(k)
    for m, length in itertools.product(range(1, 5), lengths_for(k)):
        chunk = chunk_bytes(rng, length)
        want = cpu.encode(chunk, k, m)
        dev = on_device(cp, chunk)
        host = gpu.encode_to_host(dev, k, m)
        assert isinstance(host, np.ndarray) and host.shape == want.shape
        assert (host == want).all(), (k, m, length)
        params = gpu.encode_device(dev, k, m, baked=False)
        assert isinstance(params, cp.ndarray)
        assert (params.get() == want).all(), (k, m, length, "params")


def erasure_patterns(n: int, m: int) -> list[tuple[int, ...]]:
    return [p for e in range(1, m + 1) for p in itertools.combinations(range(n), e)]


@pytest.mark.parametrize("k", range(1, 17))
def test_every_erasure_pattern(cp: Any, gpu: Any, cpu: IsalCoder, k: int) -> None:
    """Decode (the chunk) and rebuild (the erased fragments) on the device, for every
    pattern of up to M erasures, M 1..4."""
    rng = random.Random(100 + k)
    for m in range(1, 5):
        length = lengths_for(k)[1]
        chunk = chunk_bytes(rng, length)
        frags = [bytes(f) for f in cpu.fragments(chunk, k, m)]
        dev = {i: on_device(cp, f) for i, f in enumerate(frags)}
        for erased in erasure_patterns(k + m, m):
            kept = {i: d for i, d in dev.items() if i not in erased}
            decoded = gpu.decode_device(kept, k, m, length)
            assert decoded.shape == (length,)
            assert decoded.get().tobytes() == chunk, (k, m, erased)
            rebuilt = gpu.rebuild_device(kept, k, m, erased)
            assert sorted(rebuilt) == list(erased)
            for i in erased:
                assert rebuilt[i].get().tobytes() == frags[i], (k, m, erased, i)


def test_batches(cp: Any, gpu: Any, cpu: IsalCoder) -> None:
    """(B, L) chunks in one launch: contiguous rows, rows of a wider array, and rows at
    an odd address (every access then goes byte by byte)."""
    rng = np.random.default_rng(3)
    for k, m, length in ((4, 2, 1000), (8, 2, MiB), (10, 4, 12345)):
        wide = rng.integers(0, 256, (5, length + 35), dtype=np.uint8)
        host_rows = {"contiguous": np.ascontiguousarray(wide[:, :length]),
                     "strided": wide[:, :length], "unaligned": wide[:, 3:3 + length]}
        dev_wide = cp.asarray(wide)
        dev_rows = {"contiguous": cp.asarray(host_rows["contiguous"]),
                    "strided": dev_wide[:, :length], "unaligned": dev_wide[:, 3:3 + length]}
        for name, rows in dev_rows.items():
            parity = gpu.encode_device(rows, k, m)
            assert parity.shape[:2] == (5, m)
            got = parity.get()
            for b in range(5):
                want = cpu.encode(np.ascontiguousarray(host_rows[name][b]), k, m)
                assert (got[b] == want).all(), (k, m, name, b)


def test_large_chunk_and_stream(cp: Any, gpu: Any, cpu: IsalCoder) -> None:
    """A 64 MiB chunk (odd length) on a non-blocking stream; decode of M lost data
    fragments on the same stream."""
    rng = np.random.default_rng(4)
    length = 64 * MiB - 3
    host = rng.integers(0, 256, length, dtype=np.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        dev = cp.asarray(host)
    for k, m in ((4, 2), (8, 2), (16, 4)):
        want = cpu.encode(host, k, m)
        parity = gpu.encode_device(dev, k, m, stream=stream)
        stream.synchronize()
        assert (parity.get() == want).all(), (k, m)
        size = want.shape[1]
        frags = {j: dev[j * size:(j + 1) * size] for j in range(m, k) if (j + 1) * size <= length}
        frags[k - 1] = cp.asarray(np.pad(host[(k - 1) * size:], (0, k * size - length)))
        frags.update({k + i: parity[i] for i in range(m)})
        decoded = gpu.decode_device(frags, k, m, length, stream=stream)
        stream.synchronize()
        assert bool((decoded == dev).all()), (k, m)


def test_host_api(gpu: Any, cpu: IsalCoder) -> None:
    """encode/decode/rebuild with host buffers, as the Coder interface has them."""
    rng = random.Random(6)
    for k, m in ((4, 2), (6, 3), (12, 4)):
        chunk = chunk_bytes(rng, 100_000 + k)
        assert (gpu.encode(chunk, k, m) == cpu.encode(chunk, k, m)).all()
        frags = [bytes(f) for f in cpu.fragments(chunk, k, m)]
        erased = sorted(rng.sample(range(k + m), m))
        kept = {i: f for i, f in enumerate(frags) if i not in erased}
        assert gpu.decode(kept, k, m, len(chunk)) == chunk
        rebuilt = gpu.rebuild(kept, k, m, erased)
        assert [bytes(rebuilt[i]) for i in erased] == [frags[i] for i in erased]


def test_bad_device_input(cp: Any, gpu: Any) -> None:
    from mosafs.errors import ConfigError, InvalidArgument

    with pytest.raises(InvalidArgument, match="uint8 CuPy array"):
        gpu.encode_device(np.zeros(100, np.uint8), 4, 2)
    with pytest.raises(InvalidArgument, match="uint8 CuPy array"):
        gpu.encode_device(cp.zeros(100, cp.float32), 4, 2)
    with pytest.raises(ConfigError, match="erasure code"):
        gpu.encode_device(cp.zeros(100, cp.uint8), 4, 9)
    frags = {i: cp.zeros(64, cp.uint8) for i in range(3)}
    with pytest.raises(InvalidArgument, match="need 4 fragments"):
        gpu.decode_device(frags, 4, 2, 200)


def test_prepared_launches_rerun(cp: Any, gpu: Any, cpu: IsalCoder) -> None:
    """prepare_encode / prepare_rebuild: built once, each run rewrites the same outputs
    from whatever the inputs hold then."""
    rng = np.random.default_rng(8)
    k, m, length = 6, 3, 50_000
    dev = cp.asarray(rng.integers(0, 256, length, dtype=np.uint8))
    launch, parity = gpu.prepare_encode(dev, k, m)
    for _ in range(2):
        dev[:] = cp.asarray(rng.integers(0, 256, length, dtype=np.uint8))
        launch()
        want = cpu.encode(dev.get(), k, m)
        assert (parity.get() == want).all()
    size = want.shape[1]
    frags = {j: dev[j * size:(j + 1) * size] for j in range(2, k - 1)}
    frags[k - 1] = cp.asarray(np.pad(dev[(k - 1) * size:].get(), (0, k * size - length)))
    frags.update({k + i: parity[i] for i in range(m)})
    rebuild, out = gpu.prepare_rebuild(frags, k, m, [0, 1])
    rebuild()
    assert out[0].get().tobytes() == dev[:size].get().tobytes()
    assert out[1].get().tobytes() == dev[size:2 * size].get().tobytes()


def test_benchmark_gpu_figures() -> None:
    from mosafs.bench.ec_coders import run_ec_coder_benchmark

    result = run_ec_coder_benchmark(quick=True)
    for shape in ("4+2", "8+2"):
        row = result["gpu"][shape]
        assert row["verified"] is True
        assert row["kernel_encode_batch_GBps"] > 0 and row["decode_device_2_lost_big_GBps"] > 0
        assert result["isal"][shape]["encode_GBps_1_thread"] > 0
