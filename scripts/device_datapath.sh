#!/usr/bin/env bash
# The data path on a lent GPU machine (the `run` tool): issue 17's figures in few calls.
#
#   Here, once:  the wheels in .whl and the FUSE packages in .devcarry/debs, as
#                scripts/device_gpu_check.sh describes (both ignored by git).
#   There:       STEPS="profile backends" bash scripts/device_datapath.sh   (carry: .whl
#                .devcarry), then STEPS=write, then STEPS=torch: each call stays under the
#                tool's 10 minutes.
#
# Steps (results in $OUT):
#   env       GPU, CPUs, versions;
#   tests     tests/gpu and the data-path worker tests -> tests.txt;
#   profile   benchmarks/profile_write.py, GPU backend: CPU seconds per GiB of every
#             process (the mount's data-path workers apart), write and cold read of 2 GiB,
#             with the data-path workers off (0) and on (auto), and 8 writers at once
#             -> profile-w0.json, profile-auto.json, profile-8writers.json;
#   backends  mosafs bench backends --backends gpu: the mount's CPU per GiB (workers
#             included) for new and for deduplicated data -> backends.json;
#   write     mosafs bench write (null file system vs mosafs: 1 MiB, 4 KiB, cold read,
#             8 writers) -> write.json;
#   torch     benchmarks/torch_checkpoint.py on the GPU: 1 GiB state dict, 90 % unchanged
#             per step, torch.save to the mount vs the local disk -> torch.json;
#   grpc      benchmarks/grpc_put.py, every mode, plaintext and TLS, three runs each: the
#             benefactor's floor, step by step (transport, framing, BLAKE3, the store)
#             -> grpc.jsonl;
#   tokens    benchmarks/token_cost.py: write and read through the mount with chunk access
#             tokens on and off, five cycles each, alternating -> tokens.json.
set -u
STEPS=${STEPS:-env profile backends}
OUT=${OUT:-/tmp/mosafs-datapath}
mkdir -p "$OUT"
. scripts/device_env.sh
export MOSAFS_HASH_BACKEND=gpu
run() {  # name, time limit, command...
    local name=$1 limit=$2; shift 2
    echo "== $name"
    timeout "$limit" "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
    echo "rc=$?"; tail -c 2500 "$OUT/$name.json"; echo; tail -5 "$OUT/$name.err"
}

if step env; then
    echo "== env"; nproc; nvidia-smi -L
    $PY -c "import sys, cupy, numba, torch; print(sys.version.split()[0], 'cupy', cupy.__version__, 'numba', numba.__version__, 'torch', torch.__version__)"
fi
if step grpc; then  # the transport and store floor under a benefactor's put
    echo "== grpc"
    for rep in 1 2 3; do for mode in none wire wire-hash store; do for tls in "" --tls; do
        timeout 120 $PY benchmarks/grpc_put.py $tls $mode >> "$OUT/grpc.jsonl" 2>> "$OUT/grpc.err"
    done; done; done
    cat "$OUT/grpc.jsonl"; tail -5 "$OUT/grpc.err"
fi
if step tests; then  # the GPU tests, the bounded pinned pool and GPU workers included
    echo "== tests"
    timeout ${TESTS_LIMIT:-400} $PY -m pytest -q -p no:cacheprovider \
        ${TESTS:-tests/gpu tests/cluster/test_cluster_datapath_workers.py} > "$OUT/tests.txt" 2>&1
    echo "rc=$?"; tail -15 "$OUT/tests.txt"
fi
if step profile; then
    [ -n "${SKIP_W0:-}" ] || MOSAFS_DATAPATH_WORKERS=0 run profile-w0 120 \
        $PY benchmarks/profile_write.py --read --size-mib 2048
    run profile-auto 120 $PY benchmarks/profile_write.py --read --size-mib 2048
    run profile-8writers 150 $PY benchmarks/profile_write.py --read --size-mib 4096 --writers 8
fi
if step spy; then  # where a data-path worker's time goes (py-spy --native, raw stacks)
    mkdir -p "$OUT/spy"
    run profile-spy 150 $PY benchmarks/profile_write.py --size-mib 2048 --py-spy "$OUT/spy"
    ls -la "$OUT/spy"
fi
if step backends; then
    run backends 150 $PY -m mosafs bench backends --backends gpu --size-mib 2048 --json
fi
if step write; then
    run write 560 $PY -m mosafs bench write --json --peer none --writers 8
fi
if step tokens; then  # chunk access tokens on and off, alternating: their cost
    run tokens 560 $PY benchmarks/token_cost.py --size-mib 1536 --cycles 5
fi
if step torch; then
    run torch 540 $PY benchmarks/torch_checkpoint.py --size-mib 1024 --steps 5 --device cuda
fi
