#!/usr/bin/env bash
# nvidia-h200 machine (one H200), device tool, one call; carry [".carry/ab"]. Issue 37: the main
# job's per-request split (make / post / post to done) and GB/s in bursts of 8 requests of
# 4 x 2,048 descriptors, before (.carry/ab/before: the commit named in .carry/ab/before.commit)
# and after (.carry/ab/after), interleaved, beside paged_bench at the same request size.
set -u
A=.carry/ab
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
echo "== before $(cat $A/before.commit), after $(cat $A/after.commit)"
for round in 1 2; do
  for bb in 16384 65536; do
    for op in read write; do
      for v in before after; do
        echo "== round $round $v: disagg_kv --device cuda --gpus 0,0 --op $op --layers 4 --blocks 16384 --blocks-per-request 2048 --block-bytes $bb --requests 32 --burst 8"
        timeout 120 $A/$v/disagg_kv --device cuda --gpus 0,0 --op $op --layers 4 --blocks 16384 \
          --blocks-per-request 2048 --block-bytes $bb --requests 32 --burst 8 2>&1 | grep -E "per request|bursts of|verified|rror" 
        echo "rc=${PIPESTATUS[0]}"
      done
    done
  done
  echo "== round $round: paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536"
  timeout 120 $A/paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536 --iters 20 --reps 3 2>&1 | tail -n 12
  echo "rc=${PIPESTATUS[0]}"
done
