#!/usr/bin/env bash
# GPU suite `landed`: `scripts/gpu.sh landed build` here, `scripts/gpu.sh landed run` on the
# GPU machine (one GPU): issue 33's kill conformance case over CUDA_IPC and over UCX's
# cuda_ipc, the target process SIGKILLed at a random point of 1-256 MiB VRAM READs and WRITEs
# (nixl_testkit::gpu::killed_target_case, from nixl-mem/tests/gpu_agent.rs and
# nixl-backend-ucx/tests/vram.rs).
#
# build:
#   .carry/bin/nixl-mem-gpu-agent   nixl-mem's tests/gpu_agent.rs (release, stripped)
#   .carry/bin/ucx-vram             nixl-backend-ucx's tests/vram.rs
#   .carry/ucx, .carry/libucx_cu13.libs   UCX with its CUDA transports (scripts/gpu/ucx.sh's)
# Carry [".carry"].
# run:
#   NIXL_KILLS (default 100) kills per operation: READ and WRITE, so 200 kills; the tally by
#   end state in $OUT/landed-gpu.log and $OUT/landed-summary.txt.
# shellcheck source=scripts/gpu/pick.sh
. "$(dirname "$0")/pick.sh"

build() (
set -euo pipefail
release_env /work/target-mem
mkdir -p .carry/bin
exe=$(cargo test --release -p nixl-mem --test gpu_agent --no-run --message-format=json 2>/dev/null | pick gpu_agent)
cp "$exe" .carry/bin/nixl-mem-gpu-agent
exe=$(cargo test --release -p nixl-backend-ucx --test vram --no-run --message-format=json 2>/dev/null | pick vram)
cp "$exe" .carry/bin/ucx-vram
UCX="${NIXL_UCX_HOME:-/opt/nixl-deps/ucx/libucx}"
carry_ucx "$UCX" cuda
libs="$(dirname "$UCX")/libucx_cu13.libs"
if [ -d "$libs" ]; then rm -rf .carry/libucx_cu13.libs && cp -rL "$libs" .carry/libucx_cu13.libs; fi
carry_fits
)

run() (
set -uo pipefail
start_summary landed /tmp/nixl-landed-out
b=.carry/bin/nixl-mem-gpu-agent
[ -x "$b" ] || { say "missing $b: run scripts/gpu.sh landed build and carry .carry"; exit 2; }
say "== host: $(nproc) cores; $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
export NIXL_KILLS="${NIXL_KILLS:-100}"
# ONLY=cuda_ipc or ONLY=ucx runs one transport (at 100 kills each fits one device call).
only="${ONLY:-all}"
if [ "$only" = all ] || [ "$only" = cuda_ipc ]; then
timeout "${NIXL_CUDA_IPC_S:-270}" "$b" --exact \
    gpu_agent_a_killed_target_never_ends_done_unless_landed --nocapture --test-threads 1 \
    > "$OUT/landed-gpu.log" 2>&1
say "CUDA_IPC rc=$?"
grep -E 'kills per operation|test result|panicked' "$OUT/landed-gpu.log" | tee -a "$s"
fi
if [ "$only" = all ] || [ "$only" = ucx ]; then
use_carried_ucx
export UCX_MODULES='^ib,rdmacm'
timeout "${NIXL_UCX_S:-270}" .carry/bin/ucx-vram --exact \
    ucx_cuda_ipc_a_killed_target_never_ends_done_unless_landed --nocapture --test-threads 1 \
    > "$OUT/landed-ucx-gpu.log" 2>&1
say "UCX cuda_ipc rc=$?"
grep -E 'kills per operation|test result|panicked|skipped' "$OUT/landed-ucx-gpu.log" | tee -a "$s"
fi
)

case "${1:-}" in
build) build ;;
run) run ;;
*) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
