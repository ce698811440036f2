"""A local put's copy, two ways: CPU per GiB of storing 1 MiB blobs that lie in a memory
file (as a writer's local put hands them over, docs/benefactor.md "Local reads and puts").

* `read`: the benefactor's way: preadv into a buffer of its own, BLAKE3 of the buffer,
  write of the buffer into the chunk file;
* `sendfile`: the kernel copies the blob from the memory file into the chunk file
  (sendfile; copy_file_range refuses a memory file and a file of another file system,
  EXDEV), then BLAKE3 of the chunk file's pages through a map: the bytes checked are the
  bytes stored without a copy in user space.

    python benchmarks/put_from_memfd.py DIR read|sendfile [MIB] [sync]

Prints CPU-seconds per GiB (the process's user + system time) and GiB/s. Files are
written to DIR and removed 64 at a time; `sync` fsyncs each.
"""

from __future__ import annotations

import mmap
import os
import resource
import sys
import time

import blake3

MiB = 1 << 20


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _store(mode: str, src: int, offset: int, path: str, buf: memoryview, sync: bool) -> bytes:
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if mode == "read":
            os.preadv(src, [buf], offset)
            digest = blake3.blake3(buf).digest()
            view = buf
            while view:
                view = view[os.write(out, view):]
        else:
            done = 0
            while done < len(buf):
                done += os.sendfile(out, src, offset + done, len(buf) - done)
            with open(path, "rb") as f, mmap.mmap(f.fileno(), len(buf),
                                                  prot=mmap.PROT_READ) as mapped:
                digest = blake3.blake3(mapped).digest()
        if sync:
            os.fsync(out)
    finally:
        os.close(out)
    return digest


def main() -> None:
    folder, mode = sys.argv[1], sys.argv[2]
    total = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3].isdigit() else 512
    sync = "sync" in sys.argv[3:]
    if mode not in ("read", "sendfile"):
        raise SystemExit("mode: read or sendfile")
    src = os.memfd_create("blobs")
    os.write(src, os.urandom(64 * MiB))
    buf = memoryview(bytearray(MiB))
    started, cpu = time.perf_counter(), _cpu()
    for i in range(total):
        _store(mode, src, (i % 64) * MiB, f"{folder}/b{i}", buf, sync)
        if i % 64 == 63:
            for j in range(i - 63, i + 1):
                os.unlink(f"{folder}/b{j}")
    wall, cpu = time.perf_counter() - started, _cpu() - cpu
    gib = total / 1024
    print(f"{mode}{' sync' if sync else ''}: {cpu / gib:.3f} CPU-s/GiB, {gib / wall:.2f} GiB/s")


if __name__ == "__main__":
    main()
