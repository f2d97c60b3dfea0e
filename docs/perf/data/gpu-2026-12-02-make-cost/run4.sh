#!/usr/bin/env bash
# device tool, one call; carry [".carry/ab"]. Issue 37: the block kernel's table written into
# the pinned staging buffer with streaming (non-temporal) stores (7971aa2) or plain ones
# (0fc20ca). (1) The nixl-mem GPU test binaries of 7971aa2 (after3). (2) The phase profile
# (profile.patch of ../h200-2026-12-02-request-cost, not committed; NIXL_PROF=1) of both,
# interleaved, three rounds, READ and WRITE, bursts of 8 (64 requests, the first burst left
# out); the phase "staging take -> write table" is the table's write.
set -u
A=.carry/ab
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "== after3 $(head -1 $A/after3/commit)"
export NIXL_REQUIRE_DEPS=1 NIXL_ALLOW_SKIP="nvidia-fs,s3,etcd,netns,nixl,efa,fi-hmem,rocm-gpu,libfabric,ucx,cuda-ucx,io-uring,multi-gpu"
for t in $A/after3/t/*; do
  timeout 100 $t > /tmp/t.log 2>&1
  echo "== tests $(basename $t): rc=$? $(grep -a -E '^test result:' /tmp/t.log | tail -n1)"
  grep -a -E '^skipping|SKIPPED|FAILED|panicked' /tmp/t.log | head -20
done
unset NIXL_REQUIRE_DEPS NIXL_ALLOW_SKIP
M="--device cuda --gpus 0,0 --layers 4 --blocks-per-request 2048 --warmup 1 --blocks 16384 --burst 8 --requests 64 --block-bytes 16384"
for round in 1 2 3; do
  for op in read write; do
    for v in prof-before prof-after; do
      echo "== round $round: $v NIXL_PROF=1 disagg_kv $M --op $op"
      NIXL_PROF=1 timeout 100 $A/$v/disagg_kv $M --op $op 2>&1 | grep -E "staging take|write table ->|make median|bursts of|verified|rror|panick"
    done
  done
done
echo "== end $(date -u +%FT%TZ)"
