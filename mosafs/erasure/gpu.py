"""The GPU coder: the kernels of `gpu_kernels` through CuPy, matrices from ISA-L.

    coder = make_coder("gpu")                        # ConfigError, saying why, without a GPU
    parity = coder.encode_device(chunk_dev, 8, 2)    # cupy (M, S); chunk already on the GPU
    parity = coder.encode_device(batch_dev, 8, 2)    # (B, L) equal chunks -> (B, M, S)
    host = coder.encode_to_host(chunk_dev, 8, 2)     # the same, only parity copied back
    chunk_dev = coder.decode_device(frags_dev, 8, 2, length)
    lost_dev = coder.rebuild_device(frags_dev, 8, 2, [3, 9])
    coder.encode(chunk, 8, 2) / decode / rebuild     # host buffers in and out (Coder API)

The small matrices (the encode matrix, the inverse of the survivors' rows, the rows for
the lost fragments) are computed on the host with ISA-L, exactly as the CPU coder does,
so both give the same fragments; only the multiply by the fragments runs on the device.
Encode kernels have the coefficients of their (K, M) compiled in; decode and rebuild
kernels take theirs as parameters (one kernel per (K, lost count), whatever the erasure
pattern). Kernels are compiled on first use (NVRTC; CuPy keeps them on disk).

CuPy is imported when a GPU coder is made, never at import of mosafs.erasure. Without
CuPy, a device, or ISA-L, "gpu" is unavailable with the reason, and asking for it is a
ConfigError (registry): there is no silent CPU fallback.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mosafs.erasure.base import (
    U8,
    BytesLike,
    Coder,
    as_u8,
    check_length,
    check_wanted,
    copy_present,
    fragment_arrays,
    fragment_size_of,
    missing_data,
    survivors,
)
from mosafs.erasure.gpu_kernels import (
    BLOCK,
    GROUP_BYTES,
    kernel_name,
    kernel_source,
    pack_coefficients,
)
from mosafs.erasure.isal import (
    IsaL,
    decode_plan,
    isal_unavailable_reason,
    load_isal,
    uninitialized_bytearray,
)
from mosafs.erasure.spec import Code
from mosafs.errors import InvalidArgument

_NVRTC_OPTIONS = ("-std=c++17",)
_MAX_GRID_Y = 65535
_D2D = 3  # cudaMemcpyDeviceToDevice
Matrix = tuple[tuple[int, ...], ...]


@functools.cache
def _cupy() -> Any:
    """CuPy, imported once (a filtered import costs microseconds on every call)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CuPy may warn about CUDA paths on import
        return importlib.import_module("cupy")


