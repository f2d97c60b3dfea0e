#!/usr/bin/env bash
# Builds HERE what scripts/gpu/two_gpu_run.sh runs on a two-GPU machine, into .carry/bin
# (stripped release binaries: gpu_bench, disagg_kv, nixlbench) and .carry/ucx (UCX from the
# libucx-cu13 wheel, via scripts/gpu/build_all.sh's copy). Carry [".carry/bin", ".carry/ucx",
# ".carry/libucx_cu13.libs"].
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-gpu}"
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
BIN=.carry/bin
mkdir -p "$BIN"
# shellcheck source=scripts/gpu/pick.sh
. scripts/gpu/pick.sh
cp "$(cargo build --release -p nixl-mem --example gpu_bench --message-format=json 2>/dev/null | pick gpu_bench)" "$BIN/gpu_bench"
cp "$(cargo build --release --all-features --example disagg_kv --message-format=json 2>/dev/null | pick disagg_kv)" "$BIN/disagg_kv"
cp "$(cargo build --release --bench nixlbench --message-format=json 2>/dev/null | pick nixlbench)" "$BIN/nixlbench"
[ -f .carry/ucx/lib/libucp.so.0 ] || echo "no .carry/ucx: run scripts/gpu/build_all.sh once for the UCX libraries" >&2
du -sh "$BIN"/gpu_bench "$BIN"/disagg_kv "$BIN"/nixlbench
