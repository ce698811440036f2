"""`mosafs bench backends`: what the mount spends per GiB written, by hash backend.

For each backend asked for, a fresh `mosafs up --hash-backend B` (three benefactors on
loopback, its own data directory) takes two checkpoints of SIZE bytes written with 1 MiB
writes: `new`, every byte new (chunking, hashing and uploads all count), then
`checkpoint`, the same bytes with a few small edits (nearly every chunk dedupes, so the
write path is mostly chunking and hashing: where a backend's cost shows most). The
figures are the mount process's CPU seconds (user + system) per GiB from open to the
committed version, the wall time, and the chunks, which must be the same for every
backend (checked: a backend that cut differently would be a bug, not a figure).
"""

from __future__ import annotations

import datetime
import gc
from pathlib import Path
from typing import Any

from mosafs.bench.procs import BenchError
from mosafs.bench.timing import make_data
from mosafs.bench.write import (
    LARGE_WRITE,
    _Mosafs,
    _timed_write,
    _work_dir,
    git_info,
    machine_info,
    progress,
)

GiB = 1 << 30
EDITS = 8
"""Small edits spread over the second checkpoint (each changes ~2 chunks)."""


def run_benchmark(backends: list[str], size: int, keep: Path | None,
                  command: str) -> dict[str, Any]:
    result: dict[str, Any] = {
        "benchmark": "mosafs bench backends",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine_info(),
        "git": git_info(),
        "params": {"size_bytes": size, "write_bytes": LARGE_WRITE, "edits": EDITS,
                   "units": "cpu_s_per_gib: CPU seconds (user+system) of the mount "
                            "process per GiB written; MB/s = 10^6 bytes/s"},
        "backends": {},
    }
    new = make_data(b"mosafs-bench-backends/new", size)
    checkpoint = _edited(new)
    with _work_dir(keep) as workdir:
        for backend in backends:
            result["backends"][backend] = _one_backend(workdir / backend, backend,
                                                       new, checkpoint)
    _check_same_chunks(result["backends"])
    return result


def _edited(data: bytes) -> bytes:
    out = bytearray(data)
    for k in range(EDITS):
        at = (k * 2 + 1) * len(out) // (2 * EDITS)
        out[at:at + 16] = b"edited-%08d-" % k
    return bytes(out)


def _one_backend(workdir: Path, backend: str, new: bytes, checkpoint: bytes) -> dict[str, Any]:
    m = _Mosafs(workdir, ["--hash-backend", backend])
    out: dict[str, Any] = {}
    try:
        m.start()
        for name, data in (("new", new), ("checkpoint", checkpoint)):
            # The same path: the second write is the next version of the first.
            w = _timed_write(m, m.mnt / "app.n0.ckpt", data, LARGE_WRITE, reset_peak=False)
            by_process = w["cpu"]["cpu_s"]
            # The mount and its data-path workers, which do the chunking and uploads.
            cpu = (None if "mount" not in by_process else
                   sum(v for k, v in by_process.items() if k.startswith("mount")))
            if cpu is None:
                raise BenchError("the mount's CPU time could not be read")
            out[name] = {
                "cpu_s_per_gib": round(cpu * GiB / len(data), 3),
                "mount_cpu_s": cpu,
                "wall_s": w["stats_confirmed_s"],
                "oab_mb_s": w["oab_mb_s"],
                "asb_mb_s": w["asb_mb_s"],
                "chunks": w["stats"]["chunks"],
                "shared_chunks": w["stats"]["shared_chunks"],
                "new_bytes": w["stats"]["new_bytes"],
                "cpu_s_by_process": w["cpu"]["cpu_s"],
            }
            progress(f"{backend} {name}: mount {out[name]['cpu_s_per_gib']} CPU-s/GiB, "
                     f"ASB {w['asb_mb_s']:.0f} MB/s, {w['stats']['chunks']} chunks")
            gc.collect()
        out["backend_logged"] = _logged_backend(workdir)
    finally:
        m.stop()
    return out


def _logged_backend(workdir: Path) -> str | None:
    """The backend the mount says it uses (its log line "hash backend: NAME")."""
    for log in sorted(workdir.glob("**/logs/mount*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "hash backend: " in line:
                return line.rsplit("hash backend: ", 1)[1].strip()
    return None


def _check_same_chunks(results: dict[str, Any]) -> None:
    seen = {(r["new"]["chunks"], r["checkpoint"]["chunks"], r["checkpoint"]["shared_chunks"])
            for r in results.values()}
    if len(seen) > 1:
        raise BenchError(f"backends cut the same bytes differently: {results}")


def format_table(result: dict[str, Any]) -> str:
    """RESULT for people: a row per backend and checkpoint (`--json` gives every figure)."""
    size = result["params"]["size_bytes"]
    lines = [f"{result['benchmark']}: two checkpoints of {size / (1 << 20):.0f} MiB each "
             f"(new bytes, then {EDITS} small edits), 1 MiB writes", "",
             f"{'backend':<8}  {'checkpoint':<10}  {'mount CPU s/GiB':>15}  {'wall s':>7}  "
             f"{'ASB MB/s':>8}  {'chunks':>6}  {'deduped':>7}"]
    for backend, figures in result["backends"].items():
        for name in ("new", "checkpoint"):
            f = figures[name]
            lines.append(f"{backend:<8}  {name:<10}  {f['cpu_s_per_gib']:>15.3f}  "
                         f"{f['wall_s']:>7.2f}  {f['asb_mb_s']:>8.0f}  {f['chunks']:>6}  "
                         f"{f['shared_chunks']:>7}")
    for backend, reason in result.get("skipped", {}).items():
        lines.append(f"{backend:<8}  skipped: {reason}")
    if len(result["backends"]) > 1:
        lines.append("every backend made the same chunks (checked)")
    return "\n".join(lines)
