#!/usr/bin/env bash
# nvidia-h200 (one H200, 16-core host), device tool, one call. Issue 37: the main job in bursts
# of 8 with CUDA_IPC keeping 4 staging pairs (disagg_kv.before, 50d7e59) and 16 (disagg_kv),
# interleaved, 16 and 64 KiB, READ and WRITE, two rounds, beside the paged benchmark at 8,192
# blocks per request (the main job's request size).
set -u
P=.carry/p8
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
{
for round in 1 2; do
  echo "== round $round: paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536 --iters 20 --reps 5"
  timeout 120 $P/paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536 --iters 20 --reps 5 2>&1 | grep -E 'GB/s|rror' | cut -c1-100 | sed "s/^/blocks 8192: /"
  for bb in 16384 65536; do
    for op in read write; do
      for which in disagg_kv.before disagg_kv; do
        echo "== round $round: $which --device cuda --gpus 0,0 --op $op --block-bytes $bb --layers 4 --blocks 16384 --blocks-per-request 2048 --requests 32 --burst 8"
        timeout 150 $P/$which --device cuda --gpus 0,0 --op $op --requests 32 --burst 8 --layers 4 --blocks 16384 --blocks-per-request 2048 --block-bytes $bb 2>&1 | grep -E 'per request|bursts of|verified|rror|mismatch'
        echo "rc=$?"
      done
    done
  done
done
} > "$OUT/staging.log" 2>&1
grep -E '^==|make median|bursts of|blocks 8192|rc=' "$OUT/staging.log" | sed 's/post to done median.*make + post + done//' | cut -c1-200
