#!/usr/bin/env bash
# nvidia-h200-x2 (two H200, NVLink), device tool, one call. The request-cost change (a93fa43:
# the wake armed by an awaiting future, the first post's record covering the upload) on two
# GPUs: nixl-mem's two-GPU and async/arrival/block tests, then the paged benchmark across the
# GPUs before (80198c4) and after, interleaved, and the main job across the GPUs (after).
set -u
P=.carry/p7
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1) x$(nvidia-smi -L | wc -l); $(nproc) CPUs"
for t in two_gpus kv_gpus async_gpu arrival_gpu gpu_blocks; do
  timeout 100 $P/$t --test-threads 4 > "$OUT/test-$t.log" 2>&1; echo "$t rc=$? $(grep -E '^test result' "$OUT/test-$t.log" | tail -n 1)"
done
for round in 1 2; do for which in paged_bench.before paged_bench; do
  echo "== round $round: $which --gpu 1 --target-gpu 0 --blocks 2048 --block-bytes 16384,65536 --iters 20 --reps 5"
  timeout 100 $P/$which --gpu 1 --target-gpu 0 --blocks 2048 --block-bytes 16384,65536 --iters 20 --reps 5 2>&1 | grep -E 'GB/s|rror' | cut -c1-110
done; done
for op in read write; do
  echo "== disagg_kv --device cuda --gpus 0,1 --op $op --block-bytes 65536 --blocks 512 --blocks-per-request 256 --requests 16 --layers 32"
  timeout 60 $P/disagg_kv --device cuda --gpus 0,1 --op $op --requests 16 --layers 32 --blocks 512 --blocks-per-request 256 --block-bytes 65536 2>&1 | grep -E 'per request|verified|rror' | cut -c1-220
done
