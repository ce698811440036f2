#!/usr/bin/env bash
# One call on a lent GPU machine (the `run` tool): checks and times the GPU backend.
#
#   Here, once:  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#                  --implementation cp --platform manylinux2014_x86_64 -d .whl blake3==1.0.11 \
#                  trio outcome sniffio sortedcontainers lmdb cachetools platformdirs grpcio protobuf \
#                  humanfriendly tqdm
#                (pinned to the versions of .venv), a pyfuse3 wheel built with Python 3.12
#                (`python3.12 -m pip wheel --no-deps -w .whl pyfuse3`), the FUSE library and
#                tools as Debian packages (`cd .devcarry/debs && apt-get download libfuse3-3
#                fuse3`) for the mount tests (both folders ignored by git: .whl in
#                .gitignore, .devcarry in .git/info/exclude); the test vectors travel with
#                the repository (tests/vectors/)
#   There:       bash scripts/device_gpu_check.sh        (carry: .whl .devcarry)
#
# Steps, each with its own time limit so that one hang does not cost the others:
#   1. environment (GPU, driver, PCIe link, package versions);
#   2. smoke: GPU == CPU on 64 MiB, with every Python warning shown;
#   3. the benchmark (benchmarks/hash_gpu.py --backend all --json) -> $OUT/hash.json;
#   4. candidate-kernel strip sizes (compile-time variants) -> $OUT/variants.json;
#   5. pytest tests/gpu (a --hash-backend gpu mount included), tests/unit/test_chunking.py
#      (the unit tests run every backend that is available, so the GPU one too) and
#      tests/unit/test_bench_hash.py -> $OUT/pytest.log, $OUT/junit.xml;
#   6. mosafs bench backends --backends cpu,gpu (the mount's CPU per GiB) -> $OUT/backends.json.
#
# STEPS (default "env smoke bench variants tests") picks steps; BENCH_BACKEND (default all)
# is passed to the benchmark's --backend; TESTS (default "tests/gpu
# tests/unit/test_chunking.py") the test paths.
set -u
STEPS=${STEPS:-env smoke bench variants tests backends}
BENCH_BACKEND=${BENCH_BACKEND:-all}
TESTS=${TESTS:-tests/gpu tests/unit/test_chunking.py tests/unit/test_bench_hash.py}
OUT=${OUT:-/tmp/mosafs-gpu-check}
mkdir -p "$OUT"
. scripts/device_env.sh

if step env; then
echo "== 1. environment"
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.max.sm \
    --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
[ "$(nvidia-smi -L | wc -l)" -gt 1 ] && nvidia-smi topo -m 2>&1 | tee -a "$OUT/nvidia-smi.txt"
$PY -c "import sys, cupy, numpy, numba, blake3; print(sys.version.split()[0], 'cupy', cupy.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__, 'blake3', blake3.__version__)"
nproc
fi

if step smoke; then
echo "== 2. smoke"
timeout 120 $PY -W always - <<'EOF' 2>&1 | tee "$OUT/smoke.log"
import time, numpy as np
from mosafs.chunking import make_chunker, make_hasher, available_backends
from mosafs.chunking.gpu import gpu_unavailable_reason
t = time.time(); print("gpu reason:", gpu_unavailable_reason(), "backends:", available_backends(), round(time.time() - t, 2), "s")
data = np.random.default_rng(3).integers(0, 256, 64 << 20, dtype=np.uint8).tobytes()
for spec in ("cdc:262144:1048576:4194304", "cdc:4096:16384:65536", "fixed:1048576", "cdc:1:256:1024"):
    t = time.time(); g = make_chunker(spec, "gpu").chunk_all(data); tg = time.time() - t
    t = time.time(); c = make_chunker(spec, "cpu").chunk_all(data); tc = time.time() - t
    same = [(x.offset, x.length, x.id) for x in g] == [(x.offset, x.length, x.id) for x in c]
    print(f"{spec}: chunks {len(g)} gpu==cpu {same} gpu {tg:.2f}s cpu {tc:.2f}s")
