#!/usr/bin/env bash
# nvidia-h200 machine (one H200), device tool, one call; carry [".carry/ab"]; the seventh call.
# The main job's 16 KiB READ gap: decode's slots scattered (default) or consecutive
# (`--dst-order sequential`, new in this build), READ and WRITE, transfers posted back to back.
set -u
A=.carry/ab/after
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
M="--device cuda --gpus 0,0 --layers 4 --blocks 16384 --blocks-per-request 2048 --block-bytes 16384 --burst 8 --requests 24 --warmup 1 --post-after-make"
for round in 1 2; do
  for order in scattered sequential; do
    for op in read write; do
      echo "== round $round: disagg_kv $M --op $op --dst-order $order"
      timeout 60 $A/disagg_kv $M --op $op --dst-order $order 2>&1 | grep -E "per request|posted back|verified|rror"
    done
  done
done
