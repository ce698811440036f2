"""Erasure coding of chunks (DESIGN §10): systematic Cauchy Reed-Solomon over GF(2^8).

    coder = make_coder("isal")                 # or "gpu"; ConfigError saying why it can't
    parity = coder.encode(chunk, k, m)         # (M, S) uint8; data fragments are the chunk
    chunk = coder.decode(fragments, k, m, length)
    lost = coder.rebuild(fragments, k, m, wanted)

`spec` holds the layout (fragment size, padding, limits) and imports nothing heavy; the
coders load ISA-L (ctypes) or CuPy only when made.
"""

from mosafs.erasure.base import BytesLike, Coder
from mosafs.erasure.registry import CODER_NAMES, available_coders, make_coder
from mosafs.erasure.spec import ALIGN, MAX_K, MAX_M, MIN_K, MIN_M, Code, Layout, fragment_size

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
