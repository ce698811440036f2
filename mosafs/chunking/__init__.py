"""Content-defined chunking and chunk ids (DESIGN §5, §6).

    chunker = make_chunker("cdc:262144:1048576:4194304")      # backend="auto"
    stream = chunker.stream()
    for piece in pieces:
        for chunk in stream.feed(piece): ...                    # Chunk(offset, length, id, data)
    last = stream.finish()

Every backend gives the same chunks and ids for the same bytes, however they are split.
"""

from mosafs.chunking.base import Backend, BytesLike, Chunk, Chunker, ChunkStream, Hasher
from mosafs.chunking.registry import (
    AUTO_ORDER,
    BACKEND_CHOICES,
    available_backends,
    make_chunker,
    make_hasher,
    register_backend,
    resolve_backend,
)
from mosafs.chunking.spec import DEFAULT_SPEC, MAX_CHUNK, MIN_CDC_AVG, ChunkerSpec, parse_spec

__all__ = [
    "AUTO_ORDER",
    "BACKEND_CHOICES",
    "DEFAULT_SPEC",
    "MAX_CHUNK",
    "MIN_CDC_AVG",
    "Backend",
    "BytesLike",
    "Chunk",
    "ChunkStream",
    "Chunker",
    "ChunkerSpec",
    "Hasher",
    "available_backends",
    "make_chunker",
    "make_hasher",
    "parse_spec",
    "register_backend",
    "resolve_backend",
]
