"""The CPU coder: Intel's ISA-L (Intelligent Storage Acceleration Library) through ctypes.

ISA-L's `erasure_code` API is exactly DESIGN §10's code: `gf_gen_cauchy1_matrix` builds
the systematic (K+M)xK matrix (identity over rows inverse((K+i) xor j)) over GF(2^8) with
the polynomial 0x11D, `ec_init_tables` expands a matrix into the SIMD multiply tables,
and `ec_encode_data` multiplies K input vectors into R outputs with AVX2/AVX-512/GFNI
(picked at run time). Decoding is ISA-L's own recipe (examples/ec/ec_simple_example.c):
the K rows of the full matrix for the surviving fragments, `gf_invert_matrix`, and the
rows of the inverse for the lost fragments, multiplied by `ec_encode_data`.

Why ctypes and not a wrapper package (docs/erasure.md has the measurements): a ctypes
call releases the GIL for its duration, so N threads encode on N cores; and the calls
take raw addresses, so nothing is copied: the data fragments are read where the chunk
lies, parity is written straight into the caller's buffer, the decoded chunk straight
into the result. Only a chunk's last partial 64-byte line is copied (into 64 zeroed
bytes), so that no read runs past the chunk's end.

Which library: the system's libisal.so.2 (Debian/Ubuntu `libisal2`) when the dynamic
loader finds it, else the copy bundled in the `pyeclib` wheel (pyeclib.libs/
libisal-pyeclib.so.2). `IsaL.description` says which one was loaded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.metadata
import itertools
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mosafs.erasure.base import (
    U8,
    BytesLike,
    Coder,
    buffer_address,
    check_length,
    check_wanted,
    fragment_size_of,
    missing_data,
    parity_buffer,
    survivors,
    writable_address,
)
from mosafs.erasure.spec import ALIGN, Code, Layout
from mosafs.errors import ConfigError

INSTALL_HINT = ("install the system library (apt-get install libisal2) or the pyeclib wheel, "
                "which bundles a copy (pip install 'pyeclib>=1.6')")
LIBRARY_CHOICES = ("auto", "system", "pyeclib")

_P = ctypes.c_void_p
_I = ctypes.c_int
_U8 = ctypes.c_ubyte
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "gf_gen_cauchy1_matrix": ([_P, _I, _I], None),
    "ec_init_tables": ([_I, _I, _P, _P], None),
    "ec_encode_data": ([_I, _I, _I, _P, _P, _P], None),
    "gf_invert_matrix": ([_P, _P, _I], _I),
    "gf_mul": ([_U8, _U8], _U8),
    "gf_inv": ([_U8], _U8),
}


# --- finding and loading the library ---------------------------------------------------

def system_library() -> str | None:
    """The name the dynamic loader knows the system's ISA-L by (libisal.so.2), or None."""
    return ctypes.util.find_library("isal")


def pyeclib_library() -> str | None:
    """Path of the ISA-L copy inside the installed pyeclib wheel, or None."""
    try:
        files = importlib.metadata.files("pyeclib") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in files:
        if entry.name.startswith("libisal") and ".so" in entry.name:
            return str(entry.locate())
    return None


def _candidates(which: str) -> list[tuple[str, str | None]]:
    if which not in LIBRARY_CHOICES:
        raise ConfigError(f"ISA-L library {which!r}: use one of {', '.join(LIBRARY_CHOICES)}")
    found = []
    if which in ("auto", "system"):
        found.append(("system", system_library()))
    if which in ("auto", "pyeclib"):
        found.append(("pyeclib", pyeclib_library()))
    return found


@functools.cache
def load_isal(which: str = "auto") -> IsaL:
    """ISA-L, once per process: the system's (`system`), pyeclib's (`pyeclib`), or the
    first of those found (`auto`). ConfigError with an install hint when none loads."""
    tried = []
    for origin, path in _candidates(which):
        if path is None:
            tried.append(f"{origin}: not found")
            continue
        try:
            return IsaL(path, origin)
        except (OSError, AttributeError, RuntimeError) as exc:
            tried.append(f"{origin} {path}: {exc}")
    raise ConfigError(f"the ISA-L library cannot be loaded ({'; '.join(tried)}); "
                      + INSTALL_HINT)


def isal_unavailable_reason() -> str | None:
    """None when ISA-L loads here, else why not."""
    try:
        load_isal()
    except ConfigError as exc:
        return exc.message
    return None


