#!/usr/bin/env bash
# The main job's 16 KiB READ gap against the pool's size (TLB reach through the IPC mapping?):
# READ and WRITE posted back to back with pools of 256 MiB, 512 MiB and 1 GiB, requests of
# 4 x 2,048 descriptors; paged_bench with a 1 GiB pool span.
set -u
E=.carry/exp
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
which nsys ncu 2>&1 | head -3; ls /usr/local/cuda/bin 2>/dev/null | tr '\n' ' '; echo
f() { grep -E "posted back|verified|rror|panick" ; }
for round in 1 2; do
  for shape in "--blocks 4096 --burst 2 --requests 12" "--blocks 8192 --burst 4 --requests 16" "--blocks 16384 --burst 8 --requests 24" "--blocks 32768 --burst 8 --requests 24"; do
    M="--device cuda --gpus 0,0 --layers 4 --blocks-per-request 2048 --block-bytes 16384 --warmup 1 --post-after-make $shape"
    for op in read write; do
      echo "== round $round: disagg_kv $M --op $op"
      timeout 90 $E/disagg_kv $M --op $op 2>&1 | f
    done
  done
  for b in 8192 32768; do
    echo "== round $round: paged_bench --gpu 0 --target-gpu 0 --blocks $b --block-bytes 16384"
    timeout 120 $E/paged_bench --gpu 0 --target-gpu 0 --blocks $b --block-bytes 16384 2>&1 | grep -E "GB/s|rror"
  done
done
echo "== end $(date -u +%FT%TZ)"
