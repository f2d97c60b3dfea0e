#!/usr/bin/env bash
# Builds HERE (a machine with the Rust toolchain; no CUDA, cuFile or GPU needed: libcuda and
# libcufile are loaded at run time) everything scripts/gpu/run_all.sh runs on the GPU machine,
# into .carry/ (carry `.carry`; the script prints its size, which must stay under 64 MiB):
#   scripts/gpu/build.sh          nixl-mem: lib unit tests, tests/gpu*.rs, the gpu_bench example
#   scripts/gpu/storage_build.sh  nixl-backend-gds: tests/vram_file.rs, tests/gds.rs, the bench
#   ucx-vram                      nixl-backend-ucx: tests/vram.rs
#   .carry/ucx/lib                UCX's shared libraries (stripped), from $NIXL_UCX_HOME or
#                                 scripts/deps/ucx.sh's install, for the CUDA-aware UCX test
# One target directory for all of them (CARGO_TARGET_DIR, default /work/target-gpu).
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-gpu}"
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
BIN=.carry/bin
mkdir -p "$BIN"
bash scripts/gpu/build.sh
bash scripts/gpu/storage_build.sh
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
