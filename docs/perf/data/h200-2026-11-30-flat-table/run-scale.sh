#!/usr/bin/env bash
# nvidia-h200 machine (one H200, 16-core host), device tool, one call. Issue 37: per-step
# cost per descriptor of make_prepped_xfer over flat lists, in NIXL users' shape (`--order
# layers`: a block-table request) and shuffled pairs (`--order shuffled`: the descriptor
# path), 4 regions (layers) per side of 16 KiB blocks, NULL (nixl-core alone), UCX and
# CUDA_IPC, one process (the scale bench's two agents).
set -u
B=.carry/ft
export NIXL_UCX_HOME="$PWD/.carry/ucx" LD_LIBRARY_PATH="$PWD/.carry/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
for round in 1 2; do
  for order in layers shuffled; do
    echo "== round $round: scale --backend NULL,UCX,CUDA_IPC --descs 128,1024,8192,16384 --regions 4 --block 16384 --rounds 3 --order $order"
    timeout 240 $B/scale --backend NULL,UCX,CUDA_IPC --descs 128,1024,8192,16384 --regions 4 --block 16384 --rounds 3 --order $order 2>&1 | grep -v "^\[" 
    echo "rc=$?"
  done
done
command -v perf || echo "no perf on this machine"
