#!/usr/bin/env bash
# Issue 23 on a lent machine of two GPUs (kind nvidia-h200-x2, the `run` tool), in two
# calls made back to back (the machine stays warm between them):
#
#   STEPS="env ec ranks" bash scripts/device_two_gpu.sh     (carry: .whl .devcarry)
#   STEPS=tests bash scripts/device_two_gpu.sh               (carry: .whl .devcarry)
#
# .whl and .devcarry are made here as scripts/device_gpu_check.sh says (Python 3.12
# wheels of our dependencies, pyfuse3 built with 3.12, the FUSE packages).
#
# Steps (results in $OUT; each has its own time limit, so one hang spares the others):
#   env    the GPUs and how they are linked (nvidia-smi topo -m), torch, CuPy;
#   ec     mosafs bench ec --parts devices: chunking + BLAKE3 + ec:4+2 parity end to end
#          from pinned memory, one GPU against both, per arrangement (a process per GPU,
#          a thread per GPU, one stream over both) -> ec_devices.json;
#   ranks  mosafs bench checkpoint --ranks 1,2 --device cuda: 1 GiB per rank, each rank a
#          process on its own GPU, --changed 0.07 (90 % of the chunks unchanged) ->
#          ranks.json. The cluster's data directory is on a tmpfs (RANKS_TMPFS=0: on the
#          disk): the host's one disk holds every benefactor, where a cluster gives each
#          its own, and the figure is the save path's, not that disk's;
#   disk   the same ranks run with the data on the local disk -> ranks-disk.json;
#   tests  pytest tests/gpu with both GPUs visible (the runtime drives every one) ->
#          tests.txt.
set -u
STEPS=${STEPS:-env ec ranks}
OUT=${OUT:-/tmp/mosafs-two-gpu}
mkdir -p "$OUT"
. scripts/device_env.sh

summary() {  # file, python expression over r (the JSON)
    $PY -c "import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps($2, indent=1))" "$1"
}

if step env; then
    echo "== env"; date -u
    nvidia-smi --query-gpu=index,name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current \
        --format=csv 2>&1 | tee "$OUT/env.txt"
    nvidia-smi topo -m 2>&1 | tee -a "$OUT/env.txt"
    nproc | tee -a "$OUT/env.txt"
    $PY -c "import torch, cupy; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'cupy', cupy.__version__, 'cupy gpus', cupy.cuda.runtime.getDeviceCount())" 2>&1 | tee -a "$OUT/env.txt"
    git log -1 --format='commit %h %s' 2>/dev/null | cut -c1-100
fi

if step ec; then
    echo "== ec devices"
    START=$(date +%s)
    timeout ${EC_LIMIT:-240} $PY -m mosafs bench ec --parts devices --json \
        > "$OUT/ec_devices.json" 2> "$OUT/ec_devices.err"
    echo "rc=$? in $(( $(date +%s) - START )) s"; tail -5 "$OUT/ec_devices.err"
    summary "$OUT/ec_devices.json" "{'devices': r['devices'], 'target': r['targets']}"
fi

ranks() {  # tag, work directory parent
    START=$(date +%s)
    TMPDIR=$2 timeout ${RANKS_LIMIT:-330} $PY -m mosafs bench checkpoint --ranks 1,2 \
        --device cuda --size-mib ${SIZE_MIB:-1024} --steps ${RANK_STEPS:-3} \
        --changed ${CHANGED:-0.07} ${RANKS_ARGS:-} --json \
        > "$OUT/ranks$1.json" 2> "$OUT/ranks$1.err"
    echo "rc=$? in $(( $(date +%s) - START )) s"; tail -6 "$OUT/ranks$1.err"
    summary "$OUT/ranks$1.json" "{'targets': r['targets'], 'passes': [{'ranks': p['ranks'], 'gpus': p['gpus_of_ranks'], 'median_GBps': p['median_GBps'], 'cpu': p['cluster_cpu_s'], 'steps': [(s['step'], s['kind'], s['wall_s'], s['rank_s'], s['GBps'], s['unchanged_chunks']) for s in p['steps']], 'phases_last_changed': [s['phases'] for s in p['steps'] if s['kind'] == 'changed'][-1:], 'phases_last_all_new': [s['phases'] for s in p['steps'] if s['kind'] == 'all_new'][-1:]} for p in r['passes']]}"
}

if step ranks; then
    echo "== checkpoint ranks"
    RAM=/tmp/mosafs-ram
    mkdir -p $RAM
    where=/tmp
    if [ "${RANKS_TMPFS:-1}" = 1 ] && mount -t tmpfs -o size=96g tmpfs $RAM; then
        where=$RAM
    fi
    echo "work directory under $where ($(df -h --output=fstype,size $where | tail -1))"
    ranks "${RANKS_TAG:-}" $where
    mountpoint -q $RAM && umount $RAM
fi

if step disk; then
    echo "== checkpoint ranks, data on the disk"
    echo "$(df -h --output=source,fstype,size /tmp | tail -1)"
    ranks -disk /tmp
fi

if step tests; then
    echo "== tests (GPUs visible: $(nvidia-smi -L | wc -l))"
    # shellcheck disable=SC2086
    timeout ${TESTS_LIMIT:-540} $PY -m pytest -v -p no:cacheprovider -rfEs --durations=10 \
        ${TESTS:-tests/gpu} > "$OUT/tests.txt" 2>&1
    echo "rc=$?"
    grep -E "^(FAILED|ERROR)|passed|failed|error" "$OUT/tests.txt" | tail -25
    echo "passed $(grep -c ' PASSED' "$OUT/tests.txt"), failed $(grep -c ' FAILED' "$OUT/tests.txt"), skipped $(grep -c ' SKIPPED' "$OUT/tests.txt")"
fi
