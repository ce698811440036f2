"""The coder interface (DESIGN §10) and the argument checks every coder shares.

A coder turns one chunk into M parity fragments and any K fragments back into the chunk
or into the fragments that were lost. Data fragments are never materialized by a coder:
data fragment j is the chunk's own bytes [jS, (j+1)S) (zero-padded past the chunk's end),
so the caller stores slices of the chunk it already holds and only parity is new memory.

    coder = make_coder("isal")                  # mosafs.erasure.registry
    parity = coder.encode(chunk, 4, 2)          # numpy uint8 (M, S), written in place
    frags = coder.fragments(chunk, 4, 2)        # all K+M as buffers (views where possible)
    chunk = coder.decode({0: f0, 2: f2, 4: f4, 5: f5}, 4, 2, len(chunk))
    lost = coder.rebuild({0: f0, 1: f1, 2: f2, 5: f5}, 4, 2, [3, 4])

Errors: a bad K or M is a ConfigError (a pool setting); fragments of the wrong size, an
index out of range or fewer than K fragments are InvalidArgument, each with a message
that says what was expected.
"""

from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from mosafs.erasure.spec import ALIGN, Code, Layout
from mosafs.errors import InvalidArgument

U8 = npt.NDArray[np.uint8]
BytesLike = bytes | bytearray | memoryview | U8
"""Any C-contiguous buffer works at run time; these are typed."""


class Coder(ABC):
    """One erasure-coding backend: same fragments, bit for bit, as every other one."""

    name: ClassVar[str]
    library: str
    """What does the arithmetic here, for logs and benchmark reports."""

    @classmethod
    @abstractmethod
    def unavailable_reason(cls) -> str | None:
        """None when this coder can run here, else why not (completes "... requested but")."""

    @abstractmethod
    def encode(self, chunk: BytesLike, k: int, m: int, *, out: Any | None = None) -> U8:
        """The M parity fragments of CHUNK under K+M, as a uint8 array of shape (M, S).

        OUT: a writable buffer of M*S bytes to write the parity into (parity i at
        [iS, (i+1)S)); the result is then a view of it. The chunk is only read.
        """

    @abstractmethod
    def decode(self, fragments: Mapping[int, BytesLike], k: int, m: int,
               length: int) -> bytearray:
        """The LENGTH-byte chunk from any K of its fragments (index -> S bytes).

        Surplus fragments are ignored (data fragments are preferred: with all K present
        the chunk is their concatenation and no arithmetic is done).
        """

    @abstractmethod
    def rebuild(self, fragments: Mapping[int, BytesLike], k: int, m: int,
                wanted: Iterable[int]) -> dict[int, bytearray]:
        """The fragments WANTED (data or parity indices) from any K others."""

    def fragments(self, chunk: BytesLike, k: int, m: int) -> list[memoryview]:
        """All K+M fragments of CHUNK in index order: data fragments are views of the chunk
        where they are all chunk, padded copies where they run past its end (the last
        one or few), then the parity rows."""
        src = as_u8(chunk)
        return with_parity(src, k, m, self.encode(src, k, m))


# --- shared checks and helpers ---------------------------------------------------------

def as_u8(buf: Any) -> U8:
    """BUF's bytes as a 1-D uint8 array without copying (bytes give a read-only one)."""
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise InvalidArgument("erasure coding needs contiguous buffers")
        return buf.reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(buf, dtype=np.uint8)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"not a contiguous bytes-like buffer: {type(buf).__name__} "
                              f"({exc})") from exc


def buffer_address(buf: Any) -> tuple[int, int]:
    """(address, bytes) of a C-contiguous buffer, read only, without copying. The address
    is valid while BUF lives (and, for a bytearray, is not resized). Cheaper than numpy's
    `.ctypes.data` (microseconds per call add up per fragment per chunk)."""
    if type(buf) is bytes:
        return int(ctypes.cast(ctypes.c_char_p(buf), ctypes.c_void_p).value or 0), len(buf)
    try:
        view = memoryview(buf)
    except TypeError as exc:
        raise InvalidArgument(f"not a bytes-like buffer: {type(buf).__name__}") from exc
    if not view.c_contiguous:
        raise InvalidArgument("erasure coding needs contiguous buffers")
    if view.readonly:
        return int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0]), view.nbytes
    return writable_address(view), view.nbytes


def writable_address(buf: Any) -> int:
    """Address of a writable C-contiguous buffer of at least one byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def with_parity(chunk: BytesLike, k: int, m: int, parity: Any) -> list[memoryview]:
    """All K+M fragments of CHUNK given its M parity fragments (computed elsewhere: the
    GPU chunk stream's, or a coder's): the data fragments as data_fragments() makes
    them, then PARITY. InvalidArgument if PARITY does not fit the chunk's layout."""
    src = as_u8(chunk)
    lay = Code.of(k, m).layout(int(src.shape[0]))
    if len(parity) != m or any(len(row) != lay.size for row in parity):
        raise InvalidArgument(f"{len(parity)} parity fragments do not fit ec:{k}+{m} for "
                              f"{src.shape[0]} bytes ({m} of {lay.size} bytes)")
    return data_fragments(src, lay) + [memoryview(row) for row in parity]


