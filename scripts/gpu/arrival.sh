#!/usr/bin/env bash
# GPU suite `arrival` (issue 27): `scripts/gpu.sh arrival build` here, `scripts/gpu.sh arrival
# run` on a two-GPU machine (kind nvidia-h200-x2; the one-GPU tests also run on one GPU).
# Carry [".carry/bin"].
#
# Completion without polling on GPUs: the async future over CUDA_IPC (woken by a host function
# after the copies; nixl-mem tests/async_gpu.rs) and GPU-waitable arrival (per-layer counters
# the copy kernel advances, a decode-side kernel waiting on them layer by layer; nixl-mem
# tests/arrival_gpu.rs), with the Llama-3-70B benchmark: layer 0 usable vs the whole request,
# and the example examples/layerwise.rs at that shape.
# shellcheck source=scripts/gpu/pick.sh
. "$(dirname "$0")/pick.sh"
set -uo pipefail

build() {
    set -e
    release_env /work/target-gpu fresh
    local bin=.carry/bin
    for t in async_gpu arrival_gpu; do
        cp "$(cargo test --release -p nixl-mem --test "$t" --no-run --message-format=json 2>/dev/null | pick "$t")" "$bin/test-$t"
    done
    cp "$(cargo build --release --example layerwise --message-format=json 2>/dev/null | pick layerwise)" "$bin/layerwise"
    ls -la "$bin"
}

run() {
    start_summary arrival
    nvidia-smi -L >> "$s" 2>&1
    gpu_test_env
    for t in async_gpu arrival_gpu; do
        timeout 280 ".carry/bin/test-$t" --test-threads 1 --nocapture > "$OUT/$t.log" 2>&1
        echo "rc=$?" >> "$OUT/$t.log"
        grep -a -E "polls|usable|released|^test |test result|panicked|SKIPPED|rc=" "$OUT/$t.log" | tee -a "$s"
    done
    # The example: Llama-3-70B's KV (160 tensors of 2048 blocks of 32 KiB), GPU 0 -> GPU 1.
    timeout 120 .carry/bin/layerwise --layers 160 --blocks 2048 --block-kib 32 > "$OUT/layerwise.log" 2>&1
    echo "rc=$?" >> "$OUT/layerwise.log"
    tee -a "$s" < "$OUT/layerwise.log"
}

case "${1:-}" in
    build) build ;;
    run) run ;;
    *) echo "usage: scripts/gpu.sh arrival build|run" >&2; exit 2 ;;
esac
