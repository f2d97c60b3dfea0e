#!/usr/bin/env bash
# Prepares HERE one GPU-machine call that re-measures issue 14's open points in one session
# (scripts/gpu/recheck_run.sh): the flat scale sweep through CUDA_IPC and NULL (make linearity),
# the CUDA_IPC GPU tests (block tables, agents: copies checked byte for byte), and the DRAM sweep
# against native NIXL. Everything goes to .carry/recheck/ (under the 64 MiB a call carries):
# the slim nixl-cu13 wheel (its libnixl.so and UCX 1.23 serve both sides of the sweep), the
# native reference, nixlbench, the scale bench and the two GPU test binaries.
# Carry: [".carry/recheck"].
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-shared}"
bash scripts/gpu/native_build.sh >/dev/null
bash scripts/gpu/scale_build.sh >/dev/null
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
