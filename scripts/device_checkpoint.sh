#!/usr/bin/env bash
# One call on a lent GPU machine (the `run` tool) for GPU-native checkpoints (issue 20,
# docs/checkpoint.md): the tests and the benchmark.
#
#   There:  bash scripts/device_checkpoint.sh       (carry: .whl .devcarry, as
#           scripts/device_gpu_check.sh says how to make them)
#
# Steps (STEPS, default "env tests bench"):
#   env    the GPU, torch, safetensors, cupy;
#   tests  tests/gpu/test_gpu_checkpoint*.py, the GPU stream tests (the device-fed stream
#          is new), the CPU checkpoint tests -> $OUT/tests.txt;
#   quick  one 1 GiB state on the GPU, saved twice (all new, then a tenth changed) and
#          loaded, against torch.save to the local disk: a smoke of the figures;
#   bench  mosafs bench checkpoint (1 GiB on the GPU) -> $OUT/checkpoint.json.
set -u
STEPS=${STEPS:-env tests bench}
OUT=${OUT:-/tmp/mosafs-checkpoint}
mkdir -p "$OUT"
. scripts/device_env.sh

if step env; then
    echo "== env"
    nvidia-smi -L; nproc
    $PY -c "import torch, safetensors, cupy; print('torch', torch.__version__, 'safetensors', safetensors.__version__, 'cupy', cupy.__version__, 'cuda', torch.cuda.is_available())"
fi
if step tests; then
    echo "== tests"
    # shellcheck disable=SC2086
    timeout ${TESTS_LIMIT:-300} $PY -m pytest -p no:cacheprovider -rfEs --durations=10 \
        ${TESTS:-tests/gpu/test_gpu_checkpoint.py tests/gpu/test_gpu_erasure_stream.py tests/fuse/test_fuse_checkpoint.py tests/unit/test_checkpoint_format.py} \
        > "$OUT/tests.txt" 2>&1
    echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|error|^E " "$OUT/tests.txt" | tail -30
fi
if step quick; then
    echo "== quick"
    rm -rf /tmp/ckq; mkdir -p /tmp/ckq
    $PY -m mosafs up /tmp/ckq/mnt --data-dir /tmp/ckq/data --hash-backend gpu > /tmp/ckq/up.log 2>&1 &
    UP=$!
    for _ in $(seq 60); do mountpoint -q /tmp/ckq/mnt && break; sleep 1; done
    cpu() {  # CPU seconds of the cluster's processes, by role
        for pid in $(pgrep -f "mosafs (benefactor|manager|mount)"); do
            echo "$(ps -o args= -p "$pid" | grep -oE "mosafs (benefactor|manager|mount)") $(awk '{print ($14+$15)/100}' /proc/$pid/stat)"
        done | sort | awk '{a[$1" "$2]+=$3} END {for (k in a) printf "%s %.2f\n", k, a[k]}'
    }
    cpu > "$OUT/cpu-before.txt"
    SPYCMD=()
    [ -n "${SPY:-}" ] && SPYCMD=(py-spy record --format raw -r 100 ${SPY_FLAGS:---gil} -o "$OUT/quick-spy.txt" --)
    timeout 240 "${SPYCMD[@]}" $PY - <<'PYEOF' 2>&1 | tee "$OUT/quick.txt"
import os, time, torch
from mosafs import checkpoint
g = torch.Generator(device="cuda").manual_seed(0)
sd = {f"l{i}": torch.randn(4 << 20, device="cuda", generator=g) for i in range(64)}  # 64 x 16 MiB
torch.cuda.synchronize()
def local():
    t = time.perf_counter()
    with open("/tmp/ckq/local.pt", "wb") as f:
        torch.save(sd, f); f.flush(); os.fsync(f.fileno())
    return time.perf_counter() - t
for step in range(3):
    if step:
        for i in range(0, 64, 10): sd[f"l{i}"].add_(1)
    torch.cuda.synchronize()
    tl = local()
    t = time.perf_counter(); r = checkpoint.save(sd, "/tmp/ckq/mnt/model.r0.%d" % step); tb = time.perf_counter() - t
    print(f"step {step}: torch.save local {tl:.3f}s  save {tb:.3f}s ({tb/tl:.2f}x) to_host {r.bytes_to_host>>20} MiB sent {r.bytes_sent>>20} MiB phases", {k: round(v, 3) for k, v in r.phases.items()})
