#!/usr/bin/env bash
# GPU suite `two-gpu-issue18`: `scripts/gpu.sh two-gpu-issue18 build` here, `scripts/gpu.sh two-gpu-issue18 run` on
# the GPU machine.
#
# build:
# Builds HERE what scripts/gpu.sh two-gpu-issue18 run runs on a two-GPU machine, into .carry/bin
# (stripped release binaries: gpu_bench, disagg_kv, nixlbench) and .carry/ucx (UCX from the
# libucx-cu13 wheel, via scripts/gpu.sh all build's copy). Carry [".carry/bin", ".carry/ucx",
# ".carry/libucx_cu13.libs"].
# run:
# Issue 18 on a two-GPU machine (kind nvidia-h200-x2), one call (under 10 minutes), from the
# binaries scripts/gpu.sh all build and scripts/gpu.sh scale build put in .carry/bin (gpu_bench,
# disagg_kv, nixlbench) and the UCX in .carry/ucx (+ .carry/libucx_cu13.libs):
#   0. the topology (nvidia-smi topo -m);
#   1. the limit: GPU0 <-> GPU1 peer copies and pinned host <-> each GPU (two_gpu_limit.py);
#   2. nixl-rs CUDA_IPC between two processes, prefill on GPU 0 and decode on GPU 1:
#      gpu_bench --target-gpu 1 (1 MiB and 4 MiB x 1024, merged and per-block, WRITE and READ,
#      every byte verified), then the main job disagg_kv --device cuda --gpus 0,1 both ways;
#   3. nixl-rs over UCX (cuda_ipc) GPU 0 -> GPU 1: nixlbench --target-gpu 1, WRITE and READ.
# On a one-GPU machine it runs what it can (0, 1's host rows) and says what it skipped.
# Results and logs in $OUT; a summary in $OUT/two-gpu-summary.txt.
# shellcheck source=scripts/gpu/pick.sh
. "$(dirname "$0")/pick.sh"

build() (
set -euo pipefail
release_env /work/target-gpu
BIN=.carry/bin
cp "$(cargo build --release -p nixl-bench --bin gpu_bench --message-format=json 2>/dev/null | pick gpu_bench)" "$BIN/gpu_bench"
cp "$(cargo build --release --all-features --example disagg_kv --message-format=json 2>/dev/null | pick disagg_kv)" "$BIN/disagg_kv"
cp "$(cargo build --release -p nixl-bench --bench nixlbench --message-format=json 2>/dev/null | pick nixlbench)" "$BIN/nixlbench"
[ -f .carry/ucx/lib/libucp.so.0 ] || echo "no .carry/ucx: run scripts/gpu.sh all build once for the UCX libraries" >&2
du -sh "$BIN"/gpu_bench "$BIN"/disagg_kv "$BIN"/nixlbench
)

run() (
set -uo pipefail
start_summary two-gpu /tmp/nixl-two-gpu-out
B=.carry/bin
if [ -d .carry/ucx ]; then
    export NIXL_UCX_HOME="$PWD/.carry/ucx"
    export LD_LIBRARY_PATH="$PWD/.carry/ucx/lib:$PWD/.carry/libucx_cu13.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
run() {
    local name=$1 t=$2; shift 2
    if [ ! -x "$1" ] && [ "$1" != python3 ]; then say "== $name: $1 missing (not built), skipped"; return; fi
    say "== $name: $*"
    timeout "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
    grep -v '^warning' "$OUT/$name.log" | tail -n 30 | tee -a "$s"; say "rc=$rc"
}
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
say "== GPUs: $NGPU; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n1)"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1; tee -a "$s" < "$OUT/topo.txt"

run limit 120 python3 scripts/gpu/two_gpu_limit.py --mib 1024 --reps 10 --json "$OUT/limit.json"

if [ "$NGPU" -lt 2 ]; then
    say "== skipped 2 and 3: this machine has $NGPU GPU(s); they need two (kind nvidia-h200-x2)"
    exit 0
fi
run cuda-ipc-gpu01 180 $B/gpu_bench --blocks 1024 --block-sizes 1,4 --iters 20 --target-gpu 1 --out "$OUT/gpu01.jsonl"
for op in write read; do
    run disagg-gpu01-$op 120 $B/disagg_kv --device cuda --gpus 0,1 --op $op --requests 16 --layers 8 --blocks 256 --block-bytes 1048576 --blocks-per-request 128
done
for op in WRITE READ; do
    run ucx-gpu01-$op 120 $B/nixlbench --op $op --initiator-seg-type VRAM --target-seg-type VRAM --blocks 1048576,4194304 --batches 1024 --num-iter 10 --warmup-iter 2 --tls cuda_ipc,cuda_copy,tcp --target-gpu 1
done
say "== NIXL 1.5.1 GPU0 -> GPU1 (item 3's comparison): not scripted yet; scripts/gpu.sh nixl run measures one GPU"
)

case "${1:-}" in
    build | run) "$1" ;;
    *) echo "usage: scripts/gpu.sh two-gpu-issue18 build|run" >&2; exit 2 ;;
esac
