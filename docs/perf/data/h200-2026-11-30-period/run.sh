#!/usr/bin/env bash
# nvidia-h200 (one H200, 16-core host), device tool, one call. Issue 37: the main job before
# (disagg_kv.before: the commit before one-region pools split into layers by the ids' period)
# and after (disagg_kv), interleaved, beside the paged benchmark; two processes on GPU 0,
# every byte verified by the example (log main.log). The poll and adapter benches: run-2.sh.
set -u
B=.carry/pp
export NIXL_UCX_HOME="$PWD/.carry/ucx" LD_LIBRARY_PATH="$PWD/.carry/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
for round in 1 2; do
  for shape in "4 4096 2048" "32 512 256"; do
    set -- $shape
    for bb in 16384 65536; do
      for op in read write; do
        for which in disagg_kv.before disagg_kv; do
          echo "== round $round: $which --device cuda --gpus 0,0 --op $op --block-bytes $bb --blocks $2 --blocks-per-request $3 --requests 16 --layers $1"
          timeout 120 $B/$which --device cuda --gpus 0,0 --op $op --requests 16 --layers $1 --blocks $2 --blocks-per-request $3 --block-bytes $bb 2>&1 | tail -n 25
          echo "rc=$?"
        done
      done
    done
  done
done
echo "== paged_bench --gpu 0 --target-gpu 0 --blocks 2048 --block-bytes 16384,65536"
timeout 240 $B/paged_bench --gpu 0 --target-gpu 0 --blocks 2048 --block-bytes 16384,65536 --iters 20 --reps 5 --json "$OUT/paged.jsonl" 2>&1 | tail -n 30
echo "rc=$?"
cat "$OUT/paged.jsonl" 2>/dev/null
