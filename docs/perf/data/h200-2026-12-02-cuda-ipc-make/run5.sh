#!/usr/bin/env bash
# nvidia-h200 machine (one H200), device tool, one call; carry [".carry/ab"]; the sixth call.
# The main job before (6c4fa1a) and after (the build of footprint.log), interleaved: bursts of
# 8 requests of 4 x 2,048 descriptors, makes overlapping the copies as an engine posts them
# (the default), the first burst left out; 16 and 64 KiB, READ and WRITE; paged_bench after.
set -u
A=.carry/ab
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
echo "== before $(cat $A/before/commit), after $(cat $A/after/commit)"
M="--device cuda --gpus 0,0 --layers 4 --blocks 16384 --blocks-per-request 2048 --burst 8 --requests 32 --warmup 1"
for bb in 16384 65536; do
  for op in read write; do
    for v in before after; do
      echo "== $v: disagg_kv $M --op $op --block-bytes $bb"
      timeout 60 $A/$v/disagg_kv $M --op $op --block-bytes $bb 2>&1 | grep -E "per request|bursts of|verified|rror"
      echo "rc=${PIPESTATUS[0]}"
    done
  done
done
echo "== after: paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536"
timeout 100 $A/after/paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536 --iters 20 --reps 3 2>&1 | grep -E "B x|rror"
echo "rc=${PIPESTATUS[0]}"
