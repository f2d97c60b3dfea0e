#!/usr/bin/env bash
# The main job's 16 KiB READ gap: which process runs the kernel (child / sibling) and the
# copy kernel's load and store hints. One H200, two processes on GPU 0.
set -u
E=.carry/exp
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader | head -n1); $(nproc) CPUs"
M="--device cuda --gpus 0,0 --layers 4 --blocks 16384 --blocks-per-request 2048 --block-bytes 16384 --burst 8 --requests 24 --warmup 1 --post-after-make"
f() { grep -E "posted back|make median|verified|rror|panick" ; }
for round in 1 2; do
  for op in read write; do
    echo "== round $round: child: disagg_kv $M --op $op"
    timeout 90 $E/disagg_kv $M --op $op 2>&1 | f
    echo "== round $round: sibling: disagg_kv $M --op $op --decode external"
    timeout 90 $E/sib.sh $E/disagg_kv $M --op $op 2>&1 | f
  done
  for shape in load=plain store=wb load=plain,store=wb; do
    echo "== round $round: child: disagg_kv $M --op read --kernel-shape $shape"
    timeout 90 $E/disagg_kv $M --op read --kernel-shape $shape 2>&1 | f
  done
  echo "== round $round: paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384"
  timeout 120 $E/paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384 2>&1 | grep -E "GB/s|rror"
done
echo "== end $(date -u +%FT%TZ)"
