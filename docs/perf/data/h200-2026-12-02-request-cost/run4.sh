#!/usr/bin/env bash
# nvidia-h200 machine, device tool; carry [".carry/ab"]. Issue 37, fifth call: the block
# table written in cache and copied into the pinned buffer (after2, after2.commit) against
# written straight into it (after, after.commit): the phase profile (prof/disagg_kv-prof and
# -prof2, each with profile.patch) and the main job's bursts, interleaved, 16 KiB.
set -u
A=.carry/ab
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); after $(cat $A/after.commit), after2 $(cat $A/after2.commit)"
M="--device cuda --gpus 0,0 --layers 4 --blocks 16384 --blocks-per-request 2048 --burst 8 --block-bytes 16384"
for round in 1 2; do
  for p in prof prof2; do
    echo "== round $round NIXL_PROF=1 disagg_kv-$p $M --op write --requests 32"
    NIXL_PROF=1 timeout 30 $A/prof/disagg_kv-$p $M --op write --requests 32 2>&1 | grep -E "PROF.*(staging take|write table|make:end)|per request|rror"
  done
done
for op in write read; do
  for v in after after2; do
    echo "== $v: disagg_kv $M --op $op --requests 48 --warmup 1"
    timeout 30 $A/$v/disagg_kv $M --op $op --requests 48 --warmup 1 2>&1 | grep -E "per request|bursts of|rror"
  done
done
