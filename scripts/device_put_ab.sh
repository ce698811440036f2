#!/usr/bin/env bash
# One call on a lent GPU machine: `mosafs bench checkpoint` at this tree against an
# earlier commit, in the same lease (an A/B of a change to the write path), after
# benchmarks/put_durability.py (PUTS=0 skips it). Runs alternate old, new, old, new.
#
#   Here:   make .abold as scripts/device_ab_env.sh says
#   There:  ROUNDS=2 BENCH_ARGS="--changed 0.07" bash scripts/device_put_ab.sh
#           (carry: .whl .devcarry .abold)
set -u
OUT=${OUT:-/tmp/mosafs-put-ab}
mkdir -p "$OUT"
. scripts/device_env.sh
. scripts/device_ab_env.sh
if [ "${PUTS:-1}" = 1 ]; then
    echo "== put_durability (new code)"
    PYTHONPATH=$AB_NEW timeout 200 $PY benchmarks/put_durability.py --stores 3 --mib 683 \
        --group 8 --dir /tmp --rounds ${PUT_ROUNDS:-2} 2>&1 | tee "$OUT/puts.txt"
fi
for round in $(seq ${ROUNDS:-1}); do
    for side in ${SIDES:-old new}; do
        ab_side "$side"
        echo "== bench $side round $round: $($PY -c 'import mosafs.benefactor.chunkstore as c; print(c.__file__)')"
        START=$(date +%s)
        # shellcheck disable=SC2086
        timeout ${BENCH_LIMIT:-250} $PY -m mosafs bench checkpoint --device cuda \
            --size-mib 1024 --steps 4 ${BENCH_ARGS:-} --json \
            > "$OUT/ck-$side-$round.json" 2> "$OUT/ck-$side-$round.err"
        echo "rc=$? in $(( $(date +%s) - START )) s"; tail -3 "$OUT/ck-$side-$round.err"
        ab_home
        $PY -c "
import json,sys
r=json.load(open(sys.argv[1]))
for s in r['steps']:
    print(s.get('step'), s.get('kind'), 'save', s.get('save_blocking_s'), 'torch local', s.get('torch_save_local_s'), 'ratio', s.get('ratio_vs_local'), 'drain', ((s.get('save') or {}).get('phases') or {}).get('drain_s'))
print(json.dumps(r['targets']))" "$OUT/ck-$side-$round.json"
    done
done
