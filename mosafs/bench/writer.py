"""One benchmark writer: `python -m mosafs.bench.writer JOB.json RESULT.json`.

It writes the steps of one workload (mosafs.bench.workloads) as files of one folder through
the client's own write path, in this process: the same FileSystem, write sessions, sliding
window, chunking, dedupe, striped uploads and commits as `mosafs mount`, without the
kernel's FUSE layer (whose cost `mosafs bench write` measures on its own). Running it as
a process of its own lets the benchmark put it in a network namespace, run several at once
(`mosafs bench clients`) and charge it exactly its CPU time.

Per file it measures, from just before the open:

- OAB, observed application bandwidth: size / time until the last write() returned
  (what the application waits for while it writes; the sliding window holds the rest);
- ASB, achieved storage bandwidth: size / time until close() returned (every chunk
  stored as the pool's write semantics require, the version committed);
- the client's CPU seconds (user + system, every thread) over the same span;
- the version's figures from the manager: new bytes sent, bytes shared with its base.

The job's `content_addressing: false` is the non-CA baseline: chunk ids come precomputed
(the oracle backend: no hashing in the client) and nothing is deduplicated (no base, no
index look-ups): every byte is sent. Data is generated, and the oracle primed, before the
clock starts.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

MB = 1e6


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _folder(fs: Any, path: str) -> int:
    """The inode of PATH (under the root), made if missing."""
    from mosafs import errors

    inode = 1
    for part in [p for p in path.split("/") if p]:
        try:
            inode = (await fs.lookup(inode, part)).inode
        except errors.NotFound:
            try:
                inode = (await fs.mkdir(inode, part, 0o755, 0, 0)).inode
            except errors.AlreadyExists:  # another writer made it meanwhile
                inode = (await fs.lookup(inode, part)).inode
    return inode


async def _write_one(fs: Any, folder: int, name: str, data: bytes, block: int) -> dict[str, Any]:
    view = memoryview(data)
    cpu0, start = _cpu(), time.perf_counter()
    wall = time.time()
    fh, attr = await fs.create_file(folder, name, 0o644,
                                    os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0, 0)
    for offset in range(0, len(data), block):
        await fs.write(fh, offset, view[offset:offset + block])
    written = time.perf_counter()
    await fs.flush(fh)
    await fs.release(fh)
    closed = time.perf_counter()
    cpu = _cpu() - cpu0
    stats = await fs.manager.version_stats(attr.inode)
    size = len(data)
    return {
        "name": name, "size": size, "start_wall": wall, "end_wall": wall + closed - start,
        "write_s": written - start, "close_s": closed - start,
        "oab_mb_s": size / (written - start) / MB, "asb_mb_s": size / (closed - start) / MB,
        "cpu_s": cpu, "new_bytes": stats.new_bytes, "shared_bytes": stats.shared_bytes,
        "chunks": stats.chunks, "deduped_against_version": stats.base_version,
    }


async def run_job(job: dict[str, Any]) -> dict[str, Any]:
    import trio

    from mosafs.bench.workloads import Workload, steps
    from mosafs.client.files import ClientConfig, ClientContext, FileSystem
    from mosafs.errors import MosafsError

    workload = Workload.from_json(job["workload"])
    ca = bool(job.get("content_addressing", True))
    backend = job.get("hash_backend", "cpu") if ca else "oracle"
    config = ClientConfig(manager=job["manager"], hash_backend=backend,
                          window_bytes=int(job.get("window_mib", 64)) << 20,
                          dedupe_with_index=ca, dedupe_with_base=ca)
    out: dict[str, Any] = {"files": [], "errors": [], "hash_backend": backend}
    generated = steps(workload)
    first = next(generated)
    _prime(backend, job["chunker"], first)
    async with trio.open_nursery() as nursery:
        ctx = await ClientContext.create(config, nursery)
        try:
            fs = await FileSystem.create(ctx)
            folder = await _folder(fs, job["folder"])
            if job.get("chunker") and backend != "oracle":
                # Compiled kernels (numba, CUDA) are built on first use: not on the clock.
                ctx.chunker(job["chunker"]).chunk_all(first[:8 << 20])
            await trio.sleep(max(0.0, float(job.get("start_at", 0)) - time.time()))
            for step, data in enumerate(itertools.chain([first], generated), 1):
                if step > 1:
                    _prime(backend, job["chunker"], data)
                name = job["name_template"].format(step=step)
                try:
                    out["files"].append({"step": step, **await _write_one(
                        fs, folder, name, data, int(job.get("write_bytes", 1 << 20)))})
                except MosafsError as exc:
                    out["errors"].append(f"{name}: {exc.message}")
            await fs.close()
        finally:
            ctx.close()
            nursery.cancel_scope.cancel()
    return out


def _prime(backend: str, spec: str, data: bytes) -> None:
    """The oracle knows the chunks of DATA before it is written (computed on the CPU)."""
    if backend != "oracle":
        return
    from mosafs.chunking import oracle

    oracle.clear()
    oracle.prime(spec, data)


def main(argv: list[str]) -> int:
    import trio

    from mosafs.procutil import setup_logging

    if len(argv) != 2:
        print("usage: python -m mosafs.bench.writer JOB.json RESULT.json", file=sys.stderr)
        return 2
    setup_logging(os.environ.get("MOSAFS_BENCH_LOG", "WARNING"))
    job = json.loads(Path(argv[0]).read_text())
    cpu0 = _cpu()
    result = trio.run(run_job, job)
    result["process_cpu_s"] = _cpu() - cpu0
    tmp = Path(argv[1]).with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
