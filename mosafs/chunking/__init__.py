"""Content-defined chunking and chunk ids (DESIGN §5, §6).

    chunker = make_chunker("cdc:262144:1048576:4194304")      # backend="auto"
    stream = chunker.stream()
    for piece in pieces:
        for chunk in stream.feed(piece): ...                    # Chunk(offset, length, id, data)
    last = stream.finish()

Every backend gives the same chunks and ids for the same bytes, however they are split.
"""

from typing import TYPE_CHECKING, Any

from mosafs.chunking.base import (
    BACKEND_CHOICES,
    Backend,
    BytesLike,
    Chunk,
    Chunker,
    ChunkStream,
    Hasher,
)
from mosafs.chunking.spec import DEFAULT_SPEC, MAX_CHUNK, MIN_CDC_AVG, ChunkerSpec, parse_spec

if TYPE_CHECKING:
    from mosafs.chunking.registry import (
        AUTO_ORDER,
        available_backends,
        make_chunker,
        make_hasher,
        register_backend,
        resolve_backend,
    )

# The factory loads the backends (NumPy, and CuPy where asked), so it is imported on first
# use: a process that only reads specs (the manager, an admin command) never loads them.
_LAZY = {name: "registry" for name in ("AUTO_ORDER", "available_backends", "make_chunker",
                                       "make_hasher", "register_backend", "resolve_backend")}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"mosafs.chunking.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