import mosafs.client.files.putgroups as PG, mosafs.checkpoint.device as D
for max_mib, depth, group_mib in ((8, 2, 8), (16, 2, 16), (8, 4, 8), (32, 2, 32), (8, 2, 8)):
    PG.MAX_BYTES, PG.DEPTH, D.GROUP_BYTES = max_mib << 20, depth, group_mib << 20
    step += 1
    for i in range(0, 64, 10): sd[f"l{i}"].add_(1)
    torch.cuda.synchronize()
    t = time.perf_counter(); r = checkpoint.save(sd, "/tmp/ckq/mnt/model.r0.%d" % step); tb = time.perf_counter() - t
    print(f"puts max {max_mib} MiB depth {depth} group {group_mib} MiB: save {tb:.3f}s sent {r.bytes_sent>>20} MiB phases", {k: round(v, 3) for k, v in r.phases.items()})
PG.MAX_BYTES, PG.DEPTH, D.GROUP_BYTES = 8 << 20, 2, 8 << 20
t = time.perf_counter(); h = checkpoint.save(sd, "/tmp/ckq/mnt/model.r0.99", blocking=False); tr = time.perf_counter() - t
r = h.wait(); print(f"non-blocking return {tr:.4f}s total {r.total_s:.3f}s")
from safetensors.torch import save_file, load_file
save_file(sd, "/tmp/ckq/local.safetensors")
import mosafs.checkpoint.gpuload as G
def timed(fn):
    torch.cuda.synchronize(); t = time.perf_counter(); out = fn(); torch.cuda.synchronize()
    return time.perf_counter() - t, out
for mode in ("pageable", "pinned"):  # the load buffer kept pageable, or pinned after its first load
    G.HOST_BUFFERS = G.HostBuffers()
    if mode == "pageable":
        G.HOST_BUFFERS._pin = G.HOST_BUFFERS._free.append
    for rep in range(4):
        ts, _ = timed(lambda: load_file("/tmp/ckq/local.safetensors", device="cuda"))
        fig = {}
        tm, b = timed(lambda: checkpoint.load("/tmp/ckq/mnt/model.r0.99", device="cuda", figures=fig))
        print(f"load {mode} {rep}: safetensors local {ts:.3f}s mosafs {tm:.3f}s speed ratio {ts/tm:.2f} local_bytes {fig['local_bytes']}")
        time.sleep(1.5)  # the background pinning
assert all(torch.equal(b[k], sd[k]) for k in sd)
import mosafs.client.files.localreads as R, subprocess
def drop():
    subprocess.run(["sync"]); open("/proc/sys/vm/drop_caches", "w").write("3\n")
for threads in (16, 32, 64, 16, 32, 64):  # cold loads by local-read threads
    R.THREADS = threads
    drop(); ts, _ = timed(lambda: load_file("/tmp/ckq/local.safetensors", device="cuda"))
    drop(); tm, b = timed(lambda: checkpoint.load("/tmp/ckq/mnt/model.r0.99", device="cuda"))
    print(f"cold load threads {threads}: safetensors local {ts:.3f}s mosafs {tm:.3f}s speed ratio {ts/tm:.2f}")
from mosafs.checkpoint.cluster import close_all; close_all()
PYEOF
    echo "cluster CPU seconds before / after:"; cat "$OUT/cpu-before.txt"; cpu
    [ -n "${SPY:-}" ] && $PY benchmarks/spy_top.py "$OUT/quick-spy.txt" --top 30 | tee "$OUT/quick-spy-top.txt"
    kill -INT $UP; wait $UP
fi
if step bench; then
    echo "== bench"
    START=$(date +%s)
    # shellcheck disable=SC2086
    timeout ${BENCH_LIMIT:-400} $PY -m mosafs bench checkpoint --device cuda \
        --size-mib ${SIZE_MIB:-1024} --steps ${BENCH_STEPS:-4} ${BENCH_ARGS:-} --json \
        > "$OUT/checkpoint${BENCH_TAG:-}.json" 2> "$OUT/checkpoint${BENCH_TAG:-}.err"
    echo "rc=$? in $(( $(date +%s) - START )) s"; tail -30 "$OUT/checkpoint${BENCH_TAG:-}.err"
    $PY -c "import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps(r['targets'], indent=1)); print(json.dumps(r['loads'])); [print(json.dumps({k: s.get(k) for k in ('step','kind','save_blocking_s','torch_save_local_s','torch_save_mount_s','bytes_to_host','bytes_sent','ratio_vs_local','nonblocking')})) for s in r['steps']]" "$OUT/checkpoint${BENCH_TAG:-}.json"
fi
