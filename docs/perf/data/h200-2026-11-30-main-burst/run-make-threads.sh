#!/usr/bin/env bash
# nvidia-h200 (one H200, 16-core host), device tool, one call. Issue 37: the main job in bursts
# of 8 (16 KiB blocks, 4 x 2,048 descriptors per request) with the burst's requests made on one
# thread and on four (--make-threads), READ and WRITE, two interleaved rounds, beside the paged
# benchmark at 8,192 blocks per request.
set -u
P=.carry/p9
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
{
for round in 1 2; do
  echo "== round $round: paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384 --iters 20 --reps 5"
  timeout 60 $P/paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384 --iters 20 --reps 5 2>&1 | grep -E 'GB/s|rror' | cut -c1-100 | sed "s/^/blocks 8192: /"
  for op in read write; do
    for t in 1 4; do
      echo "== round $round: disagg_kv --device cuda --gpus 0,0 --op $op --block-bytes 16384 --layers 4 --blocks 16384 --blocks-per-request 2048 --requests 32 --burst 8 --make-threads $t"
      timeout 100 $P/disagg_kv --device cuda --gpus 0,0 --op $op --requests 32 --burst 8 --make-threads $t --layers 4 --blocks 16384 --blocks-per-request 2048 --block-bytes 16384 2>&1 | grep -E 'per request|bursts of|verified|rror|mismatch'
      echo "rc=$?"
    done
  done
done
} > "$OUT/make-threads.log" 2>&1
grep -E '^==|make median|bursts of|blocks 8192|rc=' "$OUT/make-threads.log" | sed 's/post to done median.*make + post + done//' | cut -c1-200
