"""`save` and `load` (docs/checkpoint.md): checkpoints as safetensors files that are
ordinary mosafs files, saved without the copies a write through the mount makes."""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from mosafs.checkpoint.cluster import client, target
from mosafs.checkpoint.format import BITS, Layout, layout
from mosafs.checkpoint.loading import read_file
from mosafs.checkpoint.saving import SaveResult, save_host
from mosafs.checkpoint.sources import Source, sources

PathLike = str | os.PathLike[str]


class SaveHandle:
    """A save running in the background (`save(..., blocking=False)`). The tensors were
    snapshotted before `save` returned: the caller may change them at once."""

    def __init__(self, future: concurrent.futures.Future[SaveResult], result: SaveResult,
                 started: float) -> None:
        self._future = future
        self.result_so_far = result
        self._started = started

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> SaveResult:
        """The save's figures once it has committed; its error (a MosafsError) if it
        failed; TimeoutError if TIMEOUT seconds pass first."""
        return self._future.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._future.exception(timeout)


def save(tensors: Mapping[str, Any], path: PathLike, *, metadata: Mapping[str, str] | None = None,
         blocking: bool = True) -> SaveResult | SaveHandle:
    """Save TENSORS (names to torch tensors, numpy or CuPy arrays) as a new version of
    PATH, a file inside a mosafs mount, in the safetensors format: the bytes
    `safetensors.torch.save_file(tensors, path, metadata)` writes. BLOCKING=False returns
    a SaveHandle once the tensors are snapshotted."""
    started = time.perf_counter()
    where = target(path)
    found = sources(tensors)
    plan = layout([s.spec for s in found], metadata)
    result = SaveResult(str(where.path))
    on_gpu = any(s.on_device for s in found)
    if on_gpu:
        _device_ready(found)
    if not blocking:
        found = _snapshot(found, on_gpu)
    future = client(where).submit(_save, where, plan, found, result, started, on_gpu)
    if blocking:
        return future.result()
    result.blocked_s = time.perf_counter() - started
    return SaveHandle(future, result, started)


async def _save(ctx: Any, where: Any, plan: Layout, found: list[Source], result: SaveResult,
                started: float, on_gpu: bool) -> SaveResult:
    try:
        if on_gpu:
            from mosafs.checkpoint.device import save_device

            await save_device(ctx, where, plan, found, result)
        else:
            await save_host(ctx, where, plan, found, result)
    finally:
        # A snapshot's memory (a GPU's worth) is held by FOUND's sources only, until the
        # save is done and not after: the save's frames can outlive it (a failed RPC
        # leaves them in reference cycles until the next garbage collection), and would
        # hold it through this list.
        found.clear()
    result.total_s = time.perf_counter() - started
    if not result.blocked_s:
        result.blocked_s = result.total_s
    return result


def _require_gpu(what: str) -> None:
    """ConfigError naming WHAT where the GPU backend cannot run: a GPU save is never a
    silent copy to the host."""
    from mosafs.chunking.gpu import gpu_unavailable_reason
    from mosafs.errors import ConfigError

    reason = gpu_unavailable_reason()
    if reason is not None:
        raise ConfigError(f"{what}, but the GPU backend cannot run: {reason}")


def _device_ready(found: list[Source]) -> None:
    """Wait for the work queued on the tensors' devices (the caller's streams): the save
    reads them on streams of its own."""
    _require_gpu("tensors on a GPU")
    import cupy

    for device in {s.device for s in found if s.on_device}:
        with cupy.cuda.Device(device):
            cupy.cuda.runtime.deviceSynchronize()


def _snapshot(found: list[Source], on_gpu: bool) -> list[Source]:
    """Copies of FOUND's bytes that the caller cannot change (GPU tensors: device to
    device); only the sources returned hold their memory."""
    if on_gpu:
        from mosafs.checkpoint.device import snapshot

        return snapshot(found)
    return [replace(s, host=memoryview(bytes(s.host)), keep=None) if s.host is not None
            else s for s in found]


def prepare(device: str = "cuda", *, chunker: str | None = None) -> dict[str, float]:
    """Pay the one-time costs of this process's first save from DEVICE ("cuda", "cuda:1")
    now, outside any save (docs/checkpoint.md, "Preparing"): chunk and hash two feeds'
    worth of scratch bytes there (CHUNKER: the pool's spec, default DESIGN's), and pin
    the staging buffers for the copies out. Optional: the first save pays them
    otherwise. The seconds each part took."""
    import torch

    from mosafs.checkpoint.cluster import UPLOADS_PER_FILE
    from mosafs.checkpoint.device import prepare_device
    from mosafs.chunking import DEFAULT_SPEC
    from mosafs.client.files.context import GPU_PINNED_BYTES
    from mosafs.errors import ConfigError

    place = torch.device(device)
    if place.type != "cuda":
        raise ConfigError(f"prepare is for saves from a GPU, not from {device!r}")
    _require_gpu(f"prepare({device!r})")
    index = place.index if place.index is not None else torch.cuda.current_device()
    return prepare_device(index, chunker or DEFAULT_SPEC, pinned_bytes=GPU_PINNED_BYTES,
                          uploads=UPLOADS_PER_FILE)


