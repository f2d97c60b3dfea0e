#!/usr/bin/env bash
# nvidia-h200 (one H200, 16-core host), device tool, one call. Issue 37: the scale bench's make
# and post of NIXL-shaped flat lists (one region per side, 4 or 32 layers, the same shuffled ids
# in every layer, 16 KiB blocks) through CUDA_IPC and NULL, before (scale.before: 80198c4) and
# after (the request-cost change, 5059130's code), hot and with the caches evicted before each
# step (--cold). Then storage.md's example with the KV blocks in GPU memory, three runs.
set -u
P=.carry/p6
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
for c in "" --cold; do for layers in 4 32; do for which in scale.before scale; do
  echo "== $which --backend NULL,CUDA_IPC --order layers --regions 1 --layers $layers --descs 8192,16384 --block 16384 --rounds 3 --iters 40 $c"
  timeout 60 $P/$which --backend NULL,CUDA_IPC --order layers --regions 1 --layers $layers --descs 8192,16384 --block 16384 --rounds 3 --iters 40 $c 2>&1 | grep -E '^#.*ns per|descs|^ +[0-9]+ ' | grep -v ratio
done; done; done
cd /tmp
for i in 1 2 3; do
  echo "== run $i: kv_offload --device cuda --no-s3 --blocks 256 --block-kib 1024"
  timeout 60 "$OLDPWD/$P/kv_offload" --device cuda --no-s3 --blocks 256 --block-kib 1024 2>&1 | grep -v '^\s*$' | tail -n 14
done
