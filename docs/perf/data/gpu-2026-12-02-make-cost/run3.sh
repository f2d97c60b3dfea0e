#!/usr/bin/env bash
# device tool, one call (it ran on nvidia-h100-x1: one H100); carry [".carry/ab"]. Issue 37: the
# main job's 16 KiB bursts with decode checking a WRITE burst once its last request landed
# (the harness fix: before it checked each request as its notification came, a 128 MiB
# GPU-to-host copy beside prefill's writes on the same GPU). before2 = 049e4d0's library with
# the fixed harness, after2 = db1ca0e's with it, after = db1ca0e with the old harness;
# for READ also after2 less one change each: nolifo (the staging pool as before), oldruns
# (checked_runs as before).
# Two rounds interleaved, paged_bench per round; then the scale bench's make before/after.
set -u
A=.carry/ab
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
M="--device cuda --gpus 0,0 --layers 4 --blocks-per-request 2048 --warmup 1 --blocks 16384 --burst 8 --requests 64 --block-bytes 16384"
for round in 1 2; do
  for run in "write before2" "write after2" "write after" "read before2" "read after2" "read nolifo" "read oldruns"; do
    set -- $run
    echo "== round $round: $2 disagg_kv $M --op $1"
    timeout 100 $A/$2/disagg_kv $M --op $1 2>&1 | grep -E "per request|bursts of|verified|rror|panick"
  done
  echo "== round $round: paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384 --reps 3"
  timeout 60 $A/after/paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384 --reps 3 2>&1 | grep -E "GB/s|rror"
done
f() { grep -v "^\[" | grep -v "descriptors: "; }
for v in before after; do
  echo "== $v: scale --backend NULL,CUDA_IPC --descs 128,1024,16384 --regions 1280 --block 16384 --rounds 5 --order shuffled"
  timeout 40 $A/$v/scale --backend NULL,CUDA_IPC --descs 128,1024,16384 --regions 1280 --block 16384 --rounds 5 --order shuffled 2>&1 | f
  echo "== $v: scale --backend NULL,CUDA_IPC --descs 8192 --regions 1 --layers 4 --order layers --ids engine --block 16384 --rounds 5 --cold"
  timeout 40 $A/$v/scale --backend NULL,CUDA_IPC --descs 8192 --regions 1 --layers 4 --order layers --ids engine --block 16384 --rounds 5 --cold 2>&1 | f
done
echo "== end $(date -u +%FT%TZ)"
