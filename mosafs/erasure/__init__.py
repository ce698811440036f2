"""Erasure coding of chunks (DESIGN §10): systematic Cauchy Reed-Solomon over GF(2^8).

    coder = make_coder("isal")                 # or "gpu"; ConfigError saying why it can't
    parity = coder.encode(chunk, k, m)         # (M, S) uint8; data fragments are the chunk
    chunk = coder.decode(fragments, k, m, length)
    lost = coder.rebuild(fragments, k, m, wanted)

`spec` holds the layout (fragment size, padding, limits) and imports nothing heavy; the
coders load ISA-L (ctypes) or CuPy only when made.
"""

from typing import TYPE_CHECKING, Any

from mosafs.erasure.spec import ALIGN, MAX_K, MAX_M, MIN_K, MIN_M, Code, Layout, fragment_size

if TYPE_CHECKING:
    from mosafs.erasure.base import BytesLike, Coder
    from mosafs.erasure.registry import CODER_NAMES, available_coders, make_coder

# The coders (NumPy, ISA-L, CuPy) load on first use, so that importing `spec` (the manager,
# an admin command) loads none of them.
_LAZY = {"BytesLike": "base", "Coder": "base", "CODER_NAMES": "registry",
         "available_coders": "registry", "make_coder": "registry"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"mosafs.erasure.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "ALIGN",
    "CODER_NAMES",
    "MAX_K",
    "MAX_M",
    "MIN_K",
    "MIN_M",
    "BytesLike",
    "Code",
    "Coder",
    "Layout",
    "available_coders",
    "fragment_size",
    "make_coder",
]
