#!/usr/bin/env bash
# Prepares HERE what scripts/gpu/native_run.sh needs on the GPU machine's host (no toolchain
# there), into .carry/ (git-ignored), within the 64 MiB a call may carry:
#   .carry/nixl312/              the slim nixl-cu13 1.5.1 wheel for CPython 3.12 (scripts/gpu/nixl_build.sh;
#                                reused: its libnixl.so, UCX plugin and bundled UCX 1.23 serve both sides)
#   .carry/nixl-bin/nixl_native  the native NIXL reference (benches/reference/native), linked
#                                against that copy of libnixl.so
#   .carry/nixl-bin/nixlbench    nixl-rs' nixlbench (release, stripped)
#   .carry/nixl-bin/gpu_bench    nixl-mem's CUDA_IPC bench (release, stripped; --sweep = copy kernel alone)
# Carry: [".carry/nixl312", ".carry/nixl-bin"].
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -e .carry/nixl312/.nixl_cu13.mesonpy.libs/libnixl.so ]; then
    bash scripts/gpu/nixl_build.sh
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-shared}"
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
BIN=.carry/nixl-bin
mkdir -p "$BIN"
NIXL_PYTHONPATH="$PWD/.carry/nixl312" bash benches/reference/native/build.sh "$BIN/nixl_native"
strip "$BIN/nixl_native"
# shellcheck source=scripts/gpu/pick.sh
. scripts/gpu/pick.sh
exe=$(cargo build --release --bench nixlbench --message-format=json 2>/dev/null | pick nixlbench)
cp "$exe" "$BIN/nixlbench"
exe=$(cargo build --release -p nixl-mem --example gpu_bench --message-format=json 2>/dev/null | pick gpu_bench)
cp "$exe" "$BIN/gpu_bench"
du -sh "$BIN"/* .carry/nixl312
echo "native_build.sh: total $(du -csh .carry/nixl312 "$BIN" | tail -n1 | cut -f1) (limit 64 MiB per call)"
