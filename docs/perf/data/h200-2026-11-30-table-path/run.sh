#!/usr/bin/env bash
# nvidia-h200 (one H200), device tool, one call. Issue 35: CUDA_IPC's block and tile
# requests share one table path (commit "CUDA_IPC: one table path for whole blocks and
# tiles"); its GPU tests after the change: nixl-mem's one-GPU suite (tests only) and the KV
# layout tests with every rank on GPU 0 (tiles permuted HND <-> NHD by the tile kernel,
# pieces by the block path), every element checked. Carry .carry/bin (both suites' binaries).
# run.log, kv.log: after "one table path"; run-2.log, kv-2.log: again after "One launch for
# both table kernels".
set -u
export NIXL_UCX_HOME="$PWD/.carry/ucx" LD_LIBRARY_PATH="$PWD/.carry/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1)"
echo "== one-gpu (SKIP_BENCH=1)"
SKIP_BENCH=1 OUT="$OUT/one-gpu" bash scripts/gpu.sh one-gpu run 2>&1 | tail -n 40
echo "== kv_gpus, every rank on GPU 0"
export NIXL_KV_ONE_GPU=1 KV_DECODE_GPU=0
timeout 280 .carry/bin/test-kv_gpus --test-threads 1 > "$OUT/kv.log" 2>&1
echo "rc=$?" >> "$OUT/kv.log"
grep -a -E "^test |test result|panicked|rc=" "$OUT/kv.log"
