"""Chunk ids (DESIGN §3): BLAKE3-256 of the chunk's bytes, 32 raw bytes on the wire and in
LMDB, lowercase hex in text and in benefactor file names."""

from __future__ import annotations

import blake3

from mosafs.errors import IntegrityError, InvalidArgument

ID_LEN = 32


def chunk_id(data: bytes | bytearray | memoryview) -> bytes:
    return blake3.blake3(data).digest()


def check_id(raw: bytes) -> bytes:
    """Validate a raw id from a peer; raise InvalidArgument with a useful message."""
    if len(raw) != ID_LEN:
        shown = raw[:48].hex()
        raise InvalidArgument(f"chunk id must be {ID_LEN} bytes, got {len(raw)} (0x{shown})")
    return raw


def parse_hex(text: str) -> bytes:
    """A chunk id from its 64-character lowercase hex form."""
    if len(text) != 2 * ID_LEN or text.lower() != text:
        raise InvalidArgument(f"not a chunk id: {text[:80]!r}")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise InvalidArgument(f"not a chunk id: {text[:80]!r}") from None


def verify(raw_id: bytes, data: bytes | bytearray | memoryview) -> None:
    """Raise IntegrityError unless DATA hashes to RAW_ID."""
    actual = chunk_id(data)
    if actual != raw_id:
        raise IntegrityError(
            f"chunk {raw_id.hex()} does not verify: its {len(data)} bytes hash to {actual.hex()}"
        )
