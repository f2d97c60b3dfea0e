#!/usr/bin/env bash
# The 2-core dev VM. Issue 37: the per-request split (prep, make, post, done, release = drop;
# ns per descriptor, best of 3 rounds) at 1, 128, 1,024 and 16,384 descriptors, before
# (scale.before: e7c2df8 with this folder's `--ids` option of the scale bench) and after
# (scale.final), interleaved, two passes: NIXL users' random pairs over 1,280 regions
# (`--order shuffled`), and one region per side of 4 layers with the main job's ids
# (`--order layers --ids engine`: consecutive source blocks, scattered destination slots).
# Binaries: `cargo build --release -p nixl-bench --bench scale` at each commit.
set -u
B=${B:-/work}
export UCX_MODULES='^ib,rdmacm'
for round in 1 2; do
  for v in before final; do
    echo "== round $round $v: scale --backend NULL,UCX --descs 1,128,1024,16384 --regions 1280 --block 16384 --rounds 3 --order shuffled"
    timeout 600 $B/scale.$v --backend NULL,UCX --descs 1,128,1024,16384 --regions 1280 --block 16384 --rounds 3 --order shuffled 2>&1 | grep -v "^\[" | grep -v "descriptors: "
    echo "== round $round $v: scale --backend NULL,UCX --descs 128,1024,16384 --regions 1 --layers 4 --ids engine --block 16384 --rounds 3 --order layers"
    timeout 600 $B/scale.$v --backend NULL,UCX --descs 128,1024,16384 --regions 1 --layers 4 --ids engine --block 16384 --rounds 3 --order layers 2>&1 | grep -v "^\[" | grep -v "descriptors: "
  done
done
