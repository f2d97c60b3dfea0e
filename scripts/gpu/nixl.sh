#!/usr/bin/env bash
# GPU suite `nixl`: `scripts/gpu.sh nixl build` here, `scripts/gpu.sh nixl run` on
# the GPU machine.
#
# build:
# Prepares HERE (a machine with the toolchain and PyPI) what the GPU machine needs for the NIXL
# interop measurement (scripts/gpu.sh nixl run), into .carry/ (git-ignored), under 64 MiB:
#   .carry/nixl312/   a slim copy of the nixl-cu13 1.5.1 wheel for CPython 3.12 (the GPU
#                     machine's Python): the Python package, libnixl and its libraries, the UCX
#                     plugin only, the bundled UCX 1.23 with its cma/cuda modules only, and
#                     libcudart.so.13 (UCX's cuda memory hooks need it; torch may ship another)
#   .carry/nixl-bin/nixl-interop-bench   the test binary of nixl-backend-ucx/tests/nixl_interop_bench.rs
# Carry both paths (`carry: [".carry/nixl312", ".carry/nixl-bin"]`).
# run:
# GPU machine: VRAM WRITE between a stock NIXL agent (nixl-cu13 1.5.1 for Python 3.12, carried
# slim in .carry/nixl312 by scripts/gpu.sh nixl build) and a nixl-rs agent on one GPU over UCX
# cuda_ipc, every byte verified, with NIXL -> NIXL throughput in the same run; then the same on
# host memory for reference. Results to $OUT.

build() (
set -euo pipefail
cd "$(dirname "$0")/../.."
PKG="${NIXL_PKG:-nixl-cu13}"
PYV="${NIXL_PYV:-312}"
OUTDIR=".carry/nixl$PYV"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$PYV" --implementation cp --abi "cp$PYV" --platform manylinux_2_28_x86_64 \
    --dest "$TMP/w" "$PKG==1.5.1"
# CUDA 13.0's runtime (what the wheel was built against; minor-version compatible drivers).
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux_2_17_x86_64 --python-version "$PYV" --dest "$TMP/rt" "nvidia-cuda-runtime==13.0.*" \
    || echo "nixl_build.sh: no nvidia-cuda-runtime 13.0 wheel; the GPU machine must provide libcudart.so.13"
mkdir -p "$TMP/x"
for w in "$TMP"/w/*.whl; do python3 -m zipfile -e "$w" "$TMP/x"; done
mkdir -p "$TMP/rtx"
for w in "$TMP"/rt/*.whl; do [ -e "$w" ] && python3 -m zipfile -e "$w" "$TMP/rtx"; done
X="$TMP/x"
PKGDIR=$(basename "$(ls -d "$X"/nixl_cu1[0-9]/ | head -n1)")
LIBS="$PKGDIR.libs"
rm -rf "$OUTDIR"; mkdir -p "$OUTDIR/$LIBS/nixl" "$OUTDIR/$LIBS/ucx"
cp -r "$X/$PKGDIR" "$X/$PKGDIR"-*.dist-info "$OUTDIR/"
cp -r "$X/.${PKGDIR}.mesonpy.libs" "$OUTDIR/"
# NIXL loads plugins from .<pkg>.mesonpy.libs/plugins: keep UCX's only.
find "$OUTDIR/.${PKGDIR}.mesonpy.libs/plugins" -type f ! -name 'libplugin_UCX.so' -delete
rm -f "$OUTDIR/.${PKGDIR}.mesonpy.libs"/lib{obj_utils,file_utils,nixl_test_utils,core,pull}* 2>/dev/null || true
rmdir "$OUTDIR/$LIBS/nixl"
for m in libuct_cma libuct_cuda libucm_cuda; do cp "$X/$LIBS/ucx/$m".so* "$OUTDIR/$LIBS/ucx/"; done
# Every library the kept objects need, from the wheel's own directory (closure by DT_NEEDED).
need() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
todo=$(find "$OUTDIR" -name '*.so*' -type f)
while [ -n "$todo" ]; do
    next=""
    for f in $todo; do
        for n in $(need "$f"); do
            if [ -e "$X/$LIBS/$n" ] && [ ! -e "$OUTDIR/$LIBS/$n" ]; then
                cp "$X/$LIBS/$n" "$OUTDIR/$LIBS/"
                next="$next $OUTDIR/$LIBS/$n"
            fi
        done
    done
    todo="$next"
done
CUDART=$(find "$TMP/rtx" -name 'libcudart.so.13*' | head -n1 || true)
[ -n "$CUDART" ] && cp "$CUDART" "$OUTDIR/$LIBS/libcudart.so.13"
echo "nixl_build.sh: $(du -sh "$OUTDIR" | cut -f1) in $OUTDIR"

# The test binary (release, stripped). It finds nixl_peer.py through NIXL_PEER_SCRIPT.
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
mkdir -p .carry/nixl-bin
exe=$(cargo test --release -p nixl-backend-ucx --test nixl_interop_bench --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    try: m=json.loads(l)
    except ValueError: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]=="nixl_interop_bench": print(m["executable"])' | tail -n1)
cp "$exe" .carry/nixl-bin/nixl-interop-bench
du -sh .carry/nixl-bin/nixl-interop-bench "$OUTDIR"
echo "nixl_build.sh: total $(du -csh "$OUTDIR" .carry/nixl-bin/nixl-interop-bench | tail -n1 | cut -f1) (limit 64 MiB per call)"
)

run() (
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/nixl-gpu-out}"; mkdir -p "$OUT"
N="$PWD/.carry/nixl312"
export NIXL_PYTHONPATH="$N"
export NIXL_WHEEL_UCX="$(ls "$N"/nixl_cu1*.libs/libucp-*.so* | head -n1)"
export NIXL_PEER_SCRIPT="$PWD/nixl-core/testkit/py/nixl_peer.py"
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
)

case "${1:-}" in
    build | run) "$1" ;;
    *) echo "usage: scripts/gpu.sh nixl build|run" >&2; exit 2 ;;
esac
