#!/usr/bin/env bash
# GPU machine: the UCX backend with VRAM (UCX 1.22 from the libucx-cu13 wheel, carried in
# .carry/ucx), the nixlbench CLI over UCX with VRAM, and the main job with KV pools in GPU
# memory over CUDA_IPC and over UCX. Prebuilt binaries in .carry/bin. Results to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/nixl-gpu-out}"; mkdir -p "$OUT"
B=.carry/bin
export NIXL_UCX_HOME="$PWD/.carry/ucx"
export LD_LIBRARY_PATH="$PWD/.carry/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
s="$OUT/ucx-summary.txt"; : > "$s"
say() { echo "$*" | tee -a "$s"; }
run() { local name=$1 t=$2; shift 2; if [ ! -x "$1" ]; then say "== $name: $1 missing (not built), skipped"; return; fi; say "== $name: $*"; timeout "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?; tail -n 25 "$OUT/$name.log" | tee -a "$s"; say "rc=$rc"; }
[ "${SKIP_UCX:-0}" = 1 ] || run ucx-vram 120 $B/ucx-vram --nocapture
for tls in "" "cuda_ipc,cuda_copy,tcp"; do
  tag=${tls:+-tls}
  args=(); [ -n "$tls" ] && args=(--tls "$tls")
  run nixlbench-vv-write$tag 120 $B/nixlbench --op WRITE --initiator-seg-type VRAM --target-seg-type VRAM --blocks 1048576,4194304 --batches 1024 --num-iter 10 --warmup-iter 2 "${args[@]}"
  run nixlbench-vv-read$tag 120 $B/nixlbench --op READ --initiator-seg-type VRAM --target-seg-type VRAM --blocks 1048576,4194304 --batches 1024 --num-iter 10 --warmup-iter 2 "${args[@]}"
done
run nixlbench-dv-write 120 $B/nixlbench --op WRITE --initiator-seg-type DRAM --target-seg-type VRAM --blocks 1048576 --batches 1024 --num-iter 5 --warmup-iter 1
run nixlbench-dv-read 120 $B/nixlbench --op READ --initiator-seg-type DRAM --target-seg-type VRAM --blocks 1048576 --batches 1024 --num-iter 5 --warmup-iter 1
run disagg-cuda-ipc-write 120 $B/disagg_kv --device cuda --op write --requests 16 --layers 8 --blocks 256 --block-bytes 1048576 --blocks-per-request 128
run disagg-cuda-ipc-read 120 $B/disagg_kv --device cuda --op read --requests 16 --layers 8 --blocks 256 --block-bytes 1048576 --blocks-per-request 128
run disagg-cuda-ucx-write 120 $B/disagg_kv --device cuda --backend ucx --op write --requests 8 --layers 8 --blocks 256 --block-bytes 1048576 --blocks-per-request 128
# GPUDirect Storage (cuFile from the CUDA toolkit, libcufile 1.15) and the POSIX path beside it.
[ "${SKIP_GDS:-0}" = 1 ] && exit 0
df -T . /tmp > "$OUT/df.txt" 2>&1
mkdir -p "$PWD/.gds-tmp/cufile-lib"
# cudarc loads libcufile as libcufile.so from the loader's path (see scripts/gpu/storage_run.sh).
CUFILE=$(ls /usr/local/cuda*/lib64/libcufile.so.0 2>/dev/null | head -1)
[ -n "$CUFILE" ] && ln -sf "$CUFILE" "$PWD/.gds-tmp/cufile-lib/libcufile.so"
GDS_TEST=$B/gds-test; [ -x "$GDS_TEST" ] || GDS_TEST=$B/storage-gds-test
LD_LIBRARY_PATH="$PWD/.gds-tmp/cufile-lib:$LD_LIBRARY_PATH" CUFILE_LOGFILE_PATH="$OUT/cufile.log" TMPDIR="$PWD/.gds-tmp" \
  run gds-tests 150 "$GDS_TEST" --nocapture --test-threads=1
