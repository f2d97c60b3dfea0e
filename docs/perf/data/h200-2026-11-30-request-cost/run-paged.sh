#!/usr/bin/env bash
# nvidia-h200 (one H200, 16-core host), device tool, one call. Issue 37: the paged benchmark
# before (paged_bench.before, commit 80198c4: a host function queued on the stream by every
# post) and after (a93fa43 + --idle-ms: queued only for an awaiting future), interleaved, 16 and
# 64 KiB; then the same with the GPU idle 50 ms before each post (after only); then the async
# completion test before and after, three times each (its wake-up and poll count).
set -u
P=.carry/p5
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
for round in 1 2; do
  for which in paged_bench.before paged_bench; do
    echo "== round $round: $which --gpu 0 --target-gpu 0 --blocks 2048 --block-bytes 16384,65536 --iters 20 --reps 5"
    timeout 100 $P/$which --gpu 0 --target-gpu 0 --blocks 2048 --block-bytes 16384,65536 --iters 20 --reps 5 2>&1 | grep -E 'GB/s|rror' | cut -c1-120
  done
done
for which in paged_bench.before paged_bench; do
  echo "== $which --gpu 0 --target-gpu 0 --blocks 2048 --block-bytes 16384 --iters 10 --reps 3 --idle-ms 50 (before: no such option, back to back)"
  timeout 100 $P/$which --gpu 0 --target-gpu 0 --blocks 2048 --block-bytes 16384 --iters 10 --reps 3 --idle-ms 50 2>&1 | grep -E 'GB/s|rror|paged_bench' | cut -c1-160
done
for i in 1 2 3; do for which in async_gpu.before async_gpu; do
  echo "== $which cuda_ipc_future_is_woken_after_the_copies, run $i"
  timeout 60 $P/$which cuda_ipc_future_is_woken_after_the_copies --nocapture 2>&1 | grep -E 'awaited|test result' | cut -c1-130
done; done