print("hash_many ok:", make_hasher("gpu").hash_many([b"", b"a", data[:1025]]) == make_hasher("cpu").hash_many([b"", b"a", data[:1025]]))
EOF
fi

if step bench; then
echo "== 3. benchmark"
timeout 240 $PY benchmarks/hash_gpu.py --backend "$BENCH_BACKEND" --json > "$OUT/hash.json" 2> "$OUT/hash.err"
echo "rc=$?"; cat "$OUT/hash.json"; tail -20 "$OUT/hash.err"
fi

if step variants; then
echo "== 4. candidate kernel strip sizes; kernels alone for other specs"
timeout 90 $PY - <<'EOF' 2>&1 | tee "$OUT/variants.log"
import json, numpy as np, cupy
from mosafs.chunking.gpu_kernels import SOURCE, GEAR_BLOCK, GEAR_BLOCKS_PER_SM
from mosafs.chunking.gear import GEAR
from mosafs.chunking import parse_spec, gpu_runtime
spec = parse_spec("cdc:262144:1048576:4194304")
sms = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
n = 1 << 30
buf = cupy.asarray(np.random.default_rng(5).integers(0, 256, n + 512, dtype=np.uint8))
base = int(buf.data.ptr) + 256
gear = cupy.asarray(GEAR)
out = cupy.zeros(1 + (1 << 20), dtype=cupy.uint32)
res = {}
for strip in (512, 1024, 2048, 4096):
    k = cupy.RawModule(code=SOURCE, options=("-std=c++17", f"-DGEAR_STRIP={strip}")).get_function("gear_candidates")
    grid = min(-(-(-(-(n - 256) // strip)) // GEAR_BLOCK), sms * GEAR_BLOCKS_PER_SM)
    times = []
    for rep in range(6):
        out[0] = 0
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record()
        k((grid,), (GEAR_BLOCK,), (np.uint64(base), np.int64(n - 256), np.int64(0), np.int32(0), np.int64(0), gear,
                                   np.uint32(spec.mask_l >> 32), np.uint32(spec.mask_s >> 32), np.uint64(int(out.data.ptr) + 4),
                                   np.uint32(1 << 20), np.uint64(int(out.data.ptr))))
        b.record(); b.synchronize()
        times.append(cupy.cuda.get_elapsed_time(a, b) / 1e3)
    res[strip] = {"GBps": round(n / float(np.median(times[1:])) / 1e9, 1), "candidates": int(out[0])}
print(json.dumps({"gear_candidates_1GiB_by_strip": res}))
del buf
for text in ("cdc:4096:16384:65536", "fixed:1048576", "cdc:262144:1048576:4194304"):
    r = gpu_runtime.bench_kernels(parse_spec(text), 1 << 30, 4)
    print(json.dumps({"kernels_alone": text, "GBps": r["GBps"], "chunks": r["chunks"],
                      "ids_checked": r["ids_checked"]}))
EOF
fi

if step tests; then
echo "== 5. tests"
# shellcheck disable=SC2086
timeout 330 $PY -m pytest -v -p no:cacheprovider -rfEs --durations=15 --junitxml="$OUT/junit.xml" \
    $TESTS > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"
grep -E "(passed|failed|error).* in " "$OUT/pytest.log" | tail -3
sed -n '/slowest/,$p' "$OUT/pytest.log" | head -60
fi

if step backends; then
echo "== 6. the mount's CPU per GiB by hash backend"
timeout 240 $PY -m mosafs bench backends --backends cpu,gpu --size-mib 2048 --json \
    > "$OUT/backends.json" 2> "$OUT/backends.err"
echo "rc=$?"; cat "$OUT/backends.json"; tail -8 "$OUT/backends.err"
fi
