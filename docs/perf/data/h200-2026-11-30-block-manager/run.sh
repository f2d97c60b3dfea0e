#!/usr/bin/env bash
# nvidia-h200 (one H200), device tool, one call. Issue 38: the Dynamo-shaped block manager
# example on the nixl-sys drop-in with its device pool (GPU 0's memory registered by pointer
# through nixl-sys's API; host -> device -> host through CUDA_IPC), besides host -> disk ->
# host (POSIX) and the WRITE to a second process (UCX); every byte checked. Log: run.log.
set -u
export NIXL_UCX_HOME="$PWD/.carry/ucx" LD_LIBRARY_PATH="$PWD/.carry/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
for shape in "64 65536" "1024 16384"; do
  set -- $shape
  echo "== block_manager --blocks $1 --block-bytes $2"
  timeout 120 .carry/bm/block_manager --blocks $1 --block-bytes $2 2>&1 | tail -n 12
  echo "rc=$?"
done
