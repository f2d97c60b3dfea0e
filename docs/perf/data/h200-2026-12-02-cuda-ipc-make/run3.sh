#!/usr/bin/env bash
# nvidia-h200 machine (one H200), device tool, one call; carry [".carry/ab"]; the third call (after:
# also each remote region's mapping looked up once per request, not per segment). Issue 37: the
# agent's proof that a request's destinations are disjoint (XferSpec::dst_disjoint,
# ends_apart) spares CUDA_IPC its per-request proof. (1) The GPU test binaries of the after
# build (nixl-mem lib, gpu, gpu_agent, gpu_blocks), a skip failing them. (2) The scale bench's
# per-step cost before (.carry/ab/before) and after, interleaved: random pairs over 1,280
# regions (the issue's shape) on CUDA_IPC and NULL. (3) paged_bench (two processes, the
# segment path over shuffled remote slots, every byte verified) after.
set -u
A=.carry/ab
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
echo "== before $(cat $A/before/commit), after $(cat $A/after/commit)"
export NIXL_REQUIRE_DEPS=1 NIXL_ALLOW_SKIP="nvidia-fs,s3,etcd,netns,nixl,efa,fi-hmem,rocm-gpu,libfabric,ucx,cuda-ucx,io-uring,multi-gpu"
for t in nixl-mem-lib nixl-mem-gpu nixl-mem-gpu-agent test-gpu_blocks; do
  timeout 120 $A/after/$t > /tmp/$t.log 2>&1
  echo "== tests $t: rc=$? $(grep -a -E '^test result:' /tmp/$t.log | tail -n1)"
  grep -a -E '^skipping|SKIPPED|FAILED|panicked' /tmp/$t.log | head -20
done
unset NIXL_REQUIRE_DEPS NIXL_ALLOW_SKIP
for v in before after before after; do
  echo "== $v: scale --backend NULL,CUDA_IPC --descs 1,128,1024,16384 --regions 1280 --block 16384 --rounds 3 --order shuffled"
  timeout 90 $A/$v/scale --backend NULL,CUDA_IPC --descs 1,128,1024,16384 --regions 1280 --block 16384 --rounds 3 --order shuffled 2>&1 | grep -v "^\[" | grep -v "descriptors: "
done
echo "== after: paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536"
timeout 100 $A/after/paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536 --iters 20 --reps 3 2>&1 | grep -E "B x|rror"
echo "rc=${PIPESTATUS[0]}"
