"""The GPU backend in the family: registry, availability, the stream API beyond feed()
(pinned buffers, batches), and that nothing imports CuPy before a GPU chunker is used."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest

from mosafs.chunking import available_backends, make_chunker, make_hasher
from mosafs.errors import ConfigError

from .conftest import REASON, MiB, random_bytes, triples


def test_importing_the_package_does_not_import_cupy() -> None:
    code = ("import sys; import mosafs.chunking as c, mosafs.chunking.gpu, "
            "mosafs.chunking.gpu_select, mosafs.chunking.oracle; "
            "c.make_chunker('cdc:2048:8192:32768', 'cpu').chunk_all(b'x' * 100000); "
            "c.make_chunker('fixed:4096', 'cpu'); "
            "assert 'cupy' not in sys.modules, sorted(m for m in sys.modules if 'cupy' in m)")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(REASON is None, reason="this host has a usable GPU")
def test_without_a_gpu_asking_for_it_is_a_config_error() -> None:
    assert "gpu" not in available_backends()
    with pytest.raises(ConfigError, match=r"^GPU hash backend requested but \S"):
        make_chunker("cdc:2048:8192:32768", "gpu")
    with pytest.raises(ConfigError, match=r"^GPU hash backend requested but \S"):
        make_hasher("gpu")
    assert make_chunker("cdc:2048:8192:32768").backend == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(REASON is not None, reason=f"no usable GPU here: {REASON}")
class TestWithGpu:
    def test_registered_and_chosen_by_auto(self) -> None:
        assert "gpu" in available_backends()
        assert make_chunker("cdc:2048:8192:32768").backend == "gpu"
        assert make_chunker("fixed:4096", "gpu").backend == "gpu"
        assert make_hasher().backend == "gpu"

    def test_stream_accounting_pinned_and_batches(self) -> None:
        spec = "cdc:2048:8192:32768"
        data = random_bytes(7, 3 * MiB + 11)
        want = triples(make_chunker(spec, "cpu").chunk_all(data))
        chunker = make_chunker(spec, "gpu")
        stream = chunker.stream(pipelined=True)  # type: ignore[call-arg]
        src = np.frombuffer(data, dtype=np.uint8)
        got = []
        offset = 0
        while offset < len(data):
            view = stream.pinned_buffer()
            assert view.dtype == np.uint8 and view.flags.writeable and view.shape[0] >= 1
            size = min(view.shape[0], len(data) - offset, 700_001)
            view[:size] = src[offset:offset + size]
            got += stream.feed_pinned(size)
            offset += size
            assert stream.fed == offset
            assert stream.pending == offset - sum(c.length for c in got)
        got += stream.finish()
        assert triples(got) == want and stream.pending == 0
        with pytest.raises(ValueError, match="finished"):
            stream.feed(b"x")
        with pytest.raises(ValueError, match="finished"):
            stream.finish()

        batches = chunker.stream(pipelined=True, keep_data=False)  # type: ignore[call-arg]
        out = batches.feed_batch(data) + batches.finish_batch()
        offsets = np.concatenate([b.offsets for b in out])
        lengths = np.concatenate([b.lengths for b in out])
        ids = np.concatenate([b.ids for b in out])
        assert [[int(o), int(n), bytes(i).hex()] for o, n, i in
                zip(offsets, lengths, ids, strict=True)] == want
        assert all(b.data is None for b in out)
        with pytest.raises(ValueError, match="without the chunks' bytes"):
            out[0].chunks()

    def test_feed_pinned_beyond_the_buffer_is_refused(self) -> None:
        stream = make_chunker("cdc:2048:8192:32768", "gpu").stream()
        view = stream.pinned_buffer()  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="exceeds"):
            stream.feed_pinned(view.shape[0] + 1)  # type: ignore[attr-defined]

    def test_dropped_streams_give_their_buffers_back(self) -> None:
        from mosafs.chunking import gpu_runtime

        rt = gpu_runtime.GpuRuntime(buffer_size=1 * MiB)
        from mosafs.chunking.gpu import GpuChunker
        from mosafs.chunking.spec import parse_spec

        chunker = GpuChunker(parse_spec("cdc:4096:16384:65536"), rt)
        data = random_bytes(8, 6 * MiB)
        for _ in range(5):
            stream = chunker.stream(pipelined=True)
            stream.feed(data)
            del stream  # never finished
        made = rt.slots_made
        for _ in range(5):
            stream = chunker.stream(pipelined=True)
            stream.feed(data)
            stream.finish()
        assert rt.slots_made == made  # reused, not allocated again

    def test_random_small_feeds_with_tiny_buffers(self) -> None:
        """The smallest buffers a spec allows: a tail carry at almost every buffer."""
        from mosafs.chunking import gpu_runtime
        from mosafs.chunking.gpu import GpuChunker
        from mosafs.chunking.spec import parse_spec

        rt = gpu_runtime.GpuRuntime(buffer_size=32768)
        rng = random.Random(9)
        data = random_bytes(9, 2 * MiB + 5)
        for spec in ("cdc:2048:8192:32768", "cdc:1:256:1024", "fixed:1000", "fixed:32768"):
            want = triples(make_chunker(spec, "cpu").chunk_all(data))
            chunker = GpuChunker(parse_spec(spec), rt)
            stream = chunker.stream(pipelined=rng.random() < 0.5)
            got = []
            offset = 0
            while offset < len(data):
                size = rng.randrange(1, 100_000)
                got += stream.feed(data[offset:offset + size])
                offset += size
            assert triples(got + stream.finish()) == want, spec

    def test_a_bounded_pool_keeps_pinned_memory_within_its_limit(self) -> None:
        """Three streams at once over a pool of two slots: the slots past the bound are
        pageable (same chunks, nobody waits), the pinned bytes stay within the bound, and
        the count comes back down when a runtime's slots are dropped."""
        from mosafs.chunking import gpu_runtime
        from mosafs.chunking.gpu import GpuChunker
        from mosafs.chunking.spec import parse_spec

        spec = parse_spec("cdc:4096:16384:65536")
        before = gpu_runtime.PINNED.bytes
        rt = gpu_runtime.GpuRuntime(buffer_size=MiB,
                                    pinned_limit=2 * (MiB + gpu_runtime.HIST))
        chunker = GpuChunker(spec, rt)
        data = [random_bytes(20 + i, 5 * MiB + i) for i in range(3)]
        want = [triples(make_chunker("cdc:4096:16384:65536", "cpu").chunk_all(d))
                for d in data]
        streams = [chunker.stream(pipelined=True) for _ in data]
        got: list[list] = [[] for _ in data]  # type: ignore[type-arg]
        for offset in range(0, 6 * MiB, 300_000):  # interleaved, as three writers would
            for i, stream in enumerate(streams):
                got[i] += stream.feed(data[i][offset:offset + 300_000])
        for i, stream in enumerate(streams):
            assert triples(got[i] + stream.finish()) == want[i]
        assert rt.slots_made == 2 and rt.pageable_made > 0
        assert rt.pooled_bytes <= rt.pinned_limit  # type: ignore[operator]
        slot_arrays = 3 * 2 * 64 * 1024  # the slots' small work arrays (candidates, digests)
        assert gpu_runtime.PINNED.bytes - before <= rt.pinned_limit + slot_arrays  # type: ignore[operator]
        assert gpu_runtime.PINNED.bytes > before
        del chunker, streams, stream, rt
        import gc

        gc.collect()
        assert gpu_runtime.PINNED.bytes == before

    def test_pool_buffer_size_follows_the_bound(self) -> None:
        from mosafs.chunking import gpu_runtime
        from mosafs.chunking.spec import parse_spec

        spec = parse_spec("cdc:262144:1048576:4194304")
        size = gpu_runtime.pool_buffer_size(spec, 256 * MiB)
        assert 8 * (size + gpu_runtime.HIST) <= 256 * MiB and size > 31 * MiB
        assert gpu_runtime.pool_buffer_size(spec, 8 * MiB) == 4 * MiB  # >= one MAX chunk
        assert gpu_runtime.pool_buffer_size(spec, 4 << 30) == gpu_runtime.DEFAULT_BUFFER
        rt = gpu_runtime.runtime_for(spec, pinned_limit=256 * MiB)
        assert rt.buffer_size == size and rt.pinned_limit == 256 * MiB
