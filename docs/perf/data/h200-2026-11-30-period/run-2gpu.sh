#!/usr/bin/env bash
# nvidia-h200-x2 (two H200, NVLink), device tool, one call. Issue 37 on two GPUs: the main job
# (prefill on GPU 0, decode on GPU 1) before (disagg_kv.before: the commit before one-region
# pools split into layers by the ids' period) and after (disagg_kv), interleaved, one round,
# at 4 layers x 2,048 and 32 layers x 256 blocks per request, beside the paged benchmark in
# the initiators' directions (decode GPU 1 reads GPU 0; prefill GPU 0 writes GPU 1); every
# byte verified by the example. Log: main-2gpu.log.
set -u
B=.carry/pp
export NIXL_UCX_HOME="$PWD/.carry/ucx" LD_LIBRARY_PATH="$PWD/.carry/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nvidia-smi -L | wc -l) GPUs; $(nproc) CPUs"
for round in 1; do
  for shape in "4 4096 2048" "32 512 256"; do
    set -- $shape
    for bb in 16384 65536; do
      for op in read write; do
        for which in disagg_kv.before disagg_kv; do
          echo "== round $round: $which --device cuda --gpus 0,1 --op $op --block-bytes $bb --blocks $2 --blocks-per-request $3 --requests 16 --layers $1"
          timeout 120 $B/$which --device cuda --gpus 0,1 --op $op --requests 16 --layers $1 --blocks $2 --blocks-per-request $3 --block-bytes $bb 2>&1 | tail -n 25
          echo "rc=$?"
        done
      done
    done
  done
done
for dir in "1 0" "0 1"; do
  set -- $dir
  echo "== paged_bench --gpu $1 --target-gpu $2 --blocks 2048 --block-bytes 16384,65536"
  timeout 240 $B/paged_bench --gpu $1 --target-gpu $2 --blocks 2048 --block-bytes 16384,65536 --iters 20 --reps 5 2>&1 | tail -n 30
  echo "rc=$?"
done
