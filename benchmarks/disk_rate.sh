#!/bin/bash
# The disk's own write rate for 2 GiB, the bytes an all-new 1 GiB save stores with
# replicas:2 (docs/benchmarks.md, "Again at commit b59a468"): direct writes, buffered
# writes with one fdatasync, and 2,048 files of 1 MiB each written and fsynced by 4-32
# threads, as the benefactors store blobs. ROUNDS (default 2) of the dd pair.
#
#   bash benchmarks/disk_rate.sh [DIR]      (default /tmp; needs 2 GiB free there)
set -euo pipefail
dir=${1:-/tmp}
for _ in $(seq "${ROUNDS:-2}"); do
    echo "direct:    $(dd if=/dev/zero of="$dir/disk-rate.direct" bs=8M count=256 oflag=direct 2>&1 | tail -1)"
    rm -f "$dir/disk-rate.direct"
    echo "fdatasync: $(dd if=/dev/zero of="$dir/disk-rate.sync" bs=8M count=256 conv=fdatasync 2>&1 | tail -1)"
    rm -f "$dir/disk-rate.sync"
done
python3 - "$dir/disk-rate.files" <<'PY'
import os, shutil, sys, threading, time

root, blob = sys.argv[1], os.urandom(1 << 20)

def write(folder: str, count: int) -> None:
    os.makedirs(folder, exist_ok=True)
    for i in range(count):
        fd = os.open(f"{folder}/{i}", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, blob)
            os.fsync(fd)
        finally:
            os.close(fd)

for threads in (4, 8, 16, 32):
    started = time.perf_counter()
    workers = [threading.Thread(target=write, args=(f"{root}/{k}", 2048 // threads))
               for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    took = time.perf_counter() - started
    print(f"files:     {threads} threads, 2 GiB of 1 MiB files each fsynced in {took:.2f} s "
          f"({2 / took:.2f} GiB/s)")
    shutil.rmtree(root)
    os.sync()
PY
