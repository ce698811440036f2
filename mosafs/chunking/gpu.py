"""The GPU member of the backend family (DESIGN §6): CuPy kernels for content addressing.

    chunker = make_chunker(spec, "gpu")           # ConfigError, saying why, without a GPU
    stream = chunker.stream()                     # like the CPU's: feed() returns what it cut
    stream = chunker.stream(pipelined=True)       # buffers in flight; chunks come later
    view = stream.pinned_buffer()                 # fill the pinned buffer in place ...
    chunks = stream.feed_pinned(k)                # ... and hand over its first k bytes
    stream = chunker.stream(parity=(4, 2, 131072))  # chunk.parity: ec:4+2 on the GPU too
    ids = make_hasher("gpu").hash_many(buffers)

How it works (docs/gpu.md): the gear candidate kernel finds, for every byte, whether its
windowed hash passes the loose or the strict mask and writes the few that do to a compact
list; the host selects cut points from those candidates (sequential, cheap); the BLAKE3
kernels hash every chunk of the buffer at once, one thread per 1 KiB BLAKE3 chunk, then
the tree levels. `gpu_runtime` holds the pinned buffers, CUDA streams and devices,
`gpu_stream` the chunk stream over them (`gpu_parity` its erasure parity stage),
`gpu_kernels` the CUDA source, `gpu_select` the host-side selection.

CuPy is imported only when a GPU chunker or hasher is first used, never at import of
mosafs.chunking (it takes seconds and needs a driver). Without CuPy or a device, "gpu"
is unavailable with the reason, and asking for it is a ConfigError (registry): there is
no silent CPU fallback. `threads` is accepted for the family's signature and unused: the
GPU does the parallel work.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mosafs.chunking.base import Backend, BytesLike, Chunk, Chunker, Hasher
from mosafs.chunking.spec import ChunkerSpec
from mosafs.gpuprobe import probe_gpu as probe_gpu  # part of this module's API

if TYPE_CHECKING:
    from mosafs.chunking.gpu_runtime import GpuRuntime
    from mosafs.chunking.gpu_stream import GpuStream, Profile


@functools.cache
def gpu_unavailable_reason() -> str | None:
    """probe_gpu(), then building the kernels, once per process: devices do not come and
    go under a mount, and a CUDA install that cannot compile is no usable GPU either."""
    reason = probe_gpu()
    if reason is not None:
        return reason
    try:
        from mosafs.chunking import gpu_runtime

        gpu_runtime.runtime()
    except Exception as exc:
        return f"the GPU kernels could not be set up ({type(exc).__name__}: {exc})"
    return None


class GpuChunker(Chunker):
    """Chunker on the GPU runtime; `runtime` (tests, benchmarks) picks buffers/devices."""

    backend = "gpu"
    computes_parity = True
    """stream(parity=...) gives each chunk its erasure parity (the client's write path
    asks for it in erasure-coded pools instead of coding on the CPU)."""

    def __init__(self, spec: ChunkerSpec, runtime: GpuRuntime | None = None, *,
                 pinned_bytes: int | None = None) -> None:
        super().__init__(spec)
        self._rt = runtime
        self._pinned_bytes = pinned_bytes  # the pinned pool's bound (None: unbounded)

    @property
    def runtime(self) -> GpuRuntime:
        if self._rt is None:
            from mosafs.chunking import gpu_runtime

            self._rt = gpu_runtime.runtime_for(self.spec, pinned_limit=self._pinned_bytes)
        return self._rt

    def stream(self, *, pipelined: bool = False, keep_data: bool = True,
               profile: Profile | None = None,
               parity: tuple[int, int, int] | None = None,
               device_input: int | None = None) -> GpuStream:
        """A new stream; see gpu_stream.GpuStream for the options (parity=(K, M,
        MIN_CHUNK): each chunk's erasure parity computed on the GPU too; device_input=D:
        the bytes are on GPU D already)."""
        from mosafs.chunking.gpu_stream import GpuStream

        return GpuStream(self.runtime, self.spec, pipelined=pipelined, keep_data=keep_data,
                         profile=profile, parity=parity, device_input=device_input)

    def chunk_all(self, data: BytesLike) -> list[Chunk]:
        stream = self.stream(pipelined=True)
        chunks = stream.feed(data)
        return chunks + stream.finish()


class GpuHasher(Hasher):
    backend = "gpu"

    def __init__(self, runtime: GpuRuntime | None = None) -> None:
        self._rt = runtime

    def hash_many(self, buffers: Sequence[BytesLike]) -> list[bytes]:
        if not buffers:
            return []
        from mosafs.chunking import gpu_runtime

        if self._rt is None:
            self._rt = gpu_runtime.runtime()
        return gpu_runtime.hash_many(self._rt, buffers)


class GpuBackend(Backend):
    name = "gpu"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return gpu_unavailable_reason()

    def chunker(self, spec: ChunkerSpec, threads: int, *,
                pinned_bytes: int | None = None) -> GpuChunker:
        return GpuChunker(spec, pinned_bytes=pinned_bytes)

    def hasher(self, threads: int) -> GpuHasher:
        return GpuHasher()


def device_names() -> list[str]:
    """Names of the visible CUDA devices (imports CuPy)."""
    from mosafs.chunking import gpu_runtime

    return gpu_runtime.visible_devices()


__all__ = ["GpuBackend", "GpuChunker", "GpuHasher", "device_names", "gpu_unavailable_reason",
           "probe_gpu"]
