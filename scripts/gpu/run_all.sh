#!/usr/bin/env bash
# GPU machine: every GPU test of nixl-mem, nixl-backend-gds and nixl-backend-ucx, from the
# binaries scripts/gpu/build_all.sh put in .carry/ (no toolchain needed). Runs
# scripts/gpu/run.sh (nixl-mem tests), scripts/gpu/storage_run.sh (VRAM <-> FILE: POSIX bounce
# engine and GDS, once plain and once with force_compat_mode) and the UCX VRAM test; the
# benches only with SKIP_BENCH=0 (then longer than one 10-minute device command). A test that
# skips for want of the GPU, cuFile or a CUDA-aware UCX fails the run (NIXL_REQUIRE_DEPS).
# Logs and summaries to $OUT. Bounded: 3 x 90 s + 3 x 120 s + 120 s of tests at most.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT="${OUT:-/tmp/nixl-gpu-out}"; mkdir -p "$OUT"
export SKIP_BENCH="${SKIP_BENCH:-1}"
fail=0
bash scripts/gpu/run.sh || fail=1
bash scripts/gpu/storage_run.sh || fail=1
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
    echo "missing .carry/bin/ucx-vram: run scripts/gpu/build_all.sh" | tee -a "$OUT/summary.txt"; fail=1
fi
echo "run_all: $([ $fail -eq 0 ] && echo PASS || echo FAIL)" | tee -a "$OUT/summary.txt"
exit $fail
