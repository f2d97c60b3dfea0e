# Sourced by the GPU build scripts. `cargo ... --message-format=json | pick NAME` prints the
# executable cargo built for target NAME (the last one reported), jq-free.
pick() {
    python3 -c 'import json,sys
for l in sys.stdin:
    try: m=json.loads(l)
    except ValueError: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]==sys.argv[1]: print(m["executable"])' "$1" | tail -n1
}

# Copies UCX's shared libraries from $1 (an install prefix) into .carry/ucx/lib, stripped;
# transports' modules too, but for the CUDA ones unless $2 is "cuda", and never perftest,
# InfiniBand or rdmacm (no such device on the GPU machines).
carry_ucx() {
    local ucx=$1 with=${2:-} f b
    rm -rf .carry/ucx && mkdir -p .carry/ucx/lib/ucx
    for f in "$ucx"/lib/lib*.so.0; do cp -L "$f" .carry/ucx/lib/; done
    for f in "$ucx"/lib/ucx/lib*.so.0; do
        b=$(basename "$f")
        case "$b" in *perftest* | libuct_ib* | libuct_rdmacm*) continue ;; esac
        case "$b" in *cuda*) [ "$with" = cuda ] || continue ;; esac
        cp -L "$f" .carry/ucx/lib/ucx/
    done
    strip --strip-unneeded .carry/ucx/lib/*.so.0 .carry/ucx/lib/ucx/*.so.0 2>/dev/null || true
}

# Prints the size of .carry; fails when it is over what the device tool carries (64 MiB).
carry_fits() {
    local size
    size=$(du -sm .carry | cut -f1)
    echo "carry .carry: ${size} MiB"
    [ "$size" -lt 64 ] || { echo ".carry is over the 64 MiB the device tool carries" >&2; return 1; }
}

# For a build: release binaries without debug information, in $CARGO_TARGET_DIR (default $1,
# else /work/target-gpu), copied to .carry/bin (emptied first when $2 is "fresh").
release_env() {
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${1:-/work/target-gpu}}"
    export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
    [ "${2:-}" != fresh ] || rm -rf .carry/bin
    mkdir -p .carry/bin
}

# For a run: $OUT (default $2, else /tmp/nixl-gpu-out) made and the summary $OUT/$1-summary.txt
# begun empty, as $s; `say` prints a line to the terminal and the summary.
start_summary() {
    OUT="${OUT:-${2:-/tmp/nixl-gpu-out}}"; mkdir -p "$OUT"
    s="$OUT/$1-summary.txt"; : > "$s"
}
say() { echo "$*" | tee -a "$s"; }

# For a run: the UCX libraries carried in ROOT/ucx (ROOT: $1, else .carry), where there are
# some, loaded by path.
use_carried_ucx() {
    local root=${1:-$PWD/.carry}
    [ -d "$root/ucx" ] || return 0
    export NIXL_UCX_HOME="$root/ucx"
    export LD_LIBRARY_PATH="$root/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# For a run of GPU test binaries: a missing dependency fails them, but for those no GPU
# machine has (ROCm, EFA, nvidia-fs, a CUDA-built UCX, NIXL).
gpu_test_env() {
    export NIXL_REQUIRE_DEPS=1 NIXL_ALLOW_SKIP="rocm-gpu,efa,fi-hmem,nvidia-fs,cuda-ucx,ucx,nixl"
}

# Every suite runs from the repository root.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
