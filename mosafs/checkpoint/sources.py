"""Where a checkpoint's tensors are: every tensor of a state dict as its safetensors spec
and its bytes, on the host (a memoryview of its own memory) or on a CUDA device (a
pointer), without copying (docs/checkpoint.md, "Sources").

Taken as the safetensors library takes them: torch tensors (CPU or CUDA), numpy arrays
and CuPy arrays; each must be dense and contiguous, and no two may share memory (the
library refuses both: a file holds each tensor's bytes once, in order).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mosafs.checkpoint.format import TensorSpec
from mosafs.errors import InvalidArgument

# torch's and numpy's dtype names -> safetensors' (numpy has no bfloat16 or float8).
DTYPE_NAMES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL",
    "complex64": "C64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
}


@dataclass(frozen=True)
class Source:
    """One tensor's bytes: HOST (a flat uint8 memoryview) or, on CUDA device DEVICE, at
    device pointer PTR. KEEP holds what owns the memory."""

    spec: TensorSpec
    host: memoryview | None = None
    device: int = -1  # -1: host memory
    ptr: int = 0      # the first byte's address (host or device)
    keep: Any = None

    @property
    def on_device(self) -> bool:
        return self.host is None


def sources(tensors: Mapping[str, Any]) -> list[Source]:
    """Every tensor of TENSORS as a Source. InvalidArgument for what safetensors refuses."""
    if not isinstance(tensors, Mapping):
        raise InvalidArgument("a checkpoint is a mapping of names to tensors")
    out = [_source(name, value) for name, value in tensors.items()]
    _check_no_sharing(out)
    return out


def _source(name: Any, value: Any) -> Source:
    if not isinstance(name, str):
        raise InvalidArgument(f"tensor name {name!r} is not a string")
    module = type(value).__module__.split(".")[0]
    if module == "torch":
        return _torch(name, value)
    if module == "numpy":
        return _numpy(name, value)
    if module == "cupy":
        return _cupy(name, value)
    raise InvalidArgument(f"tensor {name!r} is a {type(value).__name__}: a checkpoint holds "
                          f"torch tensors, numpy arrays or CuPy arrays")


def _dtype(name: str, dtype: str) -> str:
    found = DTYPE_NAMES.get(dtype)
    if found is None:
        raise InvalidArgument(f"tensor {name!r}: dtype {dtype} cannot be stored in "
                              f"safetensors")
    return found


def _torch(name: str, t: Any) -> Source:
    if str(t.layout) != "torch.strided":
        raise InvalidArgument(f"tensor {name!r} is sparse: store it dense")
    if not t.is_contiguous():
        raise InvalidArgument(f"tensor {name!r} is not contiguous: call .contiguous() on it "
                              f"first (as safetensors asks)")
    dtype = _dtype(name, str(t.dtype).removeprefix("torch."))
    spec = TensorSpec(name, dtype, tuple(int(d) for d in t.shape),
                      t.numel() * t.element_size())
    t = t.detach()
    if t.device.type == "cuda":
        return Source(spec, device=t.device.index or 0, ptr=t.data_ptr(), keep=t)
    if t.device.type != "cpu":
        raise InvalidArgument(f"tensor {name!r} is on {t.device}: CPU and CUDA tensors only")
    if spec.nbytes == 0:
        return Source(spec, host=memoryview(b""), keep=t)
    import torch

    flat = t.reshape(-1).view(torch.uint8)
    return Source(spec, host=memoryview(flat.numpy()), ptr=t.data_ptr(), keep=(t, flat))


def _numpy(name: str, a: Any) -> Source:
    if not a.flags.c_contiguous:
        raise InvalidArgument(f"array {name!r} is not C-contiguous: numpy.ascontiguousarray "
                              f"it first")
    if a.dtype.byteorder == ">":
        raise InvalidArgument(f"array {name!r} is big-endian: safetensors is little-endian")
    spec = TensorSpec(name, _dtype(name, a.dtype.name), tuple(int(d) for d in a.shape),
                      int(a.nbytes))
    return Source(spec, host=memoryview(a.reshape(-1).view("uint8")), ptr=int(a.ctypes.data),
                  keep=a)


def _cupy(name: str, a: Any) -> Source:
    if not a.flags.c_contiguous:
        raise InvalidArgument(f"array {name!r} is not C-contiguous: cupy.ascontiguousarray "
                              f"it first")
    spec = TensorSpec(name, _dtype(name, a.dtype.name), tuple(int(d) for d in a.shape),
                      int(a.nbytes))
    return Source(spec, device=int(a.device.id), ptr=int(a.data.ptr), keep=a)


def _check_no_sharing(found: list[Source]) -> None:
    """No two tensors' bytes overlap (views of one storage): the library refuses them."""
    spans = sorted((s.device, s.ptr, s.ptr + s.spec.nbytes, s.spec.name)
                   for s in found if s.spec.nbytes)
    for (dev, _, end, name), (dev2, start2, _, name2) in itertools.pairwise(spans):
        if dev == dev2 and start2 < end:
            raise InvalidArgument(f"tensors {name!r} and {name2!r} share memory: save each "
                                  f"once (or .clone() one), as safetensors asks")