class IsaL:
    """The ISA-L functions the coders use, typed, from one shared library."""

    def __init__(self, path: str, origin: str) -> None:
        self.path = path
        self.origin = origin
        lib = ctypes.CDLL(path)  # CDLL (not PyDLL): every call releases the GIL
        for name, (args, result) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = result
        self._lib = lib
        self.version = _version(lib)
        if lib.gf_mul(2, 0x80) != 0x1D:  # x * x^7 = x^8 = x^4+x^3+x^2+1 under 0x11D
            raise RuntimeError("its GF(2^8) is not the polynomial 0x11D")
        self.description = f"ISA-L {self.version or '(version unknown)'} ({origin}: {path})"
        self._lock = threading.Lock()
        self._encode: dict[Code, tuple[U8, U8, int]] = {}

    def __repr__(self) -> str:
        return f"<IsaL {self.description}>"

    def gf_mul(self, a: int, b: int) -> int:
        return int(self._lib.gf_mul(a, b))

    def gf_inv(self, a: int) -> int:
        return int(self._lib.gf_inv(a))

    def encode_matrix(self, code: Code) -> U8:
        """The full (K+M)xK matrix: identity, then parity row i, column j =
        inverse((K+i) xor j) (DESIGN §10). Read-only; cached per code."""
        return self._encoding(code)[0]

    def encode_tables(self, code: Code) -> U8:
        """ec_init_tables of the M parity rows (cached per code)."""
        return self._encoding(code)[1]

    def encode_tables_address(self, code: Code) -> int:
        """Where encode_tables(code) lies (kept alive by the cache)."""
        return self._encoding(code)[2]

    def _encoding(self, code: Code) -> tuple[U8, U8, int]:
        found = self._encode.get(code)
        if found is None:
            full = np.zeros((code.n, code.k), dtype=np.uint8)
            self._lib.gf_gen_cauchy1_matrix(full.ctypes.data, code.n, code.k)
            full.flags.writeable = False
            tables = self.tables(full[code.k:])
            found = (full, tables, int(tables.ctypes.data))
            with self._lock:
                self._encode[code] = found
        return found

    def tables(self, matrix: U8) -> U8:
        """ec_init_tables of an RxK matrix: 32*K*R bytes of nibble multiply tables."""
        a = np.ascontiguousarray(matrix, dtype=np.uint8)
        rows, k = a.shape
        out = np.empty(32 * k * rows, dtype=np.uint8)
        self._lib.ec_init_tables(k, rows, a.ctypes.data, out.ctypes.data)
        out.flags.writeable = False
        return out

    def invert(self, square: U8) -> U8:
        """The inverse of a KxK matrix over GF(2^8) (gf_invert_matrix)."""
        a = np.array(square, dtype=np.uint8, order="C")  # a copy: ISA-L works in place
        n = a.shape[0]
        out = np.empty((n, n), dtype=np.uint8)
        if self._lib.gf_invert_matrix(a.ctypes.data, out.ctypes.data, n) != 0:
            raise RuntimeError(f"singular {n}x{n} matrix: not rows of a Cauchy code")
        return out

    def matmul(self, a: U8, b: U8) -> U8:
        """A (RxK) times B (KxC) over GF(2^8), for the small matrices of decode plans: by
        table look-ups (a few hundred bytes; the table is ISA-L's gf_mul's)."""
        mul = self.mul_table
        a = np.asarray(a, dtype=np.uint8)
        b = np.asarray(b, dtype=np.uint8)
        out = np.zeros((a.shape[0], b.shape[1]), dtype=np.uint8)
        for j in range(a.shape[1]):
            out ^= mul[a[:, j][:, None], b[j][None, :]]
        return out

    @functools.cached_property
    def mul_table(self) -> U8:
        """The 256x256 product table of GF(2^8), from ISA-L's scalar gf_mul: powers of the
        generator 2 and their logarithms."""
        exp = np.zeros(510, dtype=np.int64)
        log = np.zeros(256, dtype=np.int64)
        x = 1
        for i in range(255):
            exp[i] = exp[i + 255] = x
            log[x] = i
            x = self.gf_mul(x, 2)
        if x != 1 or len(set(exp[:255].tolist())) != 255:
            raise RuntimeError("2 does not generate its GF(2^8)")
        table = exp[log[:, None] + log[None, :]]
        table[0, :] = table[:, 0] = 0
        table = table.astype(np.uint8)
        table.flags.writeable = False
        return table

    def multiply(self, length: int, tables: U8 | int, inputs: Sequence[int],
                 outputs: Sequence[int]) -> None:
        """outputs[r][:length] = sum_j M[r][j] * inputs[j][:length] for the matrix M that
        TABLES (the array or its address) were made from; inputs and outputs are
        addresses. The GIL is released."""
        # Keep TABLES itself bound while ISA-L reads it: a frame owns its arguments, so
        # rebinding the name to the address would free a temporary array under the call.
        address = tables if isinstance(tables, int) else int(tables.ctypes.data)
        self._lib.ec_encode_data(length, len(inputs), len(outputs), address,
                                 _pointers(len(inputs))(*inputs),
                                 _pointers(len(outputs))(*outputs))


