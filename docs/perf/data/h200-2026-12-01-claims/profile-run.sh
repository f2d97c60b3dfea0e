#!/usr/bin/env bash
# Issue 37: where the main job's make and post go at HEAD (phase timer prof.patch refreshed,
# NIXL_PROF=1), 16 KiB blocks, 4 x 2,048 ids per request, bursts of 8 and one at a time.
set -u
B=.carry/claims/extra
W=$(ls -d /tmp/nixl-claims.* 2>/dev/null | head -n1)
export NIXL_UCX_HOME="$PWD/.carry/ucx"
for burst in 8 1; do
  for op in write read; do
    echo "== NIXL_PROF=1 disagg_kv-prof --device cuda --gpus 0,0 --op $op --layers 4 --blocks 16384 --blocks-per-request 2048 --block-bytes 16384 --requests 32 --burst $burst"
    NIXL_PROF=1 timeout 60 $B/disagg_kv-prof --device cuda --gpus 0,0 --op $op --layers 4 --blocks 16384 --blocks-per-request 2048 --block-bytes 16384 --requests 32 --burst $burst 2>&1 | grep -a -E "PROF|per request|bursts|transfer \(post" 
    echo "rc=${PIPESTATUS[0]}"
  done
done
