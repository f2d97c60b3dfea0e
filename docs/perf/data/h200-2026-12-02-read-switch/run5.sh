#!/usr/bin/env bash
# prefill's sources filled block by block (old: 8,192 small host-to-GPU copies per request)
# or one copy per run of consecutive blocks (runs: at most 8 MiB each), READ and WRITE posted
# back to back; paged_bench in the same call. First the GPU test binaries of the runs build
# (CUDA_IPC's remote lookup made one path: `Reached` for the segment and block paths).
set -u
E=.carry/exp
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
export NIXL_REQUIRE_DEPS=1 NIXL_ALLOW_SKIP="nvidia-fs,s3,etcd,netns,nixl,efa,fi-hmem,rocm-gpu,libfabric,ucx,cuda-ucx,io-uring,multi-gpu"
for t in $E/t/*; do
  timeout 100 $t > /tmp/t.log 2>&1
  echo "== tests $(basename $t): rc=$? $(grep -a -E '^test result:' /tmp/t.log | tail -n1)"
  grep -a -E '^skipping|SKIPPED|FAILED|panicked' /tmp/t.log | head -20
done
unset NIXL_REQUIRE_DEPS NIXL_ALLOW_SKIP
f() { grep -E "posted back|make median|verified|rror|panick" ; }
for round in 1 2; do
  shapes=("--block-bytes 16384 --blocks 16384 --burst 8 --requests 24")
  [ $round = 1 ] && shapes+=("--block-bytes 16384 --blocks 4096 --burst 2 --requests 12" "--block-bytes 65536 --blocks 16384 --burst 8 --requests 24")
  for shape in "${shapes[@]}"; do
    M="--device cuda --gpus 0,0 --layers 4 --blocks-per-request 2048 --warmup 1 --post-after-make $shape"
    for bin in disagg_kv_touch disagg_kv_runs; do
      for op in read write; do
        echo "== round $round: $bin $M --op $op"
        timeout 120 $E/$bin $M --op $op 2>&1 | f
      done
    done
  done
  D="--device cuda --gpus 0,0 --layers 4 --blocks-per-request 2048 --warmup 1 --block-bytes 16384 --blocks 16384 --burst 8 --requests 24"
  for bin in disagg_kv_touch disagg_kv_runs; do
    for op in read write; do
      echo "== round $round: $bin $D --op $op (makes overlapping the copies)"
      timeout 120 $E/$bin $D --op $op 2>&1 | grep -E "bursts of|make median|verified|rror|panick"
    done
  done
  echo "== round $round: paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536 --reps 3"
  timeout 120 $E/paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536 --reps 3 2>&1 | grep -E "GB/s|rror"
done
echo "== end $(date -u +%FT%TZ)"
