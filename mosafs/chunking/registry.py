"""One factory for the backend family: pick a backend by name, build chunkers and hashers.

"auto" takes the first available backend in AUTO_ORDER (GPU first); "cpu" and "gpu" take
that backend or fail with a ConfigError saying why it cannot run: never a silent fallback.
"""

from __future__ import annotations

from mosafs.chunking.base import BACKEND_CHOICES as BACKEND_CHOICES  # re-exported
from mosafs.chunking.base import Backend, Chunker, Hasher
from mosafs.chunking.cpu import CpuBackend
from mosafs.chunking.gpu import GpuBackend
from mosafs.chunking.spec import ChunkerSpec, parse_spec
from mosafs.errors import ConfigError

AUTO_ORDER = ("gpu", "cpu")
_BACKENDS: dict[str, type[Backend]] = {}


def register_backend(cls: type[Backend]) -> type[Backend]:
    """Add (or replace) the backend class registered under cls.name."""
    _BACKENDS[cls.name] = cls
    return cls


register_backend(CpuBackend)
register_backend(GpuBackend)


def available_backends() -> list[str]:
    """Names of the backends that can run here, e.g. ["cpu"]."""
    return [name for name, cls in _BACKENDS.items() if cls.unavailable_reason() is None]


def make_chunker(spec: ChunkerSpec | str, backend: str = "auto", *,
                 threads: int = 1, pinned_bytes: int | None = None) -> Chunker:
    """A chunker for `spec` (a ChunkerSpec or its text) on `backend` (auto, cpu or gpu).

    threads: how many threads may hash the chunks of one batch (CPU backend).
    pinned_bytes: the bound on the page-locked host memory of the process's GPU pool (GPU
    backend; None: unbounded, as benchmarks of the kernels want).
    """
    if not isinstance(spec, ChunkerSpec):
        spec = parse_spec(spec)
    return _backend(backend).chunker(spec, _check_threads(threads), pinned_bytes=pinned_bytes)


def make_hasher(backend: str = "auto", *, threads: int = 1) -> Hasher:
    """A hasher computing chunk ids (BLAKE3-256) of many buffers at once."""
    return _backend(backend).hasher(_check_threads(threads))


def resolve_backend(name: str) -> str:
    """The backend NAME (auto, cpu, gpu) stands for here; ConfigError saying why it cannot
    run. Processes call it at start so that a backend that cannot be had is a one-line
    error before anything is mounted, not a failure at the first write."""
    return _backend(name).name


def _backend(name: str) -> Backend:
    if name == "auto":
        for candidate in AUTO_ORDER:
            cls = _BACKENDS.get(candidate)
            if cls is not None and cls.unavailable_reason() is None:
                return cls()
        raise ConfigError("no hash backend can run here")  # unreachable: cpu always can
    cls = _BACKENDS.get(name)
    if cls is None:
        raise ConfigError(f"unknown hash backend {name!r}; use one of "
                          + ", ".join(BACKEND_CHOICES))
    reason = cls.unavailable_reason()
    if reason is not None:
        raise ConfigError(f"{name.upper()} hash backend requested but {reason}")
    return cls()


def _check_threads(threads: int) -> int:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"hashing threads must be a whole number >= 1, got {threads!r}")
    return threads
