#!/usr/bin/env bash
# nvidia-h200, device tool, a second call: the paged benchmark alone, before (`.old`, 1a634f3)
# and after (731b023), ROUNDS rounds (default 4) with the order alternating (after first in odd rounds),
# since run.sh always ran the build before first. Carry [".carry/tp", ".carry/ucx"].
set -u
B=.carry/tp
export NIXL_UCX_HOME="$PWD/.carry/ucx" LD_LIBRARY_PATH="$PWD/.carry/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
for round in $(seq 1 ${ROUNDS:-4}); do
  order="new old"; [ $((round % 2)) = 0 ] && order="old new"
  for v in $order; do
    s=""; [ "$v" = old ] && s=.old
    echo "== round $round $v: paged_bench --gpu 0 --target-gpu 0 --blocks 2048 --block-bytes 4096,16384,65536"
    timeout 120 $B/paged_bench$s --gpu 0 --target-gpu 0 --blocks 2048 --block-bytes 4096,16384,65536 --iters 20 --reps 5 2>&1 | tail -n 7
    echo "rc=$?"
  done
done
