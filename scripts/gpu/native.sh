#!/usr/bin/env bash
# GPU suite `native`: `scripts/gpu.sh native build` here, `scripts/gpu.sh native run` on
# the GPU machine.
#
# build:
# Prepares HERE what scripts/gpu.sh native run needs on the GPU machine's host (no toolchain
# there), into .carry/ (git-ignored), within the 64 MiB a call may carry:
#   .carry/nixl312/              the slim nixl-cu13 1.5.1 wheel for CPython 3.12 (scripts/gpu.sh nixl build;
#                                reused: its libnixl.so, UCX plugin and bundled UCX 1.23 serve both sides)
#   .carry/nixl-bin/nixl_native  the native NIXL reference (benches/reference/native), linked
#                                against that copy of libnixl.so
#   .carry/nixl-bin/nixlbench    nixl-rs' nixlbench (release, stripped)
#   .carry/nixl-bin/gpu_bench    nixl-mem's CUDA_IPC bench (release, stripped; --sweep = copy kernel alone)
# Carry: [".carry/nixl312", ".carry/nixl-bin"].
# run:
# GPU machine's host, one call (under 10 minutes), from the binaries scripts/gpu.sh native build
# put in .carry/ (carry [".carry/nixl312", ".carry/nixl-bin"]):
#  1. DRAM -> DRAM sweep, native NIXL 1.5.1 (C++ API, the wheel's libnixl.so) vs nixl-rs, READ and
#     WRITE, 4K..64M x 1/32, 3 rounds interleaved per point (each point runs native and
#     nixl-rs back to back, the order alternating), both on the wheel's UCX 1.23, progress
#     threads off (benches/reference/compare_native.py); then notification latency (4 KiB WRITE
#     + notification, median time until the target sees it), 3 rounds each.
#  2. Item 6 of issue 14: the CUDA_IPC copy kernel alone (gpu_bench --sweep: one process,
#     busy-polled, per-block VRAM->VRAM 1 MiB x 1024, every kernel shape, with the merged
#     cuMemcpy as the device's copy ceiling), then the two-process bench at 1 MiB per block, so
#     the gap between the kernel alone and the two-process request is measured in one session.
# Results and logs in $OUT (default /tmp/nixl-native-out); a summary in $OUT/native-summary.txt.

build() (
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -e .carry/nixl312/.nixl_cu13.mesonpy.libs/libnixl.so ]; then
    bash scripts/gpu.sh nixl build
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-shared}"
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
BIN=.carry/nixl-bin
mkdir -p "$BIN"
NIXL_PYTHONPATH="$PWD/.carry/nixl312" bash benches/reference/native/build.sh "$BIN/nixl_native"
strip "$BIN/nixl_native"
# shellcheck source=scripts/gpu/pick.sh
. scripts/gpu/pick.sh
exe=$(cargo build --release -p nixl-bench --bench nixlbench --message-format=json 2>/dev/null | pick nixlbench)
cp "$exe" "$BIN/nixlbench"
exe=$(cargo build --release -p nixl-bench --bin gpu_bench --message-format=json 2>/dev/null | pick gpu_bench)
cp "$exe" "$BIN/gpu_bench"
du -sh "$BIN"/* .carry/nixl312
echo "native_build.sh: total $(du -csh .carry/nixl312 "$BIN" | tail -n1 | cut -f1) (limit 64 MiB per call)"
)

run() (
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/nixl-native-out}"; mkdir -p "$OUT"
N="$PWD/.carry/nixl312"; B="$PWD/.carry/nixl-bin"
s="$OUT/native-summary.txt"; : > "$s"
say() { echo "$*" | tee -a "$s"; }
for f in nixl_native nixlbench gpu_bench; do
    [ -x "$B/$f" ] || { say "missing $B/$f: run scripts/gpu.sh native build and carry .carry/nixl312 and .carry/nixl-bin"; exit 2; }
done
say "== host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), THP $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null), $(python3 -V 2>&1)"
say "== GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n1)"
say "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"

say "== 1. DRAM sweep + notification latency: native NIXL vs nixl-rs (3 interleaved rounds)"
timeout 330 python3 benches/reference/compare_native.py --nixlbench "$B/nixlbench" --native "$B/nixl_native" \
    --nixl-path "$N" --rounds 3 --interleave point --notif-iters 5000 --timeout 120 --out "$OUT/native-sweep.json" \
    > "$OUT/native-sweep.log" 2>&1
say "rc=$?"
sed -n '/^load average during/,$p' "$OUT/native-sweep.log" | tee -a "$s"
grep -E '^warning' "$OUT/native-sweep.log" | head -5 | tee -a "$s"

say "== 2a. copy kernel alone: gpu_bench --sweep, per-block VRAM->VRAM 1 MiB x 1024, every shape"
timeout 100 "$B/gpu_bench" --sweep --blocks 1024 --block-sizes 1 --iters 20 --reps 5 \
    --out "$OUT/kernel-sweep.jsonl" > "$OUT/kernel-sweep.log" 2>&1
say "rc=$?"
tail -n 25 "$OUT/kernel-sweep.log" | tee -a "$s"

say "== 2a'. the same at 4096 blocks per request (4 GiB): a per-request cost would show as a higher rate here"
timeout 100 "$B/gpu_bench" --sweep --blocks 4096 --block-sizes 1 --iters 10 --reps 3 \
    --out "$OUT/kernel-sweep-4096.jsonl" > "$OUT/kernel-sweep-4096.log" 2>&1
say "rc=$?"
grep -E '^(config|merged|best)' "$OUT/kernel-sweep-4096.log" | tee -a "$s"

say "== 2b. two processes, default kernel shape, 1 MiB x 1024 (merged and per-block, WRITE and READ)"
timeout 70 "$B/gpu_bench" --blocks 1024 --block-sizes 1 --iters 50 --out "$OUT/gpu-bench.jsonl" \
    > "$OUT/gpu-bench.log" 2>&1
say "rc=$?"
grep -E 'GB/s|verified|error' "$OUT/gpu-bench.log" | head -20 | tee -a "$s"
say "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
)

case "${1:-}" in
    build | run) "$1" ;;
    *) echo "usage: scripts/gpu.sh native build|run" >&2; exit 2 ;;
esac
