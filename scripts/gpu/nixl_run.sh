#!/usr/bin/env bash
# GPU machine: VRAM WRITE between a stock NIXL agent (nixl-cu13 1.5.1 for Python 3.12, carried
# slim in .carry/nixl312 by scripts/gpu/nixl_build.sh) and a nixl-rs agent on one GPU over UCX
# cuda_ipc, every byte verified, with NIXL -> NIXL throughput in the same run; then the same on
# host memory for reference. Results to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/nixl-gpu-out}"; mkdir -p "$OUT"
N="$PWD/.carry/nixl312"
export NIXL_PYTHONPATH="$N"
export NIXL_WHEEL_UCX="$(ls "$N"/nixl_cu1*.libs/libucp-*.so* | head -n1)"
export NIXL_PEER_SCRIPT="$PWD/nixl-backend-ucx/tests/nixl_peer.py"
s="$OUT/nixl-summary.txt"; : > "$s"
say() { echo "$*" | tee -a "$s"; }
say "== host: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n1); python $(python3 -V 2>&1)"
say "== imports: $(PYTHONPATH="$N" python3 -c 'import numpy, torch, nixl_cu13._api; print("numpy", numpy.__version__, "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -n1)"
for t in vram_write_beside_nixl:360 dram_write_beside_nixl:150; do
    limit=${t#*:}; t=${t%:*}
    say "== $t"
    timeout "$limit" .carry/nixl-bin/nixl-interop-bench "$t" --exact --nocapture > "$OUT/$t.log" 2>&1
    rc=$?
    grep -E "GB/s|every byte|path|SKIPPED|panicked|test result" "$OUT/$t.log" | tee -a "$s"
    say "rc=$rc"
done
