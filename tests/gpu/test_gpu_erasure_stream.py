"""The GPU chunk stream's parity stage (docs/gpu.md) gives ISA-L's parity, bit for bit.

    pytest -m gpu tests/gpu/test_gpu_erasure_stream.py

* every chunk of a multi-buffer random input, for 4+2, 8+2, 10+4 and 3+3, with and
  without a threshold (chunks below it get no parity), CDC lengths (not multiples of
  64), fixed-size chunks and the last partial chunk, pipelined and not, on the default
  runtime, 1 MiB buffers (many chunks carried across buffers) and two queues per GPU;
* batches (keep_data=False, pinned buffers filled in place): parity views valid until
  release, host blocks reused afterwards; a bounded pinned pool (pageable slots and
  parity blocks past it);
* the ragged kernel alone on a device buffer: chunks packed back to back at every
  alignment, a 64 MiB chunk, the next chunk's bytes never taken for padding;
* the write pipeline: the stream is made with parity in an EC pool on the GPU backend,
  and its fragments (ids, PutChunk messages) equal the CPU coder's;
* no parity asked for: chunks and batches carry none; a bad K+M is a ConfigError.

Without a GPU (or ISA-L, where the matrices come from) every test here is skipped with
the reason.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from mosafs.client.files.pipeline import EcPolicy, _open_stream
from mosafs.client.files.uploads import encode as _encode
from mosafs.erasure.isal import IsalCoder, isal_unavailable_reason
from mosafs.errors import ConfigError
from tests.gpu.conftest import GPU, MiB, chunker_on, feed_pieces, random_bytes

ISAL_REASON = isal_unavailable_reason()
pytestmark = [*GPU, pytest.mark.skipif(ISAL_REASON is not None,
                                       reason=f"GPU parity uses ISA-L's matrices: {ISAL_REASON}")]
SMALL_SPEC = "cdc:16384:65536:262144"


@pytest.fixture(scope="module")
def cpu() -> IsalCoder:
    return IsalCoder()


def check_chunks(cpu: IsalCoder, chunks: list[Any], data: bytes, k: int, m: int,
                 min_chunk: int) -> int:
    """The chunks tile DATA; those of at least MIN_CHUNK bytes carry ISA-L's parity, the
    others none. Returns how many were coded."""
    offset = coded = 0
    for c in chunks:
        assert c.offset == offset and c.data == data[offset:offset + c.length]
        offset += c.length
        if c.length < max(1, min_chunk):
            assert c.parity is None, (c.offset, c.length)
            continue
        want = cpu.encode(c.data, k, m)
        assert c.parity is not None and len(c.parity) == m
        for r in range(m):
            assert bytes(c.parity[r]) == want[r].tobytes(), (k, m, c.offset, c.length, r)
        coded += 1
    assert offset == len(data)
    return coded


SHAPES = [(4, 2, 1), (8, 2, 1), (4, 2, 100_000), (8, 2, 70_000), (10, 4, 40_000),
          (3, 3, 1)]


@pytest.mark.parametrize(("k", "m", "min_chunk"), SHAPES)
@pytest.mark.parametrize("rt_name", ["small", "lanes"])
def test_stream_parity_equals_isal(runtimes: dict[str, Any], cpu: IsalCoder, rt_name: str,
                                   k: int, m: int, min_chunk: int) -> None:
    """1 MiB buffers: ~7 buffers, a chunk carried across nearly every boundary."""
    data = random_bytes(k * 100 + m, 7 * MiB + 12345)
    rng = random.Random(min_chunk)
    for pipelined in (True, False):
        stream = chunker_on(SMALL_SPEC, runtimes[rt_name]).stream(
            pipelined=pipelined, parity=(k, m, min_chunk))
        assert stream.parity == (k, m, min_chunk)
        chunks = feed_pieces(stream, data, rng, 3 * MiB)
        coded = check_chunks(cpu, chunks, data, k, m, min_chunk)
        assert coded > 0 and (min_chunk == 1) == (coded == len(chunks))


@pytest.mark.parametrize(("k", "m", "min_chunk"), [(4, 2, 128 << 10), (8, 2, 1)])
def test_stream_parity_default_runtime(cpu: IsalCoder, k: int, m: int, min_chunk: int) -> None:
    """The default chunker and 64 MiB buffers, as a mount runs them: 3 buffers and a bit,
    the last chunk partial."""
    data = random_bytes(11, 3 * 64 * MiB + 4097)
    stream = chunker_on("cdc:262144:1048576:4194304", None).stream(
        pipelined=True, parity=(k, m, min_chunk))
    chunks = feed_pieces(stream, data, random.Random(3), 48 * MiB)
    assert check_chunks(cpu, chunks, data, k, m, min_chunk) >= len(chunks) - 1


@pytest.mark.parametrize("spec", ["fixed:1000", "fixed:100003"])
def test_fixed_lengths_and_the_last_partial_chunk(runtimes: dict[str, Any], cpu: IsalCoder,
                                                  spec: str) -> None:
    data = random_bytes(12, 3 * MiB + 777)
    stream = chunker_on(spec, runtimes["small"]).stream(pipelined=True, parity=(4, 2, 1))
    chunks = feed_pieces(stream, data, random.Random(5), MiB)
    assert chunks[-1].length < chunks[0].length
    assert check_chunks(cpu, chunks, data, 4, 2, 1) == len(chunks)


def test_batches_hold_parity_until_released(runtimes: dict[str, Any], cpu: IsalCoder) -> None:
    """keep_data=False, bytes written into the pinned buffers in place: each batch's parity
    views equal ISA-L's until release; released blocks serve later streams."""
    rt = runtimes["small"]
    data = np.frombuffer(random_bytes(13, 9 * MiB + 5), dtype=np.uint8)

    def run() -> int:
        stream = chunker_on(SMALL_SPEC, rt).stream(pipelined=True, keep_data=False,
                                                   parity=(8, 2, 70_000))
        checked = offset = 0
        batches = []
        while offset < data.shape[0]:
            view = stream.pinned_buffer()
            size = min(view.shape[0], data.shape[0] - offset, 300_001)
            view[:size] = data[offset:offset + size]
            batches += stream.feed_pinned_batch(size)
            offset += size
        batches += stream.finish_batch()
        for batch in batches:
            assert batch.parity is not None and len(batch.parity) == len(batch)
            for i, (at, n) in enumerate(zip(batch.offsets.tolist(), batch.lengths.tolist(),
                                            strict=True)):
                frags = batch.parity.fragments(i)
                if n < 70_000:
                    assert frags is None
                    continue
                want = cpu.encode(data[at:at + n], 8, 2)
                assert frags is not None
                assert [bytes(f) for f in frags] == [w.tobytes() for w in want], (at, n)
                checked += 1
            batch.release()
            with pytest.raises(ValueError, match="released"):
                batch.parity.fragments(0)
        return checked

    assert run() > 0
    made = rt.parity_bytes
    assert made > 0
    run()
    assert rt.parity_bytes == made  # the blocks came back and were reused


