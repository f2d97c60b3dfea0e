#!/usr/bin/env bash
# nvidia-h200 machine's 16-core host, device tool, one call. Issue 37: the main job in host
# memory over UCX (two processes; direct CMA, the default between processes of one host),
# before (disagg_kv.before) and after flat lists in NIXL's shape became block-table
# requests (disagg_kv), interleaved; make, post and post to done per request.
set -u
B=.carry/ft
export NIXL_UCX_HOME="$PWD/.carry/ucx" LD_LIBRARY_PATH="$PWD/.carry/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) host memory, UCX; $(nproc) CPUs"
for round in 1 2; do
  for n in 128 1024 2048; do
    for op in read write; do
      for which in disagg_kv.before disagg_kv; do
        echo "== round $round: $which --op $op --block-bytes 16384 --blocks 4096 --blocks-per-request $n --requests 32 --layers 4"
        timeout 120 $B/$which --op $op --requests 32 --layers 4 --blocks 4096 --blocks-per-request $n --block-bytes 16384 2>&1 | grep -E "path|per request|error|Error"
        echo "rc=$?"
      done
    done
  done
done
