"""The GPU member of the backend family (DESIGN §6): for now only its availability check.

The CuPy kernels (gear candidates, batched BLAKE3) are later work; they replace
`GpuBackend` by registering a class of the same name. Until then "gpu" is never
available, so "auto" picks the CPU and an explicit "gpu" is a clear error, not a silent
fallback. CuPy is imported only when asked, never at module import (it takes seconds and
needs a driver).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import warnings

from mosafs.chunking.base import Backend, Chunker, Hasher
from mosafs.chunking.spec import ChunkerSpec

NOT_BUILT = "this version of mosafs has no GPU kernels yet (use the 'cpu' or 'auto' backend)"


def probe_gpu() -> str | None:
    """None when CuPy is installed and sees a CUDA device, else why not."""
    try:
        found = importlib.util.find_spec("cupy") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return "CuPy is not installed (install mosafs[gpu], i.e. cupy-cuda12x)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # CuPy warns about CUDA paths on import
            cupy = importlib.import_module("cupy")
            count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # any failure here means "no usable GPU", with the reason
        return f"CuPy cannot use a CUDA device ({type(exc).__name__}: {exc})"
    if count < 1:
        return "CuPy sees no CUDA device"
    return None


@functools.cache
def gpu_unavailable_reason() -> str | None:
    """probe_gpu(), once per process: devices do not come and go under a mount."""
    return probe_gpu()


class GpuBackend(Backend):
    name = "gpu"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return gpu_unavailable_reason() or NOT_BUILT

    def chunker(self, spec: ChunkerSpec, threads: int) -> Chunker:
        raise NotImplementedError(NOT_BUILT)

    def hasher(self, threads: int) -> Hasher:
        raise NotImplementedError(NOT_BUILT)