def test_bounded_pool_parity_in_pageable_memory(cpu: IsalCoder) -> None:
    """Past the pinned pool's bound, slots and parity blocks are pageable (copies wait
    for the host): the parity is the same."""
    from mosafs.chunking import gpu_runtime

    rt = gpu_runtime.GpuRuntime(buffer_size=MiB, pinned_limit=3 * MiB)
    data = random_bytes(14, 6 * MiB + 99)
    stream = chunker_on(SMALL_SPEC, rt).stream(pipelined=True, parity=(4, 2, 1))
    chunks = feed_pieces(stream, data, random.Random(8), 2 * MiB)
    assert check_chunks(cpu, chunks, data, 4, 2, 1) == len(chunks)
    assert rt.pageable_made > 0
    assert rt.pooled_bytes + rt.parity_bytes <= 3 * MiB


def packed(rng: np.random.Generator, lengths: list[int], lead: int) -> tuple[np.ndarray,
                                                                           list[int]]:
    total = lead + sum(lengths) + 256
    host = rng.integers(0, 256, total, dtype=np.uint8)
    return host, (lead + np.cumsum([0, *lengths[:-1]])).tolist()


@pytest.mark.parametrize(("k", "m"), [(4, 2), (8, 2), (16, 4), (1, 1)])
def test_ragged_kernel_on_the_device(cp: Any, cpu: IsalCoder, k: int, m: int) -> None:
    """Chunks of edge lengths back to back from every start alignment: the padding of
    each is zeros, never its neighbour's bytes."""
    from mosafs.erasure.gpu_batch import encode_ragged

    rng = np.random.default_rng(k * 10 + m)
    lengths = [1, 15, 16, 17, 63, 64, 65, 64 * k - 1, 64 * k + 1, 4097, 65536 * k + 3,
               *rng.integers(1, 600_000, 20).tolist()]
    for lead in (0, 1, 7, 16, 33):
        host, offsets = packed(rng, lengths, lead)
        plan, parity = encode_ragged(cp.asarray(host), offsets, lengths, k, m, 16)
        got = parity.get()
        assert plan.chosen.tolist() == [i for i, n in enumerate(lengths) if n >= 16]
        for n, i in enumerate(plan.chosen.tolist()):
            want = cpu.encode(host[offsets[i]:offsets[i] + lengths[i]], k, m)
            start, size = int(plan.parity_offsets[n]), int(plan.sizes[n])
            assert (got[start:start + m * size].reshape(m, size) == want).all(), \
                (k, m, lead, lengths[i])


