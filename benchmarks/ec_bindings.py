"""Which Python binding for the erasure code of DESIGN §10? Prints one JSON object.

    .venv/bin/python benchmarks/ec_bindings.py [--seconds 0.3] [--repeat 3] [--threads N]

Compared, for 4+2 and 8+2 on 1 MiB chunks (GB/s of chunk bytes, best of REPEAT runs):

* pyeclib (PyPI, isa_l_rs_cauchy: liberasurecode over the ISA-L copy in its wheel), fed
  input already padded to K*S (its own padding differs) and its 80-byte fragment
  headers skipped (memoryview, no copy), which is how it reproduces the vectors;
* ctypes_isal: mosafs.erasure.isal.IsalCoder on the system's libisal, and again on the
  pyeclib wheel's copy when both are present;
* zfec (if installed): a different code (its own Vandermonde-derived matrix), so it
  cannot reproduce the vectors; here for speed only.

Per binding and shape: encode on one thread and on N threads at once (does it scale,
i.e. is the GIL released: see also `gil`, measured on one long call), bytes copied per
encode (from each binding's code path, stated below), decode with 1 and with M data
fragments lost, and whether it reproduces tests/vectors/erasure-v1.json (computed).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mosafs.bench.ec_coders import (
    CHUNK_BYTES,
    SHAPES,
    MiB,
    best_rate,
    cpu_count,
    gil_check,
    random_bytes,
    threaded_rate,
)
from mosafs.erasure import fragment_size
from mosafs.erasure.isal import IsalCoder, load_isal, pyeclib_library, system_library

VECTORS = Path(__file__).resolve().parents[1] / "tests" / "vectors" / "erasure-v1.json"
HEADER = 80  # bytes of liberasurecode's fragment header


class Binding:
    """One way to run K+M from Python: encode(chunk) -> parity buffers, decode(kept) ->
    chunk bytes, and the bytes its encode copies."""

    name = ""
    note = ""

    def __init__(self, k: int, m: int) -> None:
        self.k, self.m = k, m

    def encode(self, chunk: bytes) -> list[Any]:
        raise NotImplementedError

    def fragments(self, chunk: bytes) -> list[Any]:
        """All K+M fragments as the binding gives them (for decode and the vectors)."""
        raise NotImplementedError

    def decode(self, kept: dict[int, Any], length: int) -> Any:
        raise NotImplementedError

    def copied(self, length: int) -> int:
        raise NotImplementedError

    def payload(self, fragment: Any) -> Any:
        """The fragment's bytes as DESIGN §10 defines them."""
        return fragment


class Pyeclib(Binding):
    name = "pyeclib"
    note = ("liberasurecode + ISA-L (isa_l_rs_cauchy); the C extension holds the GIL, copies "
            "the input into aligned fragment buffers with 80-byte headers, then each "
            "fragment into a Python bytes object; decode needs the headers")

    def __init__(self, k: int, m: int) -> None:
        super().__init__(k, m)
        from pyeclib.ec_iface import ECDriver

        self.driver = ECDriver(k=k, m=m, ec_type="isa_l_rs_cauchy")

    def _padded(self, chunk: bytes) -> bytes:
        want = self.k * fragment_size(len(chunk), self.k)
        return chunk if len(chunk) == want else chunk + bytes(want - len(chunk))

    def fragments(self, chunk: bytes) -> list[Any]:
        return list(self.driver.encode(self._padded(chunk)))

    def encode(self, chunk: bytes) -> list[Any]:
        return [memoryview(f)[HEADER:] for f in self.fragments(chunk)[self.k:]]

    def payload(self, fragment: Any) -> Any:
        return memoryview(fragment)[HEADER:]

    def decode(self, kept: dict[int, Any], length: int) -> Any:
        return memoryview(self.driver.decode(list(kept.values())))[:length]

    def copied(self, length: int) -> int:
        size = fragment_size(length, self.k)
        pad = 0 if length == self.k * size else self.k * size  # the caller's padded copy
        return pad + self.k * size + (self.k + self.m) * (size + HEADER)


class CtypesIsal(Binding):
    name = "ctypes_isal"
    note = ("mosafs.erasure.isal: ISA-L through ctypes.CDLL (GIL released for every call); "
            "data fragments are views of the chunk, parity written into the caller's "
            "buffer, only the 64-byte line where a chunk ends is copied")

    def __init__(self, k: int, m: int, which: str = "auto") -> None:
        super().__init__(k, m)
        self.coder = IsalCoder(load_isal(which))
        self.out: Any = None

    def fragments(self, chunk: bytes) -> list[Any]:
        return list(self.coder.fragments(chunk, self.k, self.m))

    def encode(self, chunk: bytes) -> list[Any]:
        if self.out is None or self.out.shape[1] != fragment_size(len(chunk), self.k):
            self.out = self.coder.encode(chunk, self.k, self.m)
            return list(self.out)
        return list(self.coder.encode(chunk, self.k, self.m, out=self.out))

    def decode(self, kept: dict[int, Any], length: int) -> Any:
        return self.coder.decode(kept, self.k, self.m, length)

    def copied(self, length: int) -> int:
        size = fragment_size(length, self.k)
        return length % 64 if length % size else 0


