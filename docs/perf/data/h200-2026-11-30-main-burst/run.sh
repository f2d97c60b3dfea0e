#!/usr/bin/env bash
# nvidia-h200 (one H200, 16-core host), device tool, one call. Issue 37 item 2: the main job
# (disagg_kv, two processes on GPU 0, CUDA_IPC, every byte verified) one request at a time
# (--burst 1) and in bursts of 8 requests posted back to back (--burst 8, disjoint blocks),
# beside the paged benchmark (one prepared request reposted) at 2,048 and 8,192 blocks per
# request, 16 and 64 KiB blocks, READ and WRITE, two interleaved rounds.
set -u
P=.carry/p7
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | head -n1); $(nproc) CPUs"
{
for round in 1 2; do
  echo "== round $round: paged_bench --gpu 0 --target-gpu 0 --blocks 2048,8192 --block-bytes 16384,65536 --iters 20 --reps 5"
  for blocks in 2048 8192; do
    timeout 120 $P/paged_bench --gpu 0 --target-gpu 0 --blocks $blocks --block-bytes 16384,65536 --iters 20 --reps 5 2>&1 | grep -E 'GB/s|rror' | cut -c1-140 | sed "s/^/blocks $blocks: /"
  done
  for bb in 16384 65536; do
    for op in read write; do
      for burst in 1 8; do
        echo "== round $round: disagg_kv --device cuda --gpus 0,0 --op $op --block-bytes $bb --layers 4 --blocks 16384 --blocks-per-request 2048 --requests 32 --burst $burst"
        timeout 150 $P/disagg_kv --device cuda --gpus 0,0 --op $op --requests 32 --burst $burst --layers 4 --blocks 16384 --blocks-per-request 2048 --block-bytes $bb 2>&1 | grep -E 'per request|bursts of|post to done|verified|rror|mismatch'
        echo "rc=$?"
      done
    done
  done
done
} > "$OUT/main-burst.log" 2>&1
grep -E '^==|GB/s|rc=' "$OUT/main-burst.log" | cut -c1-230
