#!/usr/bin/env bash
# One call on the lent two-GPU machine (kind nvidia-h200-x2): `mosafs bench checkpoint
# --ranks 1,2` at this tree against an earlier commit, in the same lease, alternating old,
# new (an A/B of a change to the save or put path; docs/benchmarks.md, "The two-rank saves
# on one host, probed"). The cluster's data directory is on a tmpfs for every run.
#
#   Here:   make .abold as scripts/device_ab_env.sh says
#   There:  ROUNDS=2 bash scripts/device_ranks_ab.sh   (carry: .whl .devcarry .abold)
set -u
OUT=${OUT:-/tmp/mosafs-ranks-ab}
mkdir -p "$OUT"
. scripts/device_env.sh
. scripts/device_ab_env.sh
RAM=/tmp/mosafs-ram
mkdir -p $RAM
for round in $(seq "${ROUNDS:-2}"); do
    for side in ${SIDES:-old new}; do
        ab_side "$side"
        mount -t tmpfs -o size=96g tmpfs $RAM
        # shellcheck disable=SC2086
        TMPDIR=$RAM timeout "${RANKS_LIMIT:-200}" $PY -m mosafs bench checkpoint --ranks 1,2 \
            --device cuda --size-mib "${SIZE_MIB:-1024}" --steps 3 --changed 0.07 ${ARGS:-} \
            --json > "$OUT/r-$side-$round.json" 2> "$OUT/r-$side-$round.err"
        echo "== $side round $round: rc=$?"
        umount $RAM
        ab_home
        $PY - "$OUT/r-$side-$round.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
t = r["targets"]
print(" scaling changed", t["changed_2_ranks_over_1"]["value"],
      "all new", t["all_new_2_ranks_over_1"]["value"])
for p in r["passes"]:
    print(" ", p["ranks"], "rank(s):", p["median_GBps"], "benefactors' CPU-s",
          p["cluster_cpu_s"].get("benefactors"))
PYEOF
    done
done
