#!/usr/bin/env bash
# GPU suite `scale`: `scripts/gpu.sh scale build` here, `scripts/gpu.sh scale run` on
# the GPU machine.
#
# build:
# Builds the scale bench (benches/scale) and the block-table GPU test HERE (a machine with the
# Rust toolchain) and copies them, stripped, to .carry/bin/ for scripts/gpu.sh scale run on
# the GPU machine (no toolchain there; libcuda and UCX load at run time). Stripped copies:
# the release profile keeps line tables for profiling here.
# run:
# GPU machine: the block-table GPU test, then the scale bench (issue 14) for CUDA_IPC (VRAM on
# GPU 0: flat 1k..128k descriptors and the Llama-3-8B, Llama-3-70B and 16-layer MoE block
# tables) and, on the same host's CPUs, NULL, INPROC and UCX. Prebuilt binaries in .carry/bin
# (scripts/gpu.sh scale build); UCX from .carry/ucx when present. Results to $OUT. Bounded by
# the timeouts below (at most 14 minutes; PART=gpu or PART=cpu runs one half, to fit a
# 10-minute call).
# shellcheck source=scripts/gpu/pick.sh
. "$(dirname "$0")/pick.sh"

build() (
set -euo pipefail
release_env /work/target-shared
BIN=.carry/bin
scale=$(cargo bench -p nixl-bench --bench scale --no-run --message-format=json 2>/dev/null | pick scale)
cp "$scale" "$BIN/scale"
strip "$BIN/scale"
blocks=$(cargo test --release -p nixl-mem --test gpu_blocks --no-run --message-format=json 2>/dev/null | pick gpu_blocks)
cp "$blocks" "$BIN/nixl-mem-gpu-blocks"
strip "$BIN/nixl-mem-gpu-blocks"
ls -la "$BIN/scale" "$BIN/nixl-mem-gpu-blocks"
du -sh "$BIN"
)

run() (
set -uo pipefail
start_summary scale /tmp/nixl-gpu-out
B=.carry/bin
use_carried_ucx
run() { local name=$1 t=$2; shift 2; say "== $name: $*"; timeout "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?; grep -v '^warning' "$OUT/$name.log" | tail -n 40 | tee -a "$s"; say "rc=$rc"; }
say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
if [ "${PART:-gpu}" != cpu ]; then
  run gpu-blocks 120 $B/nixl-mem-gpu-blocks --nocapture
  run scale-cuda-ipc 300 $B/scale --backend CUDA_IPC --mode all --rounds 3
fi
if [ "${PART:-cpu}" != gpu ]; then
  run scale-cpu-flat 240 $B/scale --backend NULL,INPROC,UCX --mode flat --rounds 3
  run scale-cpu-kv-null 90 $B/scale --backend NULL --mode kv
  run scale-cpu-kv-ucx 150 $B/scale --backend INPROC,UCX --mode kv --model llama3-70b --iters 5
fi
)

case "${1:-}" in
    build | run) "$1" ;;
    *) echo "usage: scripts/gpu.sh scale build|run" >&2; exit 2 ;;
esac