def data_fragments(src: U8, lay: Layout) -> list[memoryview]:
    """The K data fragments of the chunk SRC: views, or padded copies past its end."""
    out: list[memoryview] = []
    view = src.data  # a memoryview of the array's bytes
    size = lay.size
    for j in range(lay.code.k):
        have = lay.data_bytes(j)
        if have == size:
            out.append(view[j * size:(j + 1) * size])
        else:
            frag = bytearray(size)
            frag[:have] = view[j * size:j * size + have]
            out.append(memoryview(frag))
    return out


def parity_buffer(out: Any | None, m: int, size: int) -> U8:
    """Where encode writes: a fresh (M, S) array, or OUT viewed as one (checked)."""
    if out is None:
        return np.empty((m, size), dtype=np.uint8)
    arr = as_u8(out)
    if arr.shape[0] != m * size:
        raise InvalidArgument(f"parity buffer holds {arr.shape[0]} bytes, "
                              f"need M*S = {m}*{size} = {m * size}")
    if not arr.flags.writeable:
        raise InvalidArgument("parity buffer is read-only")
    return arr.reshape(m, size)


def fragment_arrays(code: Code, fragments: Mapping[int, BytesLike]) -> tuple[int, dict[int, U8]]:
    """(S, index -> uint8 array) for FRAGMENTS, checked by `fragment_size_of`."""
    arrays = {code.check_index(index): as_u8(buf) for index, buf in fragments.items()}
    return fragment_size_of(code, {i: int(a.shape[0]) for i, a in arrays.items()}), arrays


def fragment_size_of(code: Code, sizes: Mapping[int, int]) -> int:
    """The common size S of fragments whose sizes (index -> bytes) are given: at least K
    of them, all the same size, a positive multiple of 64. InvalidArgument otherwise."""
    if len(sizes) < code.k:
        raise InvalidArgument(f"{code}: need {code.k} fragments to decode, got {len(sizes)} "
                              f"({sorted(sizes)})")
    distinct = sorted(set(sizes.values()))
    if len(distinct) != 1:
        raise InvalidArgument(f"{code}: fragments differ in size: {distinct} bytes")
    size = distinct[0]
    if size < ALIGN or size % ALIGN:
        raise InvalidArgument(f"{code}: fragments are {size} bytes; a fragment is a positive "
                              f"multiple of {ALIGN} bytes")
    return size


def check_length(code: Code, size: int, length: int) -> Layout:
    """The layout of a LENGTH-byte chunk, which must have fragments of SIZE bytes."""
    lay = code.layout(length)
    if lay.size != size:
        raise InvalidArgument(f"{code}: a chunk of {length} bytes has {lay.size}-byte "
                              f"fragments, got {size}-byte ones")
    return lay


def check_wanted(code: Code, wanted: Iterable[int]) -> tuple[int, ...]:
    """WANTED as a sorted tuple of distinct valid indices."""
    out = tuple(sorted({code.check_index(i) for i in wanted}))
    if not out:
        raise InvalidArgument(f"{code}: no fragment asked for")
    return out


def survivors(code: Code, available: Iterable[int]) -> tuple[int, ...]:
    """The K fragments to decode from: the lowest indices (data before parity, so fewer
    parity rows enter the inverted matrix and a complete set of data needs none)."""
    chosen = tuple(sorted(available)[:code.k])
    if len(chosen) < code.k:
        raise InvalidArgument(f"{code}: need {code.k} fragments, got {len(chosen)}")
    return chosen


def copy_present(lay: Layout, arrays: Mapping[int, U8], dst: U8) -> None:
    """Copy the chunk bytes of the data fragments in ARRAYS to their places in DST."""
    size = lay.size
    for j in range(lay.carrying):
        if j in arrays:
            have = lay.data_bytes(j)
            dst[j * size:j * size + have] = arrays[j][:have]


def missing_data(lay: Layout, have: Iterable[int]) -> tuple[int, ...]:
    """Data fragments that hold chunk bytes and are not in HAVE (all-padding ones are
    zeros and never need decoding)."""
    present = set(have)
    return tuple(j for j in range(lay.carrying) if j not in present)


__all__ = ["BytesLike", "Coder", "as_u8", "buffer_address", "check_length", "check_wanted",
           "copy_present", "data_fragments", "fragment_arrays", "fragment_size_of",
           "missing_data", "parity_buffer", "survivors", "writable_address"]
