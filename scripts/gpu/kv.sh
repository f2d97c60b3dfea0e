#!/usr/bin/env bash
# GPU suite `kv` (issue 26): `scripts/gpu.sh kv build` here, `scripts/gpu.sh kv run` on a
# two-GPU machine (kind nvidia-h200-x2). Carry [".carry/bin"].
#
# KV layouts between GPUs over CUDA_IPC: prefill ranks (one process each) with their pools on
# GPU 0, decode ranks on GPU 1, Llama-3-8B (TP 2 -> 1 NHD, TP 1 -> 2 HND) and Llama-3-70B
# (TP 2 -> 1 HND) shapes; every element checked (nixl-mem tests/kv_gpus.rs), pieces and
# tiles (HND <-> NHD permuted by the tile kernel). Then the benchmark (benches/kv_bench.rs):
# Llama-3-8B and -70B, 2048 blocks, prefill TP 2 HND -> decode TP 1 NHD, one pass vs move
# then permute, and the link's limit measured in the same call (two_gpu_limit.py, torch).
# On a one-GPU machine `NIXL_KV_ONE_GPU=1 KV_DECODE_GPU=0 scripts/gpu.sh kv run` runs the
# same cases and the benchmark with every rank on GPU 0 (processes still cross through CUDA
# IPC; the link figure is then the GPU's own copy, and the two-GPU limit script fails).
# shellcheck source=scripts/gpu/pick.sh
. "$(dirname "$0")/pick.sh"
set -uo pipefail

build() {
    set -e
    release_env /work/target-gpu fresh
    local bin=.carry/bin
    cp "$(cargo test --release -p nixl-mem --test kv_gpus --no-run --message-format=json 2>/dev/null | pick kv_gpus)" "$bin/test-kv_gpus"
    cp "$(cargo build --release -p nixl-bench --bin kv_bench --message-format=json 2>/dev/null | pick kv_bench)" "$bin/kv_bench"
    ls -la "$bin"
}

run() {
    start_summary kv
    nvidia-smi -L >> "$s" 2>&1
    gpu_test_env
    timeout 500 .carry/bin/test-kv_gpus --test-threads 1 --nocapture > "$OUT/kv.log" 2>&1
    echo "rc=$?" >> "$OUT/kv.log"
    grep -a -E "GB/s|^test |test result|panicked|SKIPPED|rc=" "$OUT/kv.log" | tee -a "$s"
    timeout 120 python3 scripts/gpu/two_gpu_limit.py --mib 1024 --reps 10 --json "$OUT/limit.json" > "$OUT/limit.log" 2>&1
    echo "rc=$?" >> "$OUT/limit.log"
    tee -a "$s" < "$OUT/limit.log"
    for m in 8b 70b; do
        timeout 240 .carry/bin/kv_bench --model "$m" --blocks 2048 --tp 2 --iters 10 ${KV_DECODE_GPU:+--decode-gpu "$KV_DECODE_GPU"} > "$OUT/kv_bench-$m.log" 2>&1
        echo "rc=$?" >> "$OUT/kv_bench-$m.log"
        tee -a "$s" < "$OUT/kv_bench-$m.log"
    done
}

case "${1:-}" in
    build) build ;;
    run) run ;;
    *) echo "usage: scripts/gpu.sh kv build|run" >&2; exit 2 ;;
esac
