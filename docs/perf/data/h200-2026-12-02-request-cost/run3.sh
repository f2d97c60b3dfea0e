#!/usr/bin/env bash
# nvidia-h200 machine, device tool; carry [".carry/ab"]. Issue 37, third call (the second ran
# out of its ten minutes before these parts): the after binary's bursts with
# --post-after-make (a burst's transfers timed apart from its makes) at 16 KiB, and the phase
# profile of the after code (prof/, built with profile.patch) for a WRITE.
set -u
A=.carry/ab
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs; after $(cat $A/after.commit)"
M="--device cuda --gpus 0,0 --layers 4 --blocks 16384 --blocks-per-request 2048 --burst 8 --block-bytes 16384"
for op in read write; do
  echo "== after: disagg_kv $M --op $op --requests 32 --warmup 1 --post-after-make"
  timeout 60 $A/after/disagg_kv $M --op $op --requests 32 --warmup 1 --post-after-make 2>&1 | grep -E "per request|bursts of|verified|warm-up|rror"
  echo "rc=${PIPESTATUS[0]}"
done
echo "== NIXL_PROF=1 disagg_kv-prof $M --op write --requests 32"
NIXL_PROF=1 timeout 60 $A/prof/disagg_kv-prof $M --op write --requests 32 2>&1 | grep -E "PROF|per request|rror"
echo "rc=${PIPESTATUS[0]}"
