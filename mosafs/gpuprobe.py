"""Whether this process can use a GPU at all (CuPy installed, a CUDA device seen): asked by
the chunking and the erasure-coding GPU backends alike, before either builds kernels."""

from __future__ import annotations

import importlib
import importlib.util
import warnings


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
