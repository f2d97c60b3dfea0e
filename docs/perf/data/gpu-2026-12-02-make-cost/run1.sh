#!/usr/bin/env bash
# nvidia-h200 machine (one H200), device tool, one call; carry [".carry/ab"]. Issue 37: the
# main job's default 16 KiB bursts before (049e4d0, stop 58) and after (db1ca0e: destination
# check in one pass, 32-byte prepared entries, runs kept in registers, the path note written
# when asked, CUDA_IPC's staging taken LIFO). (1) The after build's nixl-mem GPU test binaries.
# (2) disagg_kv bursts of 8 (64 requests, the first burst left out: 7 measured), 16 KiB READ and
# WRITE, before/after interleaved, two rounds, each round with paged_bench; 64 KiB once.
# (3) The phase profile of the after code (profile.patch of h200-2026-12-02-request-cost).
set -u
A=.carry/ab
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "== before $(head -1 $A/before/commit), after $(head -1 $A/after/commit)"
export NIXL_REQUIRE_DEPS=1 NIXL_ALLOW_SKIP="nvidia-fs,s3,etcd,netns,nixl,efa,fi-hmem,rocm-gpu,libfabric,ucx,cuda-ucx,io-uring,multi-gpu"
for t in $A/after/t/*; do
  timeout 100 $t > /tmp/t.log 2>&1
  echo "== tests $(basename $t): rc=$? $(grep -a -E '^test result:' /tmp/t.log | tail -n1)"
  grep -a -E '^skipping|SKIPPED|FAILED|panicked' /tmp/t.log | head -20
done
unset NIXL_REQUIRE_DEPS NIXL_ALLOW_SKIP
M="--device cuda --gpus 0,0 --layers 4 --blocks-per-request 2048 --warmup 1 --blocks 16384 --burst 8 --requests 64"
for round in 1 2; do
  sizes="16384"; [ $round = 1 ] && sizes="16384 65536"
  for bb in $sizes; do
    for op in read write; do
      for v in before after; do
        echo "== round $round: $v disagg_kv $M --block-bytes $bb --op $op"
        timeout 120 $A/$v/disagg_kv $M --block-bytes $bb --op $op 2>&1 | grep -E "per request|bursts of|verified|rror|panick"
      done
    done
  done
  echo "== round $round: paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536 --reps 3"
  timeout 120 $A/after/paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536 --reps 3 2>&1 | grep -E "GB/s|rror"
done
for op in write read; do
  echo "== NIXL_PROF=1 prof disagg_kv $M --block-bytes 16384 --op $op"
  NIXL_PROF=1 timeout 120 $A/prof/disagg_kv $M --block-bytes 16384 --op $op 2>&1 | grep -E "PROF|per request|bursts of|verified|rror|panick" | sort -k5
done
echo "== end $(date -u +%FT%TZ)"
