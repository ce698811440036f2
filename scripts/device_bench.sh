#!/usr/bin/env bash
# One call on a lent GPU machine (the `run` tool): the storage benchmarks with CA-GPU.
#
#   Here, once:  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#                  --implementation cp --platform manylinux_2_28_x86_64 \
#                  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#                  blake3 trio outcome sniffio sortedcontainers attrs idna lmdb cachetools \
#                  platformdirs grpcio protobuf humanfriendly tqdm   (versions of .venv)
#   There:       bash scripts/device_bench.sh        (carry: .whl; the test vectors travel
#                with the repository, tests/vectors/)
#
# Emulated links: network namespaces where the machine lets us make them (root, iproute2),
# else the benefactors' ingest limit (the JSON says which); the series also on loopback.
# Results and figures -> $OUT.
set -u
OUT=${OUT:-/tmp/mosafs-bench}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
if [ -d .whl ]; then  # ours shadow the machine's (the generated code needs this protobuf)
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
PLOT=(--plot "$OUT")
$PY -c "import matplotlib" 2>/dev/null || PLOT=()
{
echo "== environment"; nproc; nvidia-smi -L; $PY --version
$PY -c "import numpy, numba, cupy, grpc, trio, blake3; print('numpy', numpy.__version__, 'numba', numba.__version__, 'cupy', cupy.__version__, 'grpc', grpc.__version__)"
LINKS=ratelimit
if command -v ip >/dev/null && command -v tc >/dev/null && ip netns add mbench-probe 2>&1; then
    ip netns del mbench-probe && LINKS=netns
fi
echo "links: $LINKS"
} 2>&1 | tee "$OUT/run.log"
LINKS=$(grep '^links:' "$OUT/run.log" | cut -d' ' -f2)
CONFIGS="non-CA fixed 1024K,CA-CPU cdc 1024K,CA-GPU cdc 1024K,CA-oracle cdc 1024K"
run() {  # output name, time limit, links, benchmark and its args...
    local out=$1 limit=$2 links=$3; shift 3
    echo "== $out" | tee -a "$OUT/run.log"
    timeout "$limit" $PY -m mosafs bench "$@" --links "$links" --json > "$OUT/$out.json" \
        2>> "$OUT/run.log"
    echo "exit $?" | tee -a "$OUT/run.log"
}
step() { case " ${STEPS:-series loopback stripe clients tests} " in *" $1 "*) return 0;; *) return 1;; esac; }
step series && run series 170 "$LINKS" series --configs "$CONFIGS" "${PLOT[@]}"
step loopback && run series-loopback 100 none series --configs "$CONFIGS"
step stripe && run stripe 110 "$LINKS" stripe "${PLOT[@]}"
step clients && run clients 80 "$LINKS" clients "${PLOT[@]}"
if step tests; then
    echo "== pytest tests/gpu/test_gpu_bench.py" | tee -a "$OUT/run.log"
    timeout 90 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_bench.py 2>&1 \
        | tail -15 | tee -a "$OUT/run.log"
fi
