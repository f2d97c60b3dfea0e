#!/usr/bin/env bash
# GPU suite `ucx`: `scripts/gpu.sh ucx build` here, `scripts/gpu.sh ucx run` on
# the GPU machine.
#
# build:
# Builds HERE (a machine with the Rust toolchain; no CUDA, cuFile or GPU needed: libcuda and
# libcufile are loaded at run time) everything scripts/gpu.sh all run runs on the GPU machine,
# into .carry/ (carry `.carry`; the script prints its size, which must stay under 64 MiB):
#   scripts/gpu.sh one-gpu build          nixl-mem: lib unit tests, tests/gpu*.rs, the gpu_bench example
#   scripts/gpu.sh storage build  nixl-backend-gds: tests/vram_file.rs, tests/gds.rs, the bench
#   ucx-vram                      nixl-backend-ucx: tests/vram.rs
#   .carry/ucx/lib                UCX's shared libraries (stripped), from $NIXL_UCX_HOME or
#                                 scripts/deps/ucx.sh's install, for the CUDA-aware UCX test
# One target directory for all of them (CARGO_TARGET_DIR, default /work/target-gpu).
# run:
# GPU machine: the UCX backend with VRAM (UCX 1.22 from the libucx-cu13 wheel, carried in
# .carry/ucx), the nixlbench CLI over UCX with VRAM, and the main job with KV pools in GPU
# memory over CUDA_IPC and over UCX. Prebuilt binaries in .carry/bin. Results to $OUT.
# shellcheck source=scripts/gpu/pick.sh
. "$(dirname "$0")/pick.sh"

build() (
set -euo pipefail
release_env /work/target-gpu
BIN=.carry/bin
bash scripts/gpu.sh one-gpu build
bash scripts/gpu.sh storage build
cargo test --release -p nixl-backend-ucx --test vram --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "vram":
        shutil.copy(m["executable"], sys.argv[1] + "/ucx-vram")
        print("copied ucx-vram")
        sys.exit(0)
sys.exit("not built: ucx-vram")
' "$BIN"
UCX="${NIXL_UCX_HOME:-/opt/nixl-deps/ucx/libucx}"
if [ -f "$UCX/lib/libucp.so.0" ]; then
    rm -rf .carry/ucx && mkdir -p .carry/ucx/lib/ucx
    for f in "$UCX"/lib/lib*.so.0; do cp -L "$f" .carry/ucx/lib/; done
    for f in "$UCX"/lib/ucx/lib*.so.0; do
        case "$f" in *perftest*) continue ;; esac
        cp -L "$f" .carry/ucx/lib/ucx/
    done
    strip --strip-unneeded .carry/ucx/lib/*.so.0 .carry/ucx/lib/ucx/*.so.0 2>/dev/null || true
    # The wheel's bundled CUDA runtime: lib/ucx/libucm_cuda.so.0 finds it by RUNPATH
    # (../../../libucx_cu13.libs); without it UCX's CUDA memory hooks do not load.
    libs="$(dirname "$UCX")/libucx_cu13.libs"
    if [ -d "$libs" ]; then
        rm -rf .carry/libucx_cu13.libs && cp -rL "$libs" .carry/libucx_cu13.libs
    fi
    echo "UCX libraries from $UCX: $(du -sh .carry/ucx | cut -f1)"
else
    echo "no UCX at $UCX (run scripts/deps/ucx.sh): the UCX VRAM test will skip there" >&2
fi
ls -la "$BIN"
size=$(du -sm .carry | cut -f1)
echo "carry .carry: ${size} MiB"
[ "$size" -lt 64 ] || { echo ".carry is over the 64 MiB the device tool carries" >&2; exit 1; }
)

run() (
set -uo pipefail
start_summary ucx /tmp/nixl-gpu-out
B=.carry/bin
use_carried_ucx
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
# cudarc loads libcufile as libcufile.so from the loader's path (see scripts/gpu.sh storage run).
CUFILE=$(ls /usr/local/cuda*/lib64/libcufile.so.0 2>/dev/null | head -1)
[ -n "$CUFILE" ] && ln -sf "$CUFILE" "$PWD/.gds-tmp/cufile-lib/libcufile.so"
GDS_TEST=$B/gds-test; [ -x "$GDS_TEST" ] || GDS_TEST=$B/storage-gds-test
LD_LIBRARY_PATH="$PWD/.gds-tmp/cufile-lib:$LD_LIBRARY_PATH" CUFILE_LOGFILE_PATH="$OUT/cufile.log" TMPDIR="$PWD/.gds-tmp" \
  run gds-tests 150 "$GDS_TEST" --nocapture --test-threads=1
)

case "${1:-}" in
    build | run) "$1" ;;
    *) echo "usage: scripts/gpu.sh ucx build|run" >&2; exit 2 ;;
esac
