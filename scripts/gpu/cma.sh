#!/usr/bin/env bash
# GPU suite `cma`: `scripts/gpu.sh cma build` here, `scripts/gpu.sh cma run` on
# the GPU machine.
#
# build:
# Prepares HERE one GPU-machine call that re-measures issue 14's open points in one session
# (scripts/gpu.sh recheck run): the flat scale sweep through CUDA_IPC and NULL (make linearity),
# the CUDA_IPC GPU tests (block tables, agents: copies checked byte for byte), and the DRAM sweep
# against native NIXL. Everything goes to .carry/recheck/ (under the 64 MiB a call carries):
# the slim nixl-cu13 wheel (its libnixl.so and UCX 1.23 serve both sides of the sweep), the
# native reference, nixlbench, the scale bench and the two GPU test binaries.
# Carry: [".carry/recheck"].
# run:
# GPU machine, one short call (about 4 minutes), from what scripts/gpu.sh recheck build put in
# .carry/recheck (carry [".carry/recheck"]):
#  1. the CUDA_IPC GPU tests (block tables, agents: copies checked byte for byte);
#  2. the Llama-3-70B block table through CUDA_IPC (fresh requests vs reposts);
#  3. the DRAM -> DRAM sweep against native NIXL 1.5.1 (C++ API) on this host's CPUs, both on
#     the wheel's UCX 1.23: nixl-rs as it ships (direct CMA, its copy threads) and with every
#     copy inside post on the calling thread (`t0`), whole sweeps interleaved per round
#     (--interleave sweep), 3 rounds; then notification latency.
# PART=sweep runs only the sweep: INTERLEAVE=point (each point runs native and nixl-rs back to
# back in fresh processes, steadier than whole sweeps) or sweep, ROUNDS, VARIANT (e.g.
# 't0:--cma-threads 0'), NOTIF_ROUNDS.
# Results in $OUT; a summary in $OUT/cma-summary.txt.

build() (
set -euo pipefail
cd "$(dirname "$0")/../.."
# The recheck suite's binaries (.carry/recheck): its build is this one.
bash scripts/gpu.sh recheck build
)

run() (
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/nixl-cma-out}"; mkdir -p "$OUT"
R="$PWD/.carry/recheck"; B="$R/bin"
s="$OUT/cma-summary.txt"; : > "$s"
say() { echo "$*" | tee -a "$s"; }
run() { local name=$1 t=$2; shift 2; say "== $name: $*"; local t0; t0=$(date +%s); timeout "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?; grep -v '^warning' "$OUT/$name.log" | tail -n "${TAIL:-12}" | tee -a "$s"; say "rc=$rc ($(( $(date +%s) - t0 )) s)"; }
say "== host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
say "== GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n1)"
say "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "${PART:-all}" = sweep ]; then
TAIL=48 run native-sweep-${INTERLEAVE:-point} "${SWEEP_S:-400}" python3 benches/reference/compare_native.py \
    --nixlbench "$B/nixlbench" --native "$B/nixl_native" --nixl-path "$R/nixl312" --rounds "${ROUNDS:-3}" \
    --interleave "${INTERLEAVE:-point}" --bytes-per-point "${BYTES_PER_POINT:-1e8}" --notif-iters 2000 \
    --notif-rounds "${NOTIF_ROUNDS:-3}" --timeout 50 ${VARIANT:+--variant "$VARIANT"} \
    --out "$OUT/native-sweep-${INTERLEAVE:-point}.json"
say "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit 0
fi
TAIL=4 run gpu-blocks 40 "$B/nixl-mem-gpu-blocks"
TAIL=4 run gpu-agent 60 "$B/nixl-mem-gpu-agent"
TAIL=8 run scale-cuda-ipc-kv-70b 60 "$B/scale" --backend CUDA_IPC --mode kv --model llama3-70b --iters 11
TAIL=40 run native-sweep "${SWEEP_S:-170}" python3 benches/reference/compare_native.py \
    --nixlbench "$B/nixlbench" --native "$B/nixl_native" --nixl-path "$R/nixl312" --rounds 3 \
    --interleave sweep --bytes-per-point "${BYTES_PER_POINT:-2e8}" --notif-iters 2000 --timeout 50 \
    --variant "t0:--cma-threads 0" --out "$OUT/native-sweep.json"
say "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
)

case "${1:-}" in
    build | run) "$1" ;;
    *) echo "usage: scripts/gpu.sh cma build|run" >&2; exit 2 ;;
esac
