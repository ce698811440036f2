# Sourced by the benchmark scripts (create_ab.sh, idle_cpu.sh): a fresh `mosafs up` in a
# temporary directory, run from the current directory (a repository root with .venv),
# stopped and removed when the script exits.
#
#   start_cluster PREFIX "UP ARGS" [NAME=VALUE ...]   (the pairs: the cluster's environment)
#
# Sets $d (the temporary directory: $d/mnt the mount, $d/data, $d/logs, $d/up.out) and $up.
start_cluster() {
    local prefix=$1 up_args=$2
    shift 2
    d=$(mktemp -d "/tmp/$prefix.XXXXXX")
    mkdir -p "$d/mnt"
    # shellcheck disable=SC2086  # up_args: several words
    env "$@" setsid .venv/bin/python -m mosafs up $up_args --data-dir "$d/data" \
        --log-dir "$d/logs" "$d/mnt" > "$d/up.out" 2>&1 &
    up=$!
    trap 'kill -TERM $up 2>/dev/null; wait $up 2>/dev/null; rm -rf "$d"' EXIT
    for _ in $(seq 60); do mountpoint -q "$d/mnt" && break; sleep 0.5; done
    mountpoint -q "$d/mnt" || { echo "no mount: $(tail -3 "$d/up.out")" >&2; exit 1; }
}
