#!/usr/bin/env bash
# nvidia-h200 (one H200, 16-core host), device tool, one call. Issue 37: nixl-mem's GPU tests
# on this change, then the main job before (disagg_kv.before: commit 80198c4) and after (this
# change, a93fa43), interleaved, beside the paged benchmark in the same call; two processes on
# GPU 0, every byte verified by the example.
set -u
P=.carry/p4
T=.carry/p4t
export NIXL_UCX_HOME="$PWD/.carry/ucx" LD_LIBRARY_PATH="$PWD/.carry/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
for t in nixl_mem gpu gpu_agent gpu_blocks async_gpu arrival_gpu; do
  timeout 100 $T/$t --test-threads 4 --nocapture > "$OUT/test-$t.log" 2>&1; echo "$t rc=$? $(grep -E '^test result' "$OUT/test-$t.log" | tail -n 1)"
done
grep -h 'awaited in' "$OUT"/test-async_gpu.log
{
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
for round in 1 2; do
  for shape in "4 4096 2048" "32 512 256"; do
    set -- $shape
    for op in read write; do
      for which in disagg_kv.before disagg_kv; do
        echo "== round $round: $which --device cuda --gpus 0,0 --op $op --block-bytes 16384 --blocks $2 --blocks-per-request $3 --requests 16 --layers $1"
        timeout 60 $P/$which --device cuda --gpus 0,0 --op $op --requests 16 --layers $1 --blocks $2 --blocks-per-request $3 --block-bytes 16384 2>&1 | grep -E 'per request|rror|mismatch'
        echo "rc=$?"
      done
    done
  done
done
echo "== paged_bench --gpu 0 --target-gpu 0 --blocks 2048 --block-bytes 16384"
timeout 100 $P/paged_bench --gpu 0 --target-gpu 0 --blocks 2048 --block-bytes 16384 --iters 20 --reps 5 2>&1 | tail -n 3
} > "$OUT/main.log" 2>&1
grep -E 'per request|GB/s' "$OUT/main.log" | sed 's/make + post + done: 16 requests x 131072 KiB: //' | cut -c1-170
