"""The safetensors file format, as `mosafs.checkpoint` writes and reads it
(docs/checkpoint.md, "Format").

A file is: 8 bytes little-endian N, then N bytes of JSON header (padded with spaces to a
multiple of 8), then the tensors' bytes back to back, in the order of the header. The
header maps each name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into
the bytes after the header), with an optional "__metadata__" string map first.

`layout` reproduces what `safetensors` (the library, 0.4 to 0.7) writes for the same
tensors, byte for byte: tensors sorted by dtype, the widest first in the library's enum
order, then by name; compact JSON (serde_json's: no spaces, non-ASCII kept, control
characters escaped). The library itself needs every tensor's bytes on the host in one
call, which is the copy mosafs.checkpoint exists to avoid, so the header is made here and
tests check it against the library. One difference is the library's, not ours: it keeps
"__metadata__" in a Rust HashMap, so with two or more keys its order changes from process
to process; here they are sorted (a valid file either way, and the same file every time).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mosafs.errors import InvalidArgument

# The library's Dtype enum, in its order (the sort key: widest alignment last).
DTYPES = ("BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
          "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
          "C64", "F64", "I64", "U64")
_RANK = {d: i for i, d in enumerate(DTYPES)}
BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
        "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16,
        "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64,
        "F64": 64, "I64": 64, "U64": 64}
N_LEN = 8
MAX_HEADER = 100_000_000  # the library refuses larger headers


@dataclass(frozen=True)
class TensorSpec:
    """What the header says of one tensor; NBYTES the length of its bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Entry:
    """A tensor in a file: its spec and where its bytes are (file offsets)."""

    spec: TensorSpec
    start: int
    end: int


@dataclass(frozen=True)
class Layout:
    """A whole file but the tensors' bytes: the header (length prefix included), and
    every tensor at its file offset, in file order."""

    header: bytes
    entries: tuple[Entry, ...]
    metadata: dict[str, str] | None

    @property
    def size(self) -> int:
        return self.entries[-1].end if self.entries else len(self.header)


def layout(specs: Sequence[TensorSpec], metadata: Mapping[str, str] | None = None) -> Layout:
    """The file of SPECS (and METADATA) as the library writes it. InvalidArgument for what
    it refuses: an unknown dtype, a byte count that does not match the shape, a repeated
    name, metadata that is not a string map."""
    meta = _metadata(metadata)
    seen: set[str] = set()
    for spec in specs:
        _check(spec, seen)
    ordered = sorted(specs, key=lambda s: (-_RANK[s.dtype], s.name.encode()))
    body: dict[str, object] = {}
    if meta is not None:
        body["__metadata__"] = dict(sorted(meta.items()))
    offset = 0
    placed = []
    for spec in ordered:
        body[spec.name] = {"dtype": spec.dtype, "shape": list(spec.shape),
                           "data_offsets": [offset, offset + spec.nbytes]}
        placed.append((spec, offset))
        offset += spec.nbytes
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    text += b" " * (-len(text) % N_LEN)
    if len(text) > MAX_HEADER:
        raise InvalidArgument(f"safetensors header of {len(text)} bytes: the format allows "
                              f"at most {MAX_HEADER}")
    base = N_LEN + len(text)
    header = struct.pack("<Q", len(text)) + text
    return Layout(header, tuple(Entry(s, base + o, base + o + s.nbytes) for s, o in placed),
                  meta)


def _metadata(metadata: Mapping[str, str] | None) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise InvalidArgument("checkpoint metadata must map strings to strings, as "
                              "safetensors requires")
    return dict(metadata)


def _check(spec: TensorSpec, seen: set[str]) -> None:
    if spec.dtype not in _RANK:
        raise InvalidArgument(f"tensor {spec.name!r}: dtype {spec.dtype} has no safetensors "
                              f"name")
    if spec.name in seen or spec.name == "__metadata__":
        raise InvalidArgument(f"tensor name {spec.name!r} is repeated or reserved")
    seen.add(spec.name)
    count = 1
    for dim in spec.shape:
        count *= dim
    bits = count * BITS[spec.dtype]
    if bits % 8 or bits // 8 != spec.nbytes:
        raise InvalidArgument(f"tensor {spec.name!r}: {spec.nbytes} bytes do not hold shape "
                              f"{list(spec.shape)} of {spec.dtype}")


def parse(head: bytes, file_size: int) -> Layout:
    """The layout of a file whose first bytes are HEAD (at least the header) and whose size
    is FILE_SIZE. InvalidArgument (with the reason) for a file that is not safetensors."""
    if len(head) < N_LEN:
        raise InvalidArgument("not a safetensors file: shorter than its length prefix")
    (n,) = struct.unpack_from("<Q", head)
    if n > MAX_HEADER or N_LEN + n > file_size:
        raise InvalidArgument(f"not a safetensors file: header length {n} does not fit in "
                              f"{file_size} bytes")
    if len(head) < N_LEN + n:
        raise InvalidArgument("the header is longer than the bytes given")
    try:
        body = json.loads(head[N_LEN:N_LEN + n])
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidArgument(f"not a safetensors file: its header is not JSON ({exc})") \
            from None
    if not isinstance(body, dict):
        raise InvalidArgument("not a safetensors file: its header is not a JSON object")
    meta = body.pop("__metadata__", None)
    base = N_LEN + n
    entries = sorted((_entry(name, info, base) for name, info in body.items()),
                     key=lambda e: e.start)
    end = base
    for e in entries:
        if e.start != end:
            raise InvalidArgument(f"tensor {e.spec.name!r} does not start where the one "
                                  f"before it ends")
        end = e.end
    if end != file_size:
        raise InvalidArgument(f"the tensors end at byte {end}, the file at {file_size}")
    return Layout(bytes(head[:base]), tuple(entries), meta)


def _entry(name: str, info: object, base: int) -> Entry:
    try:
        assert isinstance(info, dict)
        dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        assert all(isinstance(d, int) and d >= 0 for d in shape)
        assert isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end
        spec = TensorSpec(name, dtype, shape, end - begin)
        _check(spec, set())
    except (AssertionError, KeyError, TypeError, ValueError):
        raise InvalidArgument(f"not a safetensors file: bad entry for {name!r}") from None
    return Entry(spec, base + begin, base + end)