def _quiet(fn: Any, *args: Any) -> Any:
    """A CuPy call that may compile, with CuPy's warnings filtered (the test suite makes
    warnings errors; a compiler notice is not one)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


@functools.cache
def gpu_unavailable_reason() -> str | None:
    """None when the GPU coder can run here, else why not: CuPy and a device (the same
    probe as the GPU chunkers), ISA-L for the matrices, and a kernel that compiles."""
    from mosafs.gpuprobe import probe_gpu

    reason = probe_gpu()
    if reason is not None:
        return reason
    reason = isal_unavailable_reason()
    if reason is not None:
        return f"its matrices come from ISA-L, and {reason}"
    try:
        _kernel(int(_cupy().cuda.runtime.getDevice()), 1, 1, ((1,),))
    except Exception as exc:  # any failure here means "no usable GPU", with the reason
        return f"the erasure kernels could not be built ({type(exc).__name__}: {exc})"
    return None


# --- kernels ---------------------------------------------------------------------------

_KERNELS: dict[tuple[int, int, int, Matrix | None], tuple[Any, Any]] = {}
_KERNELS_LOCK = threading.Lock()


def _kernel(device: int, k: int, rows: int, matrix: Matrix | None) -> Any:
    """The compiled kernel for K inputs and ROWS outputs on DEVICE: MATRIX baked in, or
    (None) taking coefficients as parameters. Compiled once per process and device."""
    key = (device, k, rows, matrix)
    found = _KERNELS.get(key)
    if found is None:
        with _KERNELS_LOCK:
            found = _KERNELS.get(key)
            if found is None:
                cupy = _cupy()
                source = kernel_source(k, rows, matrix)
                with cupy.cuda.Device(device):
                    module = _quiet(lambda: cupy.RawModule(code=source,
                                                           options=_NVRTC_OPTIONS))
                    found = (module, _quiet(module.get_function,
                                            kernel_name(k, rows, matrix)))
                _KERNELS[key] = found
    return found[1]


@dataclass(frozen=True, slots=True)
class Launch:
    """A kernel launch with its arguments built, to run once or again and again on the
    same buffers (a pipeline's fixed staging buffers; the benchmark's kernels alone):
    `launch(stream)` only queues the kernel, a few microseconds of host time."""

    fn: Any
    calls: tuple[tuple[tuple[int, int], tuple[Any, ...]], ...]
    """(grid, arguments) per launch: more than 65535 chunks take several."""
    keep: tuple[Any, ...] = ()
    """The arrays whose addresses the arguments hold, kept alive as long as the launch."""

    def __call__(self, stream: Any = None) -> None:
        for grid, args in self.calls:
            self.fn(grid, (BLOCK,), args, stream=stream)


def _prepare(fn: Any, inputs: Sequence[tuple[int, int]], outputs: Sequence[tuple[int, int]],
             coefficients: Sequence[int] | None, frag: int, *, nchunks: int = 1,
             in_stride: int = 0, out_stride: int = 0, keep: tuple[Any, ...] = ()) -> Launch:
    """FN over NCHUNKS chunks: inputs/outputs are (address, have/room) of chunk 0; chunk
    c's lie c * STRIDE bytes further. 16-byte vector accesses only when every address and
    stride allows them."""
    addresses = [a for a, _ in inputs] + [a for a, _ in outputs]
    vec = all(a % GROUP_BYTES == 0 for a in addresses) and not (in_stride | out_stride) % 16
    grid_x = max(1, -(-frag // (GROUP_BYTES * BLOCK)))
    tail: list[Any] = [np.int64(have) for _, have in inputs]
    calls = []
    for first in range(0, nchunks, _MAX_GRID_Y):
        args: list[Any] = [np.uint64(a + first * in_stride) for a, _ in inputs]
        args += tail
        args += [np.uint64(a + first * out_stride) for a, _ in outputs]
        args += [np.int64(room) for _, room in outputs]
        if coefficients is not None:
            args += [np.uint32(w) for w in coefficients]
        args += [np.int64(frag), np.int64(in_stride), np.int64(out_stride), np.int32(vec)]
        calls.append(((grid_x, min(_MAX_GRID_Y, nchunks - first)), tuple(args)))
    return Launch(fn, tuple(calls), keep)


@contextlib.contextmanager
def _on(device: int, stream: Any) -> Iterator[Any]:
    """Make DEVICE current, and STREAM (when given) the current stream; yields the stream
    in use."""
    cupy = _cupy()
    with cupy.cuda.Device(device), (stream if stream is not None else contextlib.nullcontext()):
        yield cupy.cuda.get_current_stream()


# --- the coder -------------------------------------------------------------------------

class GpuCoder(Coder):
    """The GPU coder. Device methods take and return CuPy arrays on the arrays' device and
    queue work on STREAM (default: the current stream) without waiting for it; host
    methods copy in, run on DEVICE (default: the current one), and copy back."""

    name = "gpu"

    def __init__(self, isal: IsaL | None = None, device: int | None = None) -> None:
        cupy = _cupy()
        self.isal = isal if isal is not None else load_isal()
        self.device = int(cupy.cuda.runtime.getDevice()) if device is None else device
        props = cupy.cuda.runtime.getDeviceProperties(self.device)
        name = props["name"]
        self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        self.library = (f"CUDA kernels on GPU {self.device} ({self.device_name}); matrices "
                        f"by {self.isal.description}")
        self._coefficients: dict[Code, tuple[Matrix, list[int]]] = {}

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return gpu_unavailable_reason()

    def __repr__(self) -> str:
        return f"<GpuCoder {self.library}>"

    # -- device arrays in and out --

    def encode_device(self, chunk_dev: Any, k: int, m: int, *, out: Any | None = None,
                      stream: Any = None, baked: bool = True) -> Any:
        """Parity of a chunk on the device: a uint8 CuPy array of L bytes gives (M, S); a
        (B, L) array of B chunks (rows may be strided) gives (B, M, S). OUT: a C-contiguous
        uint8 device array of that shape to write into. BAKED=False uses the kernel with
        coefficients as parameters (benchmarks compare the two). Queued on STREAM."""
        device = _device_of(chunk_dev)
        with _on(device, stream) as current:
            launch, parity = self.prepare_encode(chunk_dev, k, m, out=out, baked=baked)
            launch(current)
        return parity

    def prepare_encode(self, chunk_dev: Any, k: int, m: int, *, out: Any | None = None,
                       baked: bool = True) -> tuple[Launch, Any]:
        """encode_device's launch, built but not queued, and the parity array it writes:
        for buffers that are encoded again and again (allocate OUT on the stream that
        will run it, or let this allocate under that stream's context)."""
        code = Code(k, m)
        src = _device_chunks(chunk_dev)
        nchunks, length = int(src.shape[0]), int(src.shape[1])
        lay = code.layout(length)
        size = lay.size
        device = int(src.device.id)
        with _cupy().cuda.Device(device):
            parity = _parity_out(out, (nchunks, m, size), device)
            matrix, words = self._encode_coefficients(code)
            fn = _kernel(device, k, m, matrix if baked else None)
        base = int(src.data.ptr)
        launch = _prepare(fn, [(base + j * size, lay.data_bytes(j)) for j in range(k)],
                          [(int(parity.data.ptr) + i * size, size) for i in range(m)],
                          None if baked else words, size, nchunks=nchunks,
                          in_stride=int(src.strides[0]), out_stride=m * size,
                          keep=(src, parity))
        return launch, (parity if chunk_dev.ndim == 2 else parity[0])

    def _encode_coefficients(self, code: Code) -> tuple[Matrix, list[int]]:
        """The parity rows as a kernel key, and packed as kernel parameters (cached)."""
        found = self._coefficients.get(code)
        if found is None:
            rows = self.isal.encode_matrix(code)[code.k:].tolist()
            found = (tuple(tuple(int(v) for v in row) for row in rows),
                     pack_coefficients(rows))
            self._coefficients[code] = found
        return found

    def encode_to_host(self, chunk_dev: Any, k: int, m: int, *, out: Any | None = None,
                       stream: Any = None) -> U8:
        """encode_device, then only the parity copied back: a numpy array (M, S), or
        (B, M, S) for a batch; OUT: a numpy array of that shape (pinned memory copies
        fastest). Returns when the copy is done."""
        parity = self.encode_device(chunk_dev, k, m, stream=stream)
        with _on(int(parity.device.id), stream) as current:
            host = parity.get(stream=current, out=out)
            current.synchronize()
        return host  # type: ignore[no-any-return]

    def decode_device(self, fragments: Mapping[int, Any], k: int, m: int, length: int, *,
                      stream: Any = None) -> Any:
        """The LENGTH-byte chunk (a CuPy array) from any K device fragments: lost data
        fragments are decoded straight into it, present ones copied (device to device)."""
        code = Code(k, m)
        arrays, device = _device_fragments(code, fragments)
        size = fragment_size_of(code, {i: int(a.shape[0]) for i, a in arrays.items()})
        lay = check_length(code, size, length)
        cupy = _cupy()
        with _on(device, stream) as current:
            result = cupy.empty(length, dtype=cupy.uint8)
            base = int(result.data.ptr)
            lost = missing_data(lay, arrays)
            if lost:
                self._multiply(code, arrays, lost, size,
                               [(base + j * size, lay.data_bytes(j)) for j in lost],
                               device, current)
            for j in range(lay.carrying):
                if j in arrays:
                    cupy.cuda.runtime.memcpyAsync(base + j * size, int(arrays[j].data.ptr),
                                                  lay.data_bytes(j), _D2D, current.ptr)
        return result

    def rebuild_device(self, fragments: Mapping[int, Any], k: int, m: int,
                       wanted: Iterable[int], *, stream: Any = None) -> dict[int, Any]:
        """The WANTED fragments (CuPy arrays of S bytes) from any K device fragments."""
        code = Code(k, m)
        arrays, device = _device_fragments(code, fragments)
        size = fragment_size_of(code, {i: int(a.shape[0]) for i, a in arrays.items()})
        want = check_wanted(code, wanted)
        cupy = _cupy()
        with _on(device, stream) as current:
            out = {w: arrays[w].copy() for w in want if w in arrays}
            todo = tuple(w for w in want if w not in arrays)
            if todo:
                bufs = {w: cupy.empty(size, dtype=cupy.uint8) for w in todo}
                self._multiply(code, arrays, todo, size,
                               [(int(bufs[w].data.ptr), size) for w in todo], device, current)
                out.update(bufs)
        return {w: out[w] for w in want}

    def _multiply(self, code: Code, arrays: Mapping[int, Any], wanted: tuple[int, ...],
                  size: int, outputs: Sequence[tuple[int, int]], device: int,
                  stream: Any) -> None:
        """Queue the decode kernel: fragments WANTED from the first K of ARRAYS."""
        self._prepare_multiply(code, arrays, wanted, size, outputs, device)(stream)

    def _prepare_multiply(self, code: Code, arrays: Mapping[int, Any],
                          wanted: tuple[int, ...], size: int,
                          outputs: Sequence[tuple[int, int]], device: int) -> Launch:
        plan = decode_plan(self.isal, code, survivors(code, arrays), wanted)
        fn = _kernel(device, code.k, len(wanted), None)
        return _prepare(fn, [(int(arrays[i].data.ptr), size) for i in plan.survivors],
                        outputs, pack_coefficients(plan.matrix.tolist()), size,
                        keep=tuple(arrays[i] for i in plan.survivors))

    def prepare_rebuild(self, fragments: Mapping[int, Any], k: int, m: int,
                        wanted: Iterable[int]) -> tuple[Launch, dict[int, Any]]:
        """rebuild_device's kernel, built but not queued, and the arrays it fills (every
        wanted fragment must be missing from FRAGMENTS): the kernel alone, for benchmarks
        and for pipelines that rebuild into the same buffers again and again."""
        code = Code(k, m)
        arrays, device = _device_fragments(code, fragments)
        size = fragment_size_of(code, {i: int(a.shape[0]) for i, a in arrays.items()})
        want = check_wanted(code, wanted)
        if any(w in arrays for w in want):
            raise InvalidArgument(f"{code}: fragments {sorted(set(want) & set(arrays))} "
                                  "are not missing")
        cupy = _cupy()
        with cupy.cuda.Device(device):
            bufs = {w: cupy.empty(size, dtype=cupy.uint8) for w in want}
        launch = self._prepare_multiply(code, arrays, want, size,
                                        [(int(bufs[w].data.ptr), size) for w in want], device)
        return Launch(launch.fn, launch.calls, (*launch.keep, *bufs.values())), bufs

    # -- host buffers in and out (the Coder interface) --

    def encode(self, chunk: BytesLike, k: int, m: int, *, out: Any | None = None) -> U8:
        src = as_u8(chunk)
        Code(k, m).layout(int(src.shape[0]))  # checks K, M and the length before copying
        cupy = _cupy()
        with cupy.cuda.Device(self.device):
            parity = self.encode_to_host(cupy.asarray(src), k, m)
        if out is None:
            return parity
        target = as_u8(out)
        if target.shape[0] != parity.size:
            raise InvalidArgument(f"parity buffer holds {target.shape[0]} bytes, "
                                  f"need M*S = {parity.size}")
        target[:] = parity.reshape(-1)
        return target.reshape(parity.shape)

    def decode(self, fragments: Mapping[int, BytesLike], k: int, m: int,
               length: int) -> bytearray:
        code = Code(k, m)
        size, arrays = fragment_arrays(code, fragments)
        lay = check_length(code, size, length)
        result = uninitialized_bytearray(length)  # every byte is written below
        dst = np.frombuffer(result, dtype=np.uint8)
        if not missing_data(lay, arrays):
            copy_present(lay, arrays, dst)  # every data fragment here: no arithmetic
            return result
        cupy = _cupy()
        with cupy.cuda.Device(self.device):
            chosen = {i: cupy.asarray(arrays[i]) for i in survivors(code, arrays)}
            self.decode_device(chosen, k, m, length).get(out=dst)
        return result

    def rebuild(self, fragments: Mapping[int, BytesLike], k: int, m: int,
                wanted: Iterable[int]) -> dict[int, bytearray]:
        code = Code(k, m)
        _size, arrays = fragment_arrays(code, fragments)
        want = check_wanted(code, wanted)
        cupy = _cupy()
        with cupy.cuda.Device(self.device):
            chosen = {i: cupy.asarray(arrays[i]) for i in survivors(code, arrays)}
            rebuilt = self.rebuild_device(
                chosen, k, m, [w for w in want if w not in arrays])
        out = {w: bytearray(arrays[w]) for w in want if w in arrays}
        for w, dev in rebuilt.items():
            out[w] = uninitialized_bytearray(dev.nbytes)
            dev.get(out=np.frombuffer(out[w], dtype=np.uint8))
        return {w: out[w] for w in want}


# --- argument checks for device arrays -------------------------------------------------

def _device_chunks(chunk_dev: Any) -> Any:
    """CHUNK_DEV as a 2-D (B, L) uint8 CuPy array whose rows are contiguous."""
    cupy = _cupy()
    if not isinstance(chunk_dev, cupy.ndarray) or chunk_dev.dtype != cupy.uint8:
        raise InvalidArgument(f"encode_device takes a uint8 CuPy array, got "
                              f"{type(chunk_dev).__name__} {getattr(chunk_dev, 'dtype', '')}")
    if chunk_dev.ndim not in (1, 2):
        raise InvalidArgument(f"encode_device takes one chunk (L,) or a batch (B, L), got "
                              f"shape {chunk_dev.shape}")
    src = chunk_dev if chunk_dev.ndim == 2 else chunk_dev.reshape(1, -1)
    if src.shape[1] > 1 and src.strides[1] != 1:
        raise InvalidArgument("encode_device needs each chunk's bytes contiguous")
    return src


def _device_of(array: Any) -> int:
    """The GPU a CuPy array lies on."""
    if not isinstance(array, _cupy().ndarray):
        raise InvalidArgument(f"encode_device takes a uint8 CuPy array, got "
                              f"{type(array).__name__}")
    return int(array.device.id)


def _parity_out(out: Any | None, shape: tuple[int, int, int], device: int) -> Any:
    cupy = _cupy()
    if out is None:
        return cupy.empty(shape, dtype=cupy.uint8)
    if (not isinstance(out, cupy.ndarray) or out.dtype != cupy.uint8
            or not out.flags.c_contiguous or out.size != shape[0] * shape[1] * shape[2]
            or int(out.device.id) != device):
        raise InvalidArgument(f"parity buffer must be a C-contiguous uint8 CuPy array of "
                              f"{shape[0] * shape[1] * shape[2]} bytes on GPU {device}")
    return out.reshape(shape)


def _device_fragments(code: Code, fragments: Mapping[int, Any]) -> tuple[dict[int, Any], int]:
    """FRAGMENTS checked: valid indices, contiguous uint8 CuPy arrays on one device."""
    cupy = _cupy()
    arrays: dict[int, Any] = {}
    devices = set()
    for index, frag in fragments.items():
        if (not isinstance(frag, cupy.ndarray) or frag.dtype != cupy.uint8
                or frag.ndim != 1 or not frag.flags.c_contiguous):
            raise InvalidArgument(f"{code}: fragment {index} is not a contiguous 1-D uint8 "
                                  "CuPy array")
        arrays[code.check_index(index)] = frag
        devices.add(int(frag.device.id))
    if len(devices) > 1:
        raise InvalidArgument(f"{code}: fragments lie on several GPUs ({sorted(devices)})")
    device = devices.pop() if devices else int(cupy.cuda.runtime.getDevice())
    return arrays, device


__all__ = ["GpuCoder", "Launch", "gpu_unavailable_reason"]