@functools.cache
def _pointers(n: int) -> Any:
    """The ctypes type of an array of N pointers (made once per N)."""
    return ctypes.c_void_p * n


def _version(lib: ctypes.CDLL) -> str | None:
    """ISA-L's version string (isal_get_version_str exists from 2.31 on)."""
    try:
        fn = lib.isal_get_version_str
    except AttributeError:
        return None
    fn.argtypes = []
    fn.restype = ctypes.c_char_p
    value = fn()
    return value.decode() if value else None


# --- decoding plans --------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class DecodePlan:
    """How to get fragments WANTED from the K fragments SURVIVORS: row r of MATRIX gives
    fragment wanted[r] as a combination of the survivors, in their order."""

    survivors: tuple[int, ...]
    wanted: tuple[int, ...]
    matrix: U8
    tables: U8
    tables_address: int


@functools.lru_cache(maxsize=4096)
def decode_plan(isal: IsaL, code: Code, chosen: tuple[int, ...],
                wanted: tuple[int, ...]) -> DecodePlan:
    """ISA-L's recipe: invert the survivors' rows of the full matrix; a lost data fragment
    j is row j of the inverse, a lost parity fragment K+i is its encode row times the
    inverse. Cached: a failed benefactor makes the same pattern over and over."""
    full = isal.encode_matrix(code)
    inverse = isal.invert(full[list(chosen)])
    rows = np.empty((len(wanted), code.k), dtype=np.uint8)
    parity = [r for r, w in enumerate(wanted) if w >= code.k]
    for r, w in enumerate(wanted):
        if w < code.k:
            rows[r] = inverse[w]
    if parity:
        rows[parity] = isal.matmul(full[[wanted[r] for r in parity]], inverse)
    rows.flags.writeable = False
    tables = isal.tables(rows)
    return DecodePlan(chosen, wanted, rows, tables, int(tables.ctypes.data))


# --- the coder -------------------------------------------------------------------------

class _Zeros:
    """A shared, growing run of zero bytes that padding fragments read from. A caller
    keeps the buffer it got for the duration of its call, so a concurrent grow (which
    replaces the buffer) cannot free memory that ISA-L is reading."""

    def __init__(self) -> None:
        self.buffer = ctypes.create_string_buffer(0)

    def get(self, n: int) -> Any:
        buffer = self.buffer
        if len(buffer) < n:
            buffer = ctypes.create_string_buffer(n)
            self.buffer = buffer
        return buffer


_ZEROS = _Zeros()
_ZERO, _LINE = -1, -2
"""Input sources of an encode range besides an offset into the chunk."""


@dataclass(frozen=True, slots=True)
class EncodePlan:
    """How encode reads a chunk of one length: per column range of the fragments, where
    each data fragment's bytes come from (an offset into the chunk, _ZERO for padding,
    _LINE for the 64-byte line where the chunk ends: LINE bytes copied from LINE_FROM)."""

    size: int
    ranges: tuple[tuple[int, int, tuple[int, ...]], ...]
    """(first column, columns, sources) per range."""
    line_from: int
    line: int
    padded: bool


@functools.lru_cache(maxsize=4096)
def encode_plan(lay: Layout) -> EncodePlan:
    size = lay.size
    ranges = []
    line_from = line = 0
    for b0, b1 in column_ranges(lay):
        sources = []
        for j in range(lay.code.k):
            have = lay.data_bytes(j)
            if b1 <= have:
                sources.append(j * size + b0)
            elif b0 >= have:
                sources.append(_ZERO)
            else:
                sources.append(_LINE)
                line_from, line = j * size + b0, have - b0
        ranges.append((b0, b1 - b0, tuple(sources)))
    return EncodePlan(size, tuple(ranges), line_from, line,
                      padded=lay.carrying < lay.code.k or lay.partial is not None)


