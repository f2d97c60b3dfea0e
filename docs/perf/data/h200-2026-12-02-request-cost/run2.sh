#!/usr/bin/env bash
# nvidia-h200 machine (one H200), device tool, one call; carry [".carry/ab"]. Issue 37, second
# call: the main job in bursts of 8 requests of 4 x 2,048 descriptors, before (.carry/ab/before,
# commit in before.commit) and after (.carry/ab/after, after.commit), interleaved, 64 requests
# (8 bursts) each so the median burst is steady state; the after binary also with
# --post-after-make --warmup 1 (its transfers timed apart from its makes); paged_bench at the
# same request size; the phase profile of the after code (prof/, profile.patch).
set -u
A=.carry/ab
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
echo "== before $(cat $A/before.commit), after $(cat $A/after.commit)"
M="--device cuda --gpus 0,0 --layers 4 --blocks 16384 --blocks-per-request 2048 --burst 8"
for round in 1 2; do
  for bb in 16384 65536; do
    for op in read write; do
      for v in before after; do
        echo "== round $round $v: disagg_kv $M --op $op --block-bytes $bb --requests 64"
        timeout 150 $A/$v/disagg_kv $M --op $op --block-bytes $bb --requests 64 2>&1 | grep -E "per request|bursts of|verified|rror"
        echo "rc=${PIPESTATUS[0]}"
      done
    done
  done
  echo "== round $round: paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536"
  timeout 120 $A/paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536 --iters 20 --reps 3 2>&1 | grep -E "B x"
  echo "rc=${PIPESTATUS[0]}"
done
for bb in 16384 65536; do
  for op in read write; do
    echo "== after: disagg_kv $M --op $op --block-bytes $bb --requests 64 --warmup 1 --post-after-make"
    timeout 150 $A/after/disagg_kv $M --op $op --block-bytes $bb --requests 64 --warmup 1 --post-after-make 2>&1 | grep -E "per request|bursts of|verified|warm-up|rror"
    echo "rc=${PIPESTATUS[0]}"
  done
done
for op in write read; do
  echo "== NIXL_PROF=1 disagg_kv-prof $M --op $op --block-bytes 16384 --requests 32"
  NIXL_PROF=1 timeout 120 $A/prof/disagg_kv-prof $M --op $op --block-bytes 16384 --requests 32 2>&1 | grep -E "PROF|per request|rror"
  echo "rc=${PIPESTATUS[0]}"
done
