#!/usr/bin/env bash
# nvidia-h200 (one H200), device tool, one call. Issue 35: CUDA_IPC's one table path (1617ea0,
# blocks and tiles through one prepare and one kernel launch) before (`*.old`, built at
# 1a634f3) and after (built at 731b023), interleaved in two rounds: the paged benchmark (block
# tables, CUDA_IPC READ/WRITE between two processes on GPU 0), the KV benchmark (tiles: TP 2
# HND -> TP 1 NHD, every rank on GPU 0) and the main job (NIXL-shaped requests by index).
# Carry [".carry/tp", ".carry/ucx"].
set -u
B=.carry/tp
export NIXL_UCX_HOME="$PWD/.carry/ucx" LD_LIBRARY_PATH="$PWD/.carry/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
for round in 1 2; do
  for v in old new; do
    s=""; [ "$v" = old ] && s=.old
    echo "== round $round $v: paged_bench --gpu 0 --target-gpu 0 --blocks 2048 --block-bytes 4096,16384,65536,1048576"
    timeout 150 $B/paged_bench$s --gpu 0 --target-gpu 0 --blocks 2048 --block-bytes 4096,16384,65536,1048576 --iters 20 --reps 5 --json "$OUT/paged-$round-$v.jsonl" 2>&1 | tail -n 12
    echo "rc=$?"
    echo "== round $round $v: kv_bench --model 8b --blocks 2048 --tp 2 --iters 10 --decode-gpu 0"
    timeout 120 $B/kv_bench$s --model 8b --blocks 2048 --tp 2 --iters 10 --decode-gpu 0 2>&1 | tail -n 9
    echo "rc=$?"
    for op in read write; do
      echo "== round $round $v: disagg_kv --device cuda --gpus 0,0 --op $op --requests 16 --layers 4 --blocks 4096 --blocks-per-request 2048 --block-bytes 16384"
      timeout 90 $B/disagg_kv$s --device cuda --gpus 0,0 --op $op --requests 16 --layers 4 --blocks 4096 --blocks-per-request 2048 --block-bytes 16384 2>&1 | tail -n 8
      echo "rc=$?"
    done
  done
done
