"""One factory for the erasure coders: pick one by name ("isal" or "gpu").

A coder that cannot run here is a ConfigError saying why ("GPU erasure coder requested
but CuPy is not installed ..."), never a silent fall back to another: the two give the
same fragments, but not the same speed, and a pool configured for the GPU should say so
when it has none.
"""

from __future__ import annotations

from mosafs.erasure.base import Coder
from mosafs.erasure.gpu import GpuCoder
from mosafs.erasure.isal import IsalCoder
from mosafs.errors import ConfigError

CODER_NAMES = ("isal", "gpu")
DEFAULT_CODER = "isal"
_CODERS: dict[str, type[IsalCoder] | type[GpuCoder]] = {"isal": IsalCoder, "gpu": GpuCoder}


def coder_unavailable_reason(name: str) -> str | None:
    """None when coder NAME can run here, else why not; ConfigError for an unknown name."""
    return _coder_class(name).unavailable_reason()


def available_coders() -> list[str]:
    """Names of the coders that can run here, e.g. ["isal"]."""
    return [name for name in CODER_NAMES if _CODERS[name].unavailable_reason() is None]


def make_coder(name: str = DEFAULT_CODER) -> Coder:
    """A coder by NAME; ConfigError saying why when it cannot run here."""
    cls = _coder_class(name)
    reason = cls.unavailable_reason()
    if reason is not None:
        label = "ISA-L" if name == "isal" else name.upper()
        raise ConfigError(f"{label} erasure coder requested but {reason}")
    return cls()


def _coder_class(name: str) -> type[IsalCoder] | type[GpuCoder]:
    cls = _CODERS.get(name)
    if cls is None:
        raise ConfigError(f"unknown erasure coder {name!r}; use one of {', '.join(CODER_NAMES)}")
    return cls


__all__ = ["CODER_NAMES", "DEFAULT_CODER", "available_coders", "coder_unavailable_reason",
           "make_coder"]
