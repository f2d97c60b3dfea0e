#!/usr/bin/env bash
# GPU suite `recheck`: `scripts/gpu.sh recheck build` here, `scripts/gpu.sh recheck run` on
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
# GPU machine, one call (under 10 minutes), from what scripts/gpu.sh recheck build put in
# .carry/recheck (carry [".carry/recheck"]): issue 14's open points measured in one session.
#  1. CUDA_IPC GPU tests: block tables and agents (every byte checked).
#  2. Flat scale sweep, 1k..128k descriptors: CUDA_IPC (VRAM, GPU 0) and NULL (nixl-core alone,
#     on this host's CPUs); per-step ns per descriptor and the make linearity.
#  3. DRAM -> DRAM sweep against native NIXL 1.5.1 (C++ API), 3 rounds interleaved per point,
#     both sides on the wheel's UCX 1.23, then notification latency.
# PART=scale runs 1 and 2 (about 6 minutes), PART=sweep runs 3 (about 9 minutes): one each per
# 10-minute call. Results in $OUT; a summary in $OUT/recheck-summary.txt.

build() (
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-shared}"
bash scripts/gpu.sh native build >/dev/null
bash scripts/gpu.sh scale build >/dev/null
# shellcheck source=scripts/gpu/pick.sh
. scripts/gpu/pick.sh
R=.carry/recheck
rm -rf "$R"; mkdir -p "$R/bin"
agent=$(cargo test --release -p nixl-mem --test gpu_agent --no-run --message-format=json 2>/dev/null | pick gpu_agent)
cp "$agent" "$R/bin/nixl-mem-gpu-agent"
strip "$R/bin/nixl-mem-gpu-agent"
cp .carry/bin/scale .carry/bin/nixl-mem-gpu-blocks .carry/nixl-bin/nixl_native .carry/nixl-bin/nixlbench "$R/bin/"
cp -a .carry/nixl312 "$R/nixl312"
du -sh "$R"
)

run() (
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/nixl-recheck-out}"; mkdir -p "$OUT"
R="$PWD/.carry/recheck"; B="$R/bin"
s="$OUT/recheck-summary.txt"; : > "$s"
say() { echo "$*" | tee -a "$s"; }
run() { local name=$1 t=$2; shift 2; say "== $name: $*"; local t0; t0=$(date +%s); timeout "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?; grep -v '^warning' "$OUT/$name.log" | tail -n 30 | tee -a "$s"; say "rc=$rc ($(( $(date +%s) - t0 )) s)"; }
say "== host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
say "== GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n1)"
say "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "${PART:-scale}" = scale ]; then
run gpu-blocks 60 "$B/nixl-mem-gpu-blocks" --nocapture
run gpu-agent 90 "$B/nixl-mem-gpu-agent"
run scale-cuda-ipc-flat 120 "$B/scale" --backend CUDA_IPC --mode flat --rounds 7
run scale-null-flat 90 "$B/scale" --backend NULL --mode flat --rounds 9
else
say "== native sweep"
t0=$(date +%s)
timeout "${SWEEP_S:-540}" python3 benches/reference/compare_native.py --nixlbench "$B/nixlbench" \
    --native "$B/nixl_native" --nixl-path "$R/nixl312" --rounds 3 --interleave point \
    --bytes-per-point "${BYTES_PER_POINT:-5e8}" --notif-iters 3000 --timeout 60 \
    --out "$OUT/native-sweep.json" > "$OUT/native-sweep.log" 2>&1
say "rc=$? ($(( $(date +%s) - t0 )) s)"
sed -n '/^load average during/,$p' "$OUT/native-sweep.log" | tee -a "$s"
fi
say "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
)

case "${1:-}" in
    build | run) "$1" ;;
    *) echo "usage: scripts/gpu.sh recheck build|run" >&2; exit 2 ;;
esac