def load(path: PathLike, *, device: str = "cpu",
         figures: dict[str, Any] | None = None) -> dict[str, Any]:
    """The newest version of PATH (a safetensors file in a mosafs mount) as torch tensors
    on DEVICE ("cpu", "cuda", "cuda:1"), as `safetensors.torch.load_file` gives them.
    FIGURES, if given, receives how the bytes came (version, local_bytes, network_bytes,
    read_s)."""
    import torch

    where = target(path)
    place = torch.device(device)
    if place.type == "cuda":
        return _load_to_gpu(where, place, figures)
    loaded = client(where).submit(read_file, where,
                                  lambda n: np.empty(n, dtype=np.uint8)).result()
    _report(loaded, figures)
    plan, buffer = loaded.layout, loaded.buffer
    host = torch.from_numpy(buffer)
    out: dict[str, Any] = {}
    for entry in sorted(plan.entries, key=lambda e: e.spec.name):
        spec = entry.spec
        dtype = _torch_dtype(spec.dtype)
        tensor = torch.empty(spec.shape, dtype=dtype)
        if spec.nbytes:
            raw = host[entry.start:entry.end]
            if entry.start % tensor.element_size() == 0:  # every file mosafs writes
                tensor.copy_(raw.view(dtype).reshape(spec.shape))
            else:
                # torch views bytes as DTYPE only at a multiple of its size, and the
                # format does not ask for one (another writer may put 3 bytes of U8
                # before an F32): the bytes are copied in as bytes.
                tensor.reshape(-1).view(torch.uint8).copy_(raw)
        out[spec.name] = tensor
    return out


def _load_to_gpu(where: Any, place: Any, figures: dict[str, Any] | None) -> dict[str, Any]:
    """The tensors made on the GPU first, the file's bytes copied into them window by
    window from a pinned ring (mosafs.checkpoint.gpuload)."""
    import torch

    from mosafs.checkpoint.gpuload import load_to_device

    index = place.index if place.index is not None else torch.cuda.current_device()
    made: dict[str, Any] = {}

    def make(plan: Layout) -> list[tuple[int, int, int]]:
        spans = []
        for entry in sorted(plan.entries, key=lambda e: e.spec.name):
            spec = entry.spec
            made[spec.name] = tensor = torch.empty(spec.shape, dtype=_torch_dtype(spec.dtype),
                                                   device=torch.device("cuda", index))
            if spec.nbytes:
                spans.append((entry.start, entry.end, tensor.data_ptr()))
        return sorted(spans)

    loaded = client(where).submit(load_to_device, where, index, make).result()
    _report(loaded, figures)
    return made


def _report(loaded: Any, figures: dict[str, Any] | None) -> None:
    if figures is not None:
        figures.update(version=loaded.version, local_bytes=loaded.local_bytes,
                       network_bytes=loaded.network_bytes, read_s=loaded.read_s)


def load_numpy(path: PathLike) -> dict[str, np.ndarray]:
    """The newest version of PATH as numpy arrays (`safetensors.numpy.load_file`)."""
    where = target(path)
    loaded = client(where).submit(
        read_file, where, lambda n: np.empty(n, dtype=np.uint8)).result()
    plan, buffer = loaded.layout, loaded.buffer
    out = {}
    for entry in sorted(plan.entries, key=lambda e: e.spec.name):
        dtype = np.dtype(_NUMPY.get(entry.spec.dtype, "V"))
        if entry.spec.dtype not in _NUMPY:
            from mosafs.errors import InvalidArgument

            raise InvalidArgument(f"tensor {entry.spec.name!r} is {entry.spec.dtype}, "
                                  f"which numpy has no dtype for: load it with torch")
        out[entry.spec.name] = buffer[entry.start:entry.end].view(dtype).reshape(
            entry.spec.shape).copy()
    return out


_NUMPY = {"F64": "float64", "F32": "float32", "F16": "float16", "I64": "int64",
          "I32": "int32", "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32",
          "U16": "uint16", "U8": "uint8", "BOOL": "bool", "C64": "complex64"}


def _torch_dtype(name: str) -> Any:
    import torch

    from mosafs.checkpoint.sources import DTYPE_NAMES

    for torch_name, st_name in DTYPE_NAMES.items():
        if st_name == name and hasattr(torch, torch_name):
            return getattr(torch, torch_name)
    from mosafs.errors import InvalidArgument

    raise InvalidArgument(f"dtype {name} ({BITS.get(name, '?')} bits) has no torch dtype here")
