"""The messages that carry chunk bytes, PutChunkRequest, PutChunksRequest (several of
them) and GetChunkResponse (protos/mosafs/v1/benefactor.proto), encoded and decoded
without protobuf's copies.

Why: through the generated code a chunk is copied into the message when it is built,
again when it is serialised, and on the other side once when it is parsed and once more
at every read of `request.data`; on the 2-CPU machine each pass over a chunk costs as
much as the whole BLAKE3 hash of it (docs/benchmarks.md, "Where the CPU goes"). Here a
put is framed once per chunk (the same bytes go to every replica target) and decoded as
a view into the received message; a get's answer is one frame around the file's bytes.

The encoding is exactly protobuf's (field 1 `id`, then field 2 `data`, both
length-delimited; GetChunkResponse: field 1 `data`), so the generated stubs, other
clients and `grpcurl` interoperate. Decoding takes the fast path only for that exact
layout and otherwise hands the bytes to the generated parser, which accepts every valid
encoding (fields in another order, repeated, unknown fields) and raises DecodeError on
malformed ones, which the server answers with INVALID_ARGUMENT (mosafs.rpc.handlers).
"""

from __future__ import annotations

from dataclasses import dataclass

from mosafs._proto import benefactor_pb2 as bpb

Buffer = bytes | bytearray | memoryview

_ID_FIELD = b"\x0a\x20"   # field 1, length-delimited, 32 bytes: the chunk id
_DATA_TAG_PUT = 0x12      # field 2, length-delimited: the chunk's bytes
_DATA_TAG_GET = 0x0A      # GetChunkResponse's field 1
_CHUNKS_TAG = 0x0A        # PutChunksRequest's field 1: one PutChunkRequest each
_ID_LEN = 32
# The gRPC metadata key of a chunk access token (mosafs.manager.tokens): a GetChunk carries
# the chunk's read token, a PutChunk the write session's token. "-bin": the value is bytes.
TOKEN_KEY = "mosafs-token-bin"


@dataclass(frozen=True, slots=True)
class PutChunk:
    """A decoded PutChunkRequest; DATA is a view into the received message."""

    id: bytes
    data: Buffer


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(raw: Buffer, pos: int) -> tuple[int, int]:
    """(value, position after it); (-1, pos) when RAW ends inside it or it is too long."""
    value = shift = 0
    end = min(len(raw), pos + 10)
    while pos < end:
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    return -1, pos


def _put_head(chunk_id: bytes, size: int) -> bytes:
    """A PutChunkRequest's bytes before its SIZE bytes of data."""
    return b"".join((_ID_FIELD, chunk_id, bytes((_DATA_TAG_PUT,)), _varint(size)))


def encode_put(chunk_id: bytes, data: Buffer) -> bytes:
    """A PutChunkRequest's wire bytes: one copy of DATA."""
    return b"".join((_put_head(chunk_id, memoryview(data).nbytes), data))


def decode_put(raw: Buffer) -> PutChunk:
    """A PutChunkRequest from its wire bytes, the data not copied when the layout is ours."""
    if len(raw) > 2 + _ID_LEN and raw[:2] == _ID_FIELD and raw[2 + _ID_LEN] == _DATA_TAG_PUT:
        length, start = _read_varint(raw, 3 + _ID_LEN)
        if length >= 0 and start + length == len(raw):
            view = memoryview(raw)
            return PutChunk(bytes(view[2:2 + _ID_LEN]), view[start:])
    # Any other valid layout, or DecodeError.
    message = bpb.PutChunkRequest.FromString(bytes(raw))
    return PutChunk(message.id, message.data)


def encode_puts(blobs: list[tuple[bytes, Buffer]]) -> bytes:
    """A PutChunksRequest's wire bytes from (id, data) BLOBS: one copy of each blob's
    bytes, straight into the call's message."""
    parts: list[Buffer] = []
    for blob_id, data in blobs:
        size = memoryview(data).nbytes
        head = _put_head(blob_id, size)
        parts += (bytes((_CHUNKS_TAG,)), _varint(len(head) + size), head, data)
    return b"".join(parts)


def decode_puts(raw: bytes) -> list[PutChunk]:
    """The PutChunkRequests of a PutChunksRequest, each a view into RAW when the layout is
    ours (field 1 only, each entry whole); any other valid encoding goes through the
    generated parser, a malformed one raises DecodeError."""
    view = memoryview(raw)
    out: list[PutChunk] = []
    pos = 0
    while pos < len(raw):
        if raw[pos] != _CHUNKS_TAG:
            break
        length, start = _read_varint(raw, pos + 1)
        if length < 0 or start + length > len(raw):
            break
        out.append(decode_put(view[start:start + length]))
        pos = start + length
    else:
        return out
    message = bpb.PutChunksRequest.FromString(raw)
    return [PutChunk(c.id, c.data) for c in message.chunks]


def encode_get_response(data: Buffer) -> bytes:
    """A GetChunkResponse's wire bytes (DATA: the chunk as read from disk)."""
    return b"".join((bytes((_DATA_TAG_GET,)), _varint(memoryview(data).nbytes), data))


def decode_get_response(raw: bytes) -> bytes | memoryview:
    """The chunk bytes of a GetChunkResponse, as a view into RAW when the layout is ours."""
    if raw and raw[0] == _DATA_TAG_GET:
        length, start = _read_varint(raw, 1)
        if length >= 0 and start + length == len(raw):
            return memoryview(raw)[start:]
    data: bytes = bpb.GetChunkResponse.FromString(raw).data
    return data
