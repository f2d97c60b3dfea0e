#!/usr/bin/env bash
# nvidia-h200 (one H200, 16-core host), device tool; the second and third calls after run.sh
# (whose call ran out of time at the poll bench): issue 33's poll bench (every path) with
# `poll`, issue 38's adapter bench (the nixl-sys drop-in against nixl-rs's own API) with
# `adapter`.
set -u
B=.carry/pp
export NIXL_UCX_HOME="$PWD/.carry/ucx" LD_LIBRARY_PATH="$PWD/.carry/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULES="^ib,rdmacm"
echo "== $(date -u +%FT%TZ) $(nproc) CPUs"
if [ "${1:-}" = poll ]; then
echo "== poll --bench (every path)"
timeout 560 $B/poll --bench 2>&1 | tail -n 20
echo "rc=$?"
fi
if [ "${1:-}" = adapter ]; then
for md in nixl native; do
  for shape in "64 65536" "1024 4096" "16 1048576"; do
    set -- $shape
    echo "== adapter NIXL_RS_METADATA=$md --blocks $1 --block-bytes $2 --rounds 40"
    if [ $md = native ]; then export NIXL_RS_METADATA=native; else unset NIXL_RS_METADATA; fi
    timeout 120 $B/adapter --blocks $1 --block-bytes $2 --rounds 40 2>&1 | tail -n 14
    echo "rc=$?"
  done
done
fi
