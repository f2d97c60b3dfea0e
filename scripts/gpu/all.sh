#!/usr/bin/env bash
# GPU suite `all`: `scripts/gpu.sh all build` here, `scripts/gpu.sh all run` on
# the GPU machine.
#
# build:
# Builds HERE (a machine with the Rust toolchain; no CUDA, cuFile or GPU needed: libcuda and
# libcufile are loaded at run time) everything scripts/gpu.sh all run runs on the GPU machine,
# into .carry/ (carry `.carry`; the script prints its size, which must stay under 64 MiB):
#   scripts/gpu.sh one-gpu build          nixl-mem: lib unit tests, tests/gpu*.rs, the gpu_bench example
#   scripts/gpu.sh storage build  nixl-backend-gds: tests/vram_file.rs, tests/gds.rs, the bench
#   ucx-vram                      nixl-backend-ucx: tests/vram.rs
#   .carry/ucx/lib                UCX's shared libraries (stripped), from $NIXL_UCX_HOME or
#                                 scripts/deps/ucx.sh's install, for the CUDA-aware UCX test
# One target directory for all of them (CARGO_TARGET_DIR, default /work/target-gpu).
# run:
# GPU machine: every GPU test of nixl-mem, nixl-backend-gds and nixl-backend-ucx, from the
# binaries scripts/gpu.sh all build put in .carry/ (no toolchain needed). Runs
# scripts/gpu.sh one-gpu run (nixl-mem tests), scripts/gpu.sh storage run (VRAM <-> FILE: POSIX bounce
# engine and GDS, once plain and once with force_compat_mode) and the UCX VRAM test; the
# benches only with SKIP_BENCH=0 (then longer than one 10-minute device command). A test that
# skips for want of the GPU, cuFile or a CUDA-aware UCX fails the run (NIXL_REQUIRE_DEPS).
# Logs and summaries to $OUT. Bounded: 3 x 90 s + 3 x 120 s + 120 s of tests at most.

build() (
set -euo pipefail
cd "$(dirname "$0")/../.."
# The same binaries and UCX libraries as the ucx suite (one-gpu, storage, the UCX VRAM
# test, UCX's shared libraries): its build is this one.
bash scripts/gpu.sh ucx build
)

run() (
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT="${OUT:-/tmp/nixl-gpu-out}"; mkdir -p "$OUT"
export SKIP_BENCH="${SKIP_BENCH:-1}"
fail=0
bash scripts/gpu.sh one-gpu run || fail=1
bash scripts/gpu.sh storage run || fail=1
# The UCX backend with VRAM, on the carried UCX build (CUDA-aware).
if [ -x .carry/bin/ucx-vram ]; then
    export NIXL_UCX_HOME="$PWD/.carry/ucx"
    export LD_LIBRARY_PATH="$PWD/.carry/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    NIXL_REQUIRE_DEPS=1 NIXL_ALLOW_SKIP="multi-gpu,nvidia-fs,s3,etcd,netns,nixl,efa,fi-hmem,rocm-gpu,libfabric" \
        timeout 120 .carry/bin/ucx-vram --nocapture > "$OUT/ucx-vram.log" 2>&1
    rc=$?
    echo "tests ucx-vram: rc=$rc $(grep -E '^test result:' "$OUT/ucx-vram.log" | tail -1)" | tee -a "$OUT/summary.txt"
    grep -E 'SKIPPED|FAILED|panicked|path' "$OUT/ucx-vram.log" | head -10
    [ $rc -eq 0 ] || fail=1
else
    echo "missing .carry/bin/ucx-vram: run scripts/gpu.sh all build" | tee -a "$OUT/summary.txt"; fail=1
fi
echo "run_all: $([ $fail -eq 0 ] && echo PASS || echo FAIL)" | tee -a "$OUT/summary.txt"
exit $fail
)

case "${1:-}" in
    build | run) "$1" ;;
    *) echo "usage: scripts/gpu.sh all build|run" >&2; exit 2 ;;
esac