def column_ranges(lay: Layout) -> list[tuple[int, int]]:
    """Column ranges [b0, b1) of the fragments in which every data fragment is wholly
    chunk, wholly padding, or (one range at most) the 64-byte line where the chunk ends."""
    part = lay.partial
    if part is None:
        return [(0, lay.size)]
    have = lay.data_bytes(part)
    cuts = sorted({0, have - have % ALIGN, -(-have // ALIGN) * ALIGN, lay.size})
    return list(itertools.pairwise(cuts))


class IsalCoder(Coder):
    """The CPU coder. Thread-safe. The arithmetic and the copies run without the GIL;
    what holds it is a few microseconds of Python per call (cached plans, raw addresses
    instead of numpy views), so threads coding chunks of a MiB or more scale."""

    name = "isal"

    def __init__(self, isal: IsaL | None = None) -> None:
        self.isal = isal if isal is not None else load_isal()
        self.library = self.isal.description

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return isal_unavailable_reason()

    def __repr__(self) -> str:
        return f"<IsalCoder {self.library}>"

    def encode(self, chunk: BytesLike, k: int, m: int, *, out: Any | None = None) -> U8:
        code = Code.of(k, m)
        base, length = buffer_address(chunk)
        plan = encode_plan(code.layout(length))
        size = plan.size
        parity = parity_buffer(out, m, size)
        pbase = writable_address(parity)
        tables = self.isal.encode_tables_address(code)
        zeros = _ZEROS.get(size if plan.padded else 0)
        zero = ctypes.addressof(zeros)
        line = ctypes.create_string_buffer(ALIGN) if plan.line else None
        if line is not None:  # the chunk's last partial line, zero-padded: < 64 bytes
            ctypes.memmove(line, base + plan.line_from, plan.line)
        for b0, columns, sources in plan.ranges:
            inputs = [base + src if src >= 0 else zero if src == _ZERO
                      else ctypes.addressof(line)  # type: ignore[arg-type]
                      for src in sources]
            self.isal.multiply(columns, tables, inputs,
                               [pbase + i * size + b0 for i in range(m)])
        return parity

    def decode(self, fragments: Mapping[int, BytesLike], k: int, m: int,
               length: int) -> bytearray:
        code = Code.of(k, m)
        size, addresses = _fragment_addresses(code, fragments)
        lay = check_length(code, size, length)
        result = uninitialized_bytearray(length)  # every byte is written below
        dst = writable_address(result)
        lost = missing_data(lay, addresses)
        if lost:
            self._recover(code, lay, addresses, lost, dst)
        for j in range(lay.carrying):
            if j in addresses:  # ctypes.memmove runs without the GIL
                ctypes.memmove(dst + j * size, addresses[j], lay.data_bytes(j))
        return result

    def _recover(self, code: Code, lay: Layout, addresses: Mapping[int, int],
                 lost: tuple[int, ...], dst: int) -> None:
        """Decode the lost data fragments straight into the chunk at DST; the one that
        runs past the chunk's end goes through a scratch fragment."""
        size = lay.size
        plan = decode_plan(self.isal, code, survivors(code, addresses), lost)
        tail = lay.partial if lay.partial in lost else None
        scratch = ctypes.create_string_buffer(size) if tail is not None else None
        outputs = [dst + j * size if j != tail else ctypes.addressof(scratch)  # type: ignore[arg-type]
                   for j in lost]
        self.isal.multiply(size, plan.tables_address, [addresses[i] for i in plan.survivors],
                           outputs)
        if scratch is not None and tail is not None:
            ctypes.memmove(dst + tail * size, scratch, lay.data_bytes(tail))

    def rebuild(self, fragments: Mapping[int, BytesLike], k: int, m: int,
                wanted: Iterable[int]) -> dict[int, bytearray]:
        code = Code.of(k, m)
        size, addresses = _fragment_addresses(code, fragments)
        want = check_wanted(code, wanted)
        out = {w: bytearray(fragments[w]) for w in want if w in addresses}
        todo = tuple(w for w in want if w not in addresses)
        if todo:
            plan = decode_plan(self.isal, code, survivors(code, addresses), todo)
            bufs = {w: uninitialized_bytearray(size) for w in todo}
            self.isal.multiply(size, plan.tables_address,
                               [addresses[i] for i in plan.survivors],
                               [writable_address(bufs[w]) for w in todo])
            out.update(bufs)
        return {w: out[w] for w in want}


def _fragment_addresses(code: Code, fragments: Mapping[int, BytesLike]
                        ) -> tuple[int, dict[int, int]]:
    """(S, index -> address) for FRAGMENTS, checked like base.fragment_arrays."""
    addresses: dict[int, int] = {}
    sizes: dict[int, int] = {}
    for index, buf in fragments.items():
        code.check_index(index)
        addresses[index], sizes[index] = buffer_address(buf)
    return fragment_size_of(code, sizes), addresses


_PyByteArray_FromStringAndSize = ctypes.pythonapi.PyByteArray_FromStringAndSize
_PyByteArray_FromStringAndSize.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
_PyByteArray_FromStringAndSize.restype = ctypes.py_object


def uninitialized_bytearray(n: int) -> bytearray:
    """A bytearray of N bytes whose contents are left as allocated (CPython's C API with a
    NULL source copies nothing), for results the caller overwrites entirely: bytearray(n)
    would zero it first, a tenth of a decode's time for nothing."""
    return _PyByteArray_FromStringAndSize(None, n)  # type: ignore[no-any-return]


__all__ = [
    "INSTALL_HINT",
    "LIBRARY_CHOICES",
    "DecodePlan",
    "EncodePlan",
    "IsaL",
    "IsalCoder",
    "column_ranges",
    "decode_plan",
    "encode_plan",
    "isal_unavailable_reason",
    "load_isal",
    "pyeclib_library",
    "system_library",
    "uninitialized_bytearray",
]
