#!/bin/bash
# The idle CPU of a cluster: a fresh `mosafs up $UP_ARGS` (default --managers 2) from the
# repository root, SETTLE seconds (15) to settle, then SPAN seconds (20) of /proc: each
# process's CPU in ms per second of wall time, and the total.
#
#   bash benchmarks/idle_cpu.sh                        (two managers and etcd)
#   UP_ARGS="" bash benchmarks/idle_cpu.sh             (one manager)
#   bash benchmarks/idle_cpu.sh PYTHONPATH=/tmp/old    (older code from a worktree, as
#                                                       benchmarks/create_ab.sh says)
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/cluster.sh
start_cluster idle-cpu "${UP_ARGS---managers 2}" "$@"
sleep "${SETTLE:-15}"
pids=$(pgrep -f "$d/data")
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
declare -A before
for p in $pids; do before[$p]=$(ticks "$p"); done
span=${SPAN:-20}
sleep "$span"
tick_ms=$((1000 / $(getconf CLK_TCK)))
for p in $pids; do
    role=$(tr '\0' ' ' < "/proc/$p/cmdline" | grep -oE "mosafs (up|manager|benefactor|mount)|etcd" | head -1)
    echo "$role $(( ($(ticks "$p") - before[$p]) * tick_ms ))"
done | awk -v span="$span" '{ms = $NF / span; t += ms; $NF = ""; printf "%6.1f ms/s %s\n", ms, $0}
                            END {printf "%6.1f ms/s total\n", t}'
