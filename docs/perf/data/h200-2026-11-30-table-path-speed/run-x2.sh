#!/usr/bin/env bash
# nvidia-h200-x2 (two H200, NVLink), device tool, one call: the same before (`.old`, 1a634f3)
# / after (731b023) binaries as run.sh, across the link: the paged benchmark GPU 0 -> GPU 1
# (ROUNDS rounds, default 6, order alternating: after first in odd rounds) and the KV
# benchmark (prefill TP 2 on GPU 0 -> decode TP 1 on GPU 1), KV_ROUNDS rounds (default 2);
# SIZES picks the block sizes (default 4096,16384,65536).
# Carry [".carry/tp", ".carry/ucx"].
set -u
B=.carry/tp
export NIXL_UCX_HOME="$PWD/.carry/ucx" LD_LIBRARY_PATH="$PWD/.carry/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nvidia-smi -L | wc -l) GPUs; $(nproc) CPUs"
for round in $(seq 1 ${ROUNDS:-6}); do
  order="new old"; [ $((round % 2)) = 0 ] && order="old new"
  for v in $order; do
    s=""; [ "$v" = old ] && s=.old
    echo "== round $round $v: paged_bench --gpu 0 --target-gpu 1 --blocks 2048 --block-bytes 4096,16384,65536"
    timeout 120 $B/paged_bench$s --gpu 0 --target-gpu 1 --blocks 2048 --block-bytes ${SIZES:-4096,16384,65536} --iters 20 --reps 5 2>&1 | tail -n 7
    echo "rc=$?"
    if [ "$round" -le "${KV_ROUNDS:-2}" ]; then
      echo "== round $round $v: kv_bench --model 8b --blocks 2048 --tp 2 --iters 10"
      timeout 120 $B/kv_bench$s --model 8b --blocks 2048 --tp 2 --iters 10 2>&1 | tail -n 9
      echo "rc=$?"
    fi
  done
done