def test_ragged_kernel_large_chunk(cp: Any, cpu: IsalCoder) -> None:
    rng = np.random.default_rng(1)
    lengths = [64 * MiB - 5, 3 * MiB + 1]
    host, offsets = packed(rng, lengths, 9)
    from mosafs.erasure.gpu_batch import encode_ragged

    plan, parity = encode_ragged(cp.asarray(host), offsets, lengths, 4, 2)
    got = parity.get()
    for n in range(2):
        want = cpu.encode(host[offsets[n]:offsets[n] + lengths[n]], 4, 2)
        start, size = int(plan.parity_offsets[n]), int(plan.sizes[n])
        assert (got[start:start + 2 * size].reshape(2, size) == want).all(), n


def test_write_pipeline_uses_the_stream_parity(runtimes: dict[str, Any], cpu: IsalCoder) -> None:
    """The pipeline opens a parity stream on the GPU backend in an EC pool (not without
    one, nor on the CPU backend); the fragments it then stores equal the CPU coder's."""
    from mosafs.chunking import make_chunker

    chunker = chunker_on(SMALL_SPEC, runtimes["small"])
    ec = EcPolicy(4, 2, 100_000)
    stream = _open_stream(chunker, ec)
    assert stream.parity == (4, 2, 100_000)
    assert _open_stream(chunker, None).parity is None
    assert getattr(_open_stream(make_chunker(SMALL_SPEC, "cpu"), ec), "parity", None) is None
    data = random_bytes(17, 4 * MiB + 3)
    chunks = feed_pieces(stream, data, random.Random(1), MiB)
    coded = [c for c in chunks if c.parity is not None]
    assert coded
    for c in coded:
        got, expect = _encode(None, c.data, 4, 2, c.parity), _encode(cpu, c.data, 4, 2)
        assert got[0] == expect[0]
        assert [bytes(f) for f in got[1]] == [bytes(f) for f in expect[1]]


def test_without_parity_nothing_changes(runtimes: dict[str, Any]) -> None:
    stream = chunker_on(SMALL_SPEC, runtimes["small"]).stream(pipelined=True, keep_data=False)
    assert stream.parity is None
    batches = stream.feed_batch(random_bytes(2, 3 * MiB)) + stream.finish_batch()
    assert batches and all(b.parity is None for b in batches)
    for b in batches:
        b.release()  # harmless without parity
    chunks = chunker_on(SMALL_SPEC, runtimes["small"]).chunk_all(random_bytes(3, MiB))
    assert all(c.parity is None for c in chunks)


def test_profile_times_the_parity_stage(runtimes: dict[str, Any]) -> None:
    from mosafs.chunking.gpu_stream import Profile

    profile = Profile()
    stream = chunker_on(SMALL_SPEC, runtimes["small"]).stream(
        pipelined=True, keep_data=False, profile=profile, parity=(4, 2, 1))
    for batch in stream.feed_batch(random_bytes(4, 4 * MiB)) + stream.finish_batch():
        batch.release()
    assert profile.as_dict().get("parity_s", 0) > 0


@pytest.mark.parametrize("shape", [(0, 2, 1), (4, 0, 1), (40, 2, 1)])
def test_bad_shape_is_a_config_error(runtimes: dict[str, Any],
                                     shape: tuple[int, int, int]) -> None:
    with pytest.raises(ConfigError):
        chunker_on(SMALL_SPEC, runtimes["small"]).stream(parity=shape)
