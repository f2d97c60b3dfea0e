#!/usr/bin/env bash
# Builds the scale bench (benches/scale) and the block-table GPU test HERE (a machine with the
# Rust toolchain) and copies them, stripped, to .carry/bin/ for scripts/gpu/scale_run.sh on
# the GPU machine (no toolchain there; libcuda and UCX load at run time). Stripped copies:
# the release profile keeps line tables for profiling here.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-shared}"
BIN=.carry/bin
mkdir -p "$BIN"
# shellcheck source=scripts/gpu/pick.sh
. scripts/gpu/pick.sh
scale=$(cargo bench --bench scale --no-run --message-format=json 2>/dev/null | pick scale)
cp "$scale" "$BIN/scale"
strip "$BIN/scale"
blocks=$(cargo test --release -p nixl-mem --test gpu_blocks --no-run --message-format=json 2>/dev/null | pick gpu_blocks)
cp "$blocks" "$BIN/nixl-mem-gpu-blocks"
strip "$BIN/nixl-mem-gpu-blocks"
ls -la "$BIN/scale" "$BIN/nixl-mem-gpu-blocks"
du -sh "$BIN"
