#!/bin/bash
# One side of an A/B of the create path: a fresh `mosafs up` (run from the repository
# root, or from $SRC), 300 warm-up creates per process, then three rounds of
# benchmarks/create_loop.py with 8 processes (PROCS), each printed with the mount's and the
# manager's CPU per create (/proc). Alternate the sides yourself; compare the old code by
# putting a worktree of it first on PYTHONPATH (the daemons run with -P, so they import
# from there):
#
#   git worktree add /tmp/old OLD_COMMIT
#   for i in 1 2; do bash benchmarks/create_ab.sh old PYTHONPATH=/tmp/old
#                    bash benchmarks/create_ab.sh new; done
#
# FILES (default 2000) files per process and round; PROCS (default 8) processes; SHARED=shared:
# all in one directory;
# UP_ARGS: more arguments of `mosafs up` (--managers 2: a standby; the active manager's
# CPU is counted).
set -euo pipefail
label=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cluster.sh"
cd "${SRC:-$here/..}"
start_cluster create-ab "${UP_ARGS:-}" "$@"
files=${FILES:-2000}
python3 benchmarks/create_loop.py "$d/mnt/warm" 300 8 > /dev/null
mount_pid=$(pgrep -f "mosafs mount.*$d")
manager_pid=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['pid'])" \
    "$d/data/run/manager.ready.json")
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for round in 1 2 3; do
    m0=$(cpu "$mount_pid"); g0=$(cpu "$manager_pid")
    out=$(python3 benchmarks/create_loop.py "$d/mnt/r$round" "$files" ${PROCS:-8} ${SHARED:-})
    m1=$(cpu "$mount_pid"); g1=$(cpu "$manager_pid")
    tick_us=$((1000000 / $(getconf CLK_TCK)))
    echo "$label $out mount_us=$(( (m1 - m0) * tick_us / (${PROCS:-8} * files) ))" \
         "manager_us=$(( (g1 - g0) * tick_us / (${PROCS:-8} * files) ))"
done
