#!/usr/bin/env bash
# nvidia-h200 machine (one H200), device tool, one call; carry [".carry/ab"]; the fourth call.
# after = the committed proof reworked (each list's footprint made when it is prepared: its
# descriptors' disjointness by a pass in address order or one mark per block on its regions'
# grid, its regions' bounds per device; a request only reads them) + the period search's
# compares OR-ing differences (vectorized without SSE4.1). (1) The GPU test binaries of the
# after build. (2) The scale bench before / after interleaved, three rounds each: random pairs
# over 1,280 regions (NULL and CUDA_IPC), and the main job's ids (one region a side, 4 layers)
# on CUDA_IPC. (3) paged_bench after (two processes, shuffled remote slots, bytes verified).
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
for v in before after before after before after; do
  echo "== $v: scale --backend NULL,CUDA_IPC --descs 128,1024,16384 --regions 1280 --block 16384 --rounds 3 --order shuffled"
  timeout 90 $A/$v/scale --backend NULL,CUDA_IPC --descs 128,1024,16384 --regions 1280 --block 16384 --rounds 3 --order shuffled 2>&1 | grep -v "^\[" | grep -v "descriptors: "
done
for v in before after before after before after; do
  echo "== $v: scale --backend CUDA_IPC --descs 128,1024,16384 --regions 1 --layers 4 --ids engine --block 16384 --rounds 3 --order layers"
  timeout 60 $A/$v/scale --backend CUDA_IPC --descs 128,1024,16384 --regions 1 --layers 4 --ids engine --block 16384 --rounds 3 --order layers 2>&1 | grep -v "^\[" | grep -v "descriptors: "
done
echo "== after: paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536"
timeout 100 $A/after/paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536 --iters 20 --reps 3 2>&1 | grep -E "B x|rror"
echo "rc=${PIPESTATUS[0]}"
