#!/usr/bin/env bash
# nvidia-h200 machine, device tool, one call; carry [".carry/sc"]. Issue 37: the per-request
# split (ns per descriptor) on CUDA_IPC and NULL at 1, 128, 1,024 and 16,384 descriptors, before
# (scale.before: e7c2df8 with the scale bench's --ids option) and after (scale.after: 09f4db3,
# built as 3cfb5e2), interleaved: random pairs over 1,280 regions, and one region per side of 4
# layers with the main job's ids (--ids engine). Binaries built on the dev VM, stripped.
set -u
S=.carry/sc
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
for v in before after before after; do
  echo "== $v: scale --backend NULL,CUDA_IPC --descs 128,1024,16384 --regions 1 --layers 4 --ids engine --block 16384 --rounds 3 --order layers"
  timeout 60 $S/scale.$v --backend NULL,CUDA_IPC --descs 128,1024,16384 --regions 1 --layers 4 --ids engine --block 16384 --rounds 3 --order layers 2>&1 | grep -v "^\[" | grep -v "descriptors: "
done
for v in before after; do
  echo "== $v: scale --backend CUDA_IPC --descs 1,128,1024,16384 --regions 1280 --block 16384 --rounds 3 --order shuffled"
  timeout 60 $S/scale.$v --backend CUDA_IPC --descs 1,128,1024,16384 --regions 1280 --block 16384 --rounds 3 --order shuffled 2>&1 | grep -v "^\[" | grep -v "descriptors: "
done
