#!/usr/bin/env bash
# The READ gap (a constant ~130 us per burst): (a) a one-block READ made, posted and waited for
# just before each burst (PREREAD); (b) prefill's sources filled once, not before every burst,
# and decode's check of the later bursts skipped (NOFILL: timing only).
set -u
E=.carry/exp
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
f() { grep -E "posted back|verified|rror|panick" ; }
M="--device cuda --gpus 0,0 --layers 4 --blocks-per-request 2048 --block-bytes 16384 --warmup 1 --post-after-make --blocks 4096 --burst 2 --requests 12"
for round in 1 2; do
  for env in X=1 DISAGG_EXP_PREREAD=1 DISAGG_EXP_NOFILL=1; do
    for op in read write; do
      echo "== round $round: $env disagg_kv $M --op $op"
      env $env timeout 90 $E/disagg_kv_touch $M --op $op 2>&1 | f
    done
  done
done
echo "== end $(date -u +%FT%TZ)"
