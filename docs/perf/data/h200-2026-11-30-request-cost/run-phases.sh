#!/usr/bin/env bash
# nvidia-h200 (one H200, 16-core host), device tool, one call. Issue 37: per-request cost of the
# main job before (disagg_kv.before: commit 80198c4) and after (this change: the wake queued by an
# awaiting future, one event record less at make, period found without a pass of its own, no
# division per run, one allocation for the runs), interleaved, beside the paged benchmark; both
# binaries carry a scratch phase timer (NIXL_PROF=1, not committed). Then nixl-mem's GPU tests.
set -u
P=.carry/p3
T=.carry/p3t
export NIXL_UCX_HOME="$PWD/.carry/ucx" LD_LIBRARY_PATH="$PWD/.carry/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
{
for round in 1 2; do
  for shape in "4 4096 2048" "32 512 256"; do
    set -- $shape
    for bb in 16384 65536; do
      for op in read write; do
        for which in disagg_kv.before disagg_kv; do
          echo "== round $round: $which --device cuda --gpus 0,0 --op $op --block-bytes $bb --blocks $2 --blocks-per-request $3 --requests 32 --layers $1"
          if [ $round = 1 ] && [ $bb = 16384 ]; then export NIXL_PROF=1; else unset NIXL_PROF; fi
          timeout 120 $P/$which --device cuda --gpus 0,0 --op $op --requests 32 --layers $1 --blocks $2 --blocks-per-request $3 --block-bytes $bb 2>&1 | grep -E 'per request|PROF|rror|mismatch' 
          echo "rc=$?"
        done
      done
    done
  done
done
unset NIXL_PROF
echo "== paged_bench --gpu 0 --target-gpu 0 --blocks 2048 --block-bytes 16384,65536"
timeout 240 $P/paged_bench --gpu 0 --target-gpu 0 --blocks 2048 --block-bytes 16384,65536 --iters 20 --reps 5 2>&1 | tail -n 4
for c in "" --cold; do for which in scale.before scale; do
  echo "== $which CUDA_IPC 4x2048 and 32x256 $c"
  timeout 100 $P/$which --backend NULL,CUDA_IPC --order layers --regions 1 --layers 4 --descs 8192 --block 16384 --rounds 3 --iters 40 $c 2>&1 | grep -A1 descs | grep -v -- --
  timeout 100 $P/$which --backend CUDA_IPC --order layers --regions 1 --layers 32 --descs 8192 --block 16384 --rounds 3 --iters 40 $c 2>&1 | grep -A1 descs | grep -v -- --
done; done
} > "$OUT/main.log" 2>&1
grep -E '^==|per request' "$OUT/main.log" | tail -n 80
echo "== tests"
for t in nixl_mem gpu gpu_agent gpu_blocks async_gpu arrival_gpu; do
  timeout 150 $T/$t --test-threads 4 --nocapture > "$OUT/test-$t.log" 2>&1; echo "$t rc=$? $(grep -E '^test result' "$OUT/test-$t.log" | tail -n 1)"
done
grep -h 'awaited in' "$OUT"/test-async_gpu.log
