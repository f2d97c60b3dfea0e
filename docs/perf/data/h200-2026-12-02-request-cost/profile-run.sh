#!/usr/bin/env bash
# nvidia-h200 machine, device tool; carry [".carry/ab"]. The main job built with profile.patch
# (this folder; applied to the commit in .carry/ab/after.commit for this run only, not
# committed): NIXL_PROF=1 prints, per mark, the median and p90 wall time from the previous mark.
set -u
A=.carry/ab
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
for op in write read; do
  for burst in 8 1; do
    echo "== NIXL_PROF=1 disagg_kv-prof --device cuda --gpus 0,0 --op $op --layers 4 --blocks 16384 --blocks-per-request 2048 --block-bytes 16384 --requests 32 --burst $burst"
    NIXL_PROF=1 timeout 120 $A/prof/disagg_kv-prof --device cuda --gpus 0,0 --op $op --layers 4 --blocks 16384 \
      --blocks-per-request 2048 --block-bytes 16384 --requests 32 --burst $burst 2>&1 | grep -E "PROF|per request|bursts of|rror"
    echo "rc=${PIPESTATUS[0]}"
  done
done
