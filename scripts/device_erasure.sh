#!/usr/bin/env bash
# Issue 19's GPU erasure coding on a lent GPU machine (the `run` tool), in few calls:
# the coders' tests, the GPU chunk stream's parity stage, and the coder benchmark with
# its end-to-end figure (chunking + BLAKE3 + parity from pinned memory over H2D).
#
#   Here, once:  the wheels in .whl (pyeclib included: it bundles ISA-L) and .devcarry, as
#                scripts/device_gpu_check.sh describes (both ignored by git).
#   There:       bash scripts/device_erasure.sh            (carry: .whl .devcarry)
#                STEPS="env stream bench" bash scripts/device_erasure.sh   (a part)
#
# Steps (results in $OUT; each has its own time limit, so one hang spares the others):
#   env      GPU, driver, Python and CuPy versions;
#   stream   pytest -m gpu tests/gpu/test_gpu_erasure_stream.py -> stream.txt;
#   bench    python -m mosafs.bench.ec_coders -> ec_coders.json, its GPU part printed;
#   vectors  pytest -m gpu tests/unit/test_erasure_vectors.py -> vectors.txt;
#   backend  pytest tests/gpu/test_gpu_backend.py (the runtime's pools) -> backend.txt;
#   erasure  pytest -v -m gpu tests/gpu/test_gpu_erasure.py (2.5 minutes on a fresh
#            machine, most of it NVRTC) -> erasure.txt;
#   mount    mosafs bench ec --parts mount,rebuild (not in the default steps: minutes)
#            -> ec_mount.json, its targets printed;
#   ecwrite  write through the mount, replicas:3 and ec:4+2 alternating (CYCLES, default 3;
#            benchmarks/profile_write.py, 11 benefactors, WRITE_MIB, default 1024): MB/s
#            and CPU seconds per GiB of every process and thread -> ecwrite-*.json; with
#            SPY=1 one more run of each under py-spy (the mount and its data-path worker)
#            -> spy-*/.
set -u
STEPS=${STEPS:-env stream bench vectors backend erasure}
OUT=${OUT:-/tmp/mosafs-erasure}
mkdir -p "$OUT"
. scripts/device_env.sh
tests() {  # name, time limit, pytest arguments...
    local name=$1 limit=$2; shift 2
    echo "== $name"
    timeout "$limit" $PY -m pytest -p no:cacheprovider "$@" > "$OUT/$name.txt" 2>&1
    echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|error" "$OUT/$name.txt" | tail -15
}

if step env; then
    echo "== env"; nvidia-smi -L; nproc
    $PY -c "import sys, cupy; print(sys.version.split()[0], 'cupy', cupy.__version__)"
    $PY -c "from mosafs.erasure.isal import load_isal; print(load_isal().description)"
fi
if step stream; then
    tests stream ${STREAM_LIMIT:-120} -q -m gpu tests/gpu/test_gpu_erasure_stream.py \
        --durations=5
fi
if step bench; then
    echo "== bench"
    START=$(date +%s)
    timeout ${BENCH_LIMIT:-120} $PY -m mosafs.bench.ec_coders > "$OUT/ec_coders.json" \
        2> "$OUT/ec_coders.err"
    echo "rc=$? in $(( $(date +%s) - START )) s"; tail -5 "$OUT/ec_coders.err"
    $PY - "$OUT/ec_coders.json" <<'PYEOF'
import json, sys
result = json.load(open(sys.argv[1]))
gpu = result["gpu"]
for shape in ("4+2", "8+2"):
    row = gpu.get(shape, {})
    print(shape, json.dumps({k: v for k, v in row.items() if "kernel" in k or k == "verified"}))
    print(shape, "isal", json.dumps(result["isal"][shape]))
print("end_to_end", json.dumps(gpu.get("end_to_end"), indent=1))
PYEOF
fi
if step vectors; then
    tests vectors ${VECTORS_LIMIT:-90} -q -m gpu tests/unit/test_erasure_vectors.py
fi
if step backend; then
    tests backend ${BACKEND_LIMIT:-90} -q tests/gpu/test_gpu_backend.py
fi
if step erasure; then  # last, verbose: a run cut by its limit still shows every result
    tests erasure ${ERASURE_LIMIT:-200} -v -m gpu tests/gpu/test_gpu_erasure.py
    echo "passed $(grep -c ' PASSED' "$OUT/erasure.txt"), failed $(grep -c ' FAILED' "$OUT/erasure.txt")"
fi
if step mount; then  # through a mount: needs FUSE (.devcarry/debs, as device_datapath.sh)
    echo "== mount"
    START=$(date +%s)
    timeout ${MOUNT_LIMIT:-420} $PY -m mosafs bench ec --parts ${MOUNT_PARTS:-mount,rebuild} \
        --size-mib ${MOUNT_MIB:-1024} --json > "$OUT/ec_mount.json" 2> "$OUT/ec_mount.err"
    echo "rc=$? in $(( $(date +%s) - START )) s"; tail -8 "$OUT/ec_mount.err"
    $PY -c "import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps(r.get('targets'), indent=1)); print(json.dumps(r.get('rebuild'))[:1500])" "$OUT/ec_mount.json"
fi
if step ecwrite; then  # does ec:4+2 write at least as fast as replicas:3? (issue 19)
    echo "== ecwrite"; export MOSAFS_HASH_BACKEND=gpu
    for cycle in $(seq 1 ${CYCLES:-3}); do for layout in replicas:3 ec:4+2; do
        name=ecwrite-${layout//[:+]/-}-$cycle
        timeout 150 $PY benchmarks/profile_write.py --size-mib ${WRITE_MIB:-1024} \
            --up-arg=--benefactors=11 --up-arg=--redundancy=$layout \
            > "$OUT/$name.json" 2> "$OUT/$name.err"
        echo "$name rc=$? $(grep -o '"write_mb_s": [0-9.]*' "$OUT/$name.json")"
        $PY -c "import json,sys; r=json.load(open(sys.argv[1])); print(r.get('benefactor_puts'), {k: v['total'] for k, v in r['write_cpu_s_per_gib'].items() if '/' not in k and v['total'] > 0.1})" "$OUT/$name.json"
    done; done
    if [ -n "${SPY:-}" ]; then for layout in replicas:3 ec:4+2; do
        spy=$OUT/spy-${layout//[:+]/-}
        mkdir -p "$spy"
        timeout 150 $PY benchmarks/profile_write.py --size-mib ${WRITE_MIB:-1024} \
            --up-arg=--benefactors=11 --up-arg=--redundancy=$layout \
            --py-spy "$spy" > "$spy.json" 2>&1
        echo "spy $layout rc=$?"
        $PY benchmarks/spy_top.py --top ${SPY_TOP:-30} "$spy"/*.txt | tee "$spy.top.txt" \
            | grep -A ${SPY_SHOW:-0} "mount-worker-0.txt"
        rm -rf "$spy"  # raw stacks: too many and too big to bring back
    done; fi
fi