class Zfec(Binding):
    name = "zfec"
    note = ("different code (zfec's Vandermonde-derived matrix): cannot reproduce the "
            "vectors; releases the GIL; takes memoryviews, returns parity as new bytes")

    def __init__(self, k: int, m: int) -> None:
        super().__init__(k, m)
        import zfec

        self.enc = zfec.Encoder(k, k + m)
        self.dec = zfec.Decoder(k, k + m)
        self.parity_ids = tuple(range(k, k + m))

    def _blocks(self, chunk: bytes) -> tuple[Any, ...]:
        size = fragment_size(len(chunk), self.k)
        data = chunk if len(chunk) == self.k * size else chunk + bytes(self.k * size - len(chunk))
        view = memoryview(data)
        return tuple(view[j * size:(j + 1) * size] for j in range(self.k))

    def fragments(self, chunk: bytes) -> list[Any]:
        blocks = self._blocks(chunk)
        return list(blocks) + list(self.enc.encode(blocks, self.parity_ids))

    def encode(self, chunk: bytes) -> list[Any]:
        return list(self.enc.encode(self._blocks(chunk), self.parity_ids))

    def decode(self, kept: dict[int, Any], length: int) -> Any:
        ids = tuple(sorted(kept)[:self.k])
        parts = self.dec.decode(tuple(kept[i] for i in ids), ids)
        return b"".join(parts)[:length]

    def copied(self, length: int) -> int:
        size = fragment_size(length, self.k)
        return 0 if length == self.k * size else self.k * size  # the padded copy


def reproduces_vectors(make: Callable[[int, int], Binding]) -> bool:
    """Every fragment's BLAKE3 in erasure-v1.json, for every case."""
    for case in json.loads(VECTORS.read_text())["cases"]:
        binding = make(case["k"], case["m"])
        chunk = blake3.blake3(case["seed"].encode()).digest(length=case["length"])
        got = [blake3.blake3(binding.payload(f)).hexdigest()
               for f in binding.fragments(chunk)]
        if got != case["fragments"]:
            return False
    return True


def figures(make: Callable[[int, int], Binding], k: int, m: int, *, threads: int,
            seconds: float, repeat: int) -> dict[str, Any]:
    chunk = random_bytes(CHUNK_BYTES, seed=k)
    binding = make(k, m)
    frags = binding.fragments(chunk)

    def encoder() -> Callable[[], Any]:
        mine = make(k, m)
        data = random_bytes(CHUNK_BYTES, seed=id(mine) % 997)
        return functools.partial(mine.encode, data)

    def decoder(lost: int) -> Callable[[], Any]:
        mine = make(k, m)
        kept = {i: f for i, f in enumerate(frags) if i >= lost}
        return functools.partial(mine.decode, kept, CHUNK_BYTES)

    row: dict[str, Any] = {
        "encode_GBps_1_thread": best_rate(encoder(), CHUNK_BYTES, seconds=seconds,
                                          repeat=repeat),
        "encode_GBps_all_threads": threaded_rate(encoder, CHUNK_BYTES, threads,
                                                 seconds=seconds, repeat=repeat),
        "copied_bytes_per_encode": binding.copied(CHUNK_BYTES),
        "decode_GBps_1_lost": best_rate(decoder(1), CHUNK_BYTES, seconds=seconds,
                                        repeat=repeat),
        f"decode_GBps_{m}_lost": best_rate(decoder(m), CHUNK_BYTES, seconds=seconds,
                                           repeat=repeat),
    }
    row["encode_thread_scaling"] = round(row["encode_GBps_all_threads"]
                                         / row["encode_GBps_1_thread"], 2)
    assert bytes(binding.decode({i: f for i, f in enumerate(frags) if i >= m},
                                CHUNK_BYTES)) == chunk, f"{binding.name} decode is wrong"
    return row


def bindings() -> dict[str, tuple[Callable[[int, int], Binding], str | None]]:
    """name -> (factory, version), for the bindings installed here."""
    found: dict[str, tuple[Callable[[int, int], Binding], str | None]] = {}
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        found["pyeclib"] = (Pyeclib, importlib.metadata.version("pyeclib"))
    if system_library() is not None:
        found["ctypes_isal"] = (functools.partial(CtypesIsal, which="system"), None)
    if pyeclib_library() is not None:
        found["ctypes_isal_pyeclib_copy"] = (functools.partial(CtypesIsal, which="pyeclib"),
                                             None)
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        found["zfec"] = (Zfec, importlib.metadata.version("zfec"))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.3, help="per timed run")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per figure (best)")
    parser.add_argument("--threads", type=int, default=cpu_count())
    args = parser.parse_args()
    long_chunk = random_bytes(32 * MiB, seed=3)
    out: dict[str, Any] = {
        "machine": {"cpus": cpu_count(), "python": sys.version.split()[0]},
        "units": "GB/s of chunk bytes (10^9 B/s of input), best of repeat runs",
        "chunk_bytes": CHUNK_BYTES, "threads": args.threads, "seconds_per_run": args.seconds,
        "repeat": args.repeat, "bindings": {},
    }
    present = bindings()
    for name, (make, version) in present.items():
        probe = make(8, 2)
        entry: dict[str, Any] = {"version": version, "note": probe.note,
                                 "reproduces_vectors": reproduces_vectors(make)}
        if isinstance(probe, CtypesIsal):
            entry["library"] = probe.coder.library
        entry["gil_32MiB_8+2_encode"] = gil_check(functools.partial(probe.encode, long_chunk))
        for k, m in SHAPES:
            entry[f"{k}+{m}"] = figures(make, k, m, threads=args.threads,
                                        seconds=args.seconds, repeat=args.repeat)
        out["bindings"][name] = entry
    if "zfec" not in present:
        out["bindings"]["zfec"] = {"skipped": "zfec is not installed (pip install zfec; a "
                                   "different code, for speed comparison only)"}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
