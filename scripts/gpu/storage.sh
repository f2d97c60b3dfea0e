#!/usr/bin/env bash
# GPU suite `storage`: `scripts/gpu.sh storage build` here, `scripts/gpu.sh storage run` on
# the GPU machine.
#
# build:
# Builds the VRAM <-> FILE storage binaries of nixl-backend-gds HERE (a machine with the Rust
# toolchain; no CUDA needed: libcuda and libcufile are loaded at run time) and copies them,
# release and stripped, to .carry/bin/ for scripts/gpu.sh storage run on the GPU machine:
#   storage_vram             the bench (benches/storage_vram.rs), features posix + gds
#   storage-vram-file-test   tests/vram_file.rs
#   storage-gds-test         tests/gds.rs
# run:
# GPU machine: VRAM <-> FILE of nixl-backend-gds from the prebuilt binaries in .carry/bin (see
# scripts/gpu.sh storage build): the POSIX bounce-buffer tests, the GDS tests once plain and
# once with force_compat_mode (NIXL_TEST_GDS_FORCE_COMPAT=1; cuFile's driver is opened once
# per process), and the storage_vram bench (POSIX bounce vs GDS vs cuMemcpy + pwrite by hand).
# Files go to a directory on the local disk (not tmpfs); logs and cufile.log to $OUT.
# Bounded: 4 x 120 s tests + 220 s bench at most; SKIP_BENCH=1 skips the bench;
# SUPPLY_UDEV=1 also runs the GDS tests through cuFile's own data path (see below).

build() (
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-storage}"
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
export CARGO_PROFILE_BENCH_DEBUG=0 CARGO_PROFILE_BENCH_STRIP=symbols
BIN=.carry/bin
mkdir -p "$BIN"
pick() { # names: "kind:target=dest ..." ; reads cargo's JSON messages on stdin
python3 -c '
import json, sys, shutil
want = dict(a.split("=") for a in sys.argv[2:])
found = set()
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    key = t["kind"][0] + ":" + t["name"]
    if key in want:
        shutil.copy(m["executable"], sys.argv[1] + "/" + want[key])
        found.add(key)
        print("copied", want[key])
missing = set(want) - found
if missing:
    sys.exit("not built: " + ", ".join(sorted(missing)))
' "$BIN" "$@"
}
cargo bench -p nixl-bench --features gds --bench storage_vram --no-run --message-format=json 2>/dev/null \
  | pick bench:storage_vram=storage_vram
cargo test --release -p nixl-backend-gds --features gds --test vram_file --test gds --no-run --message-format=json 2>/dev/null \
  | pick test:vram_file=storage-vram-file-test test:gds=storage-gds-test
ls -la "$BIN"/storage*
du -sh "$BIN"
)

run() (
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/nixl-storage-out}"; mkdir -p "$OUT"
B="${NIXL_GPU_BIN:-.carry/bin}"
s="$OUT/storage-summary.txt"; : > "$s"
say() { echo "$*" | tee -a "$s"; }
for b in storage_vram storage-vram-file-test storage-gds-test; do
    [ -x "$B/$b" ] || { say "missing $B/$b: run scripts/gpu.sh storage build and carry .carry"; exit 2; }
done
export TMPDIR="$PWD/.storage-tmp"; mkdir -p "$TMPDIR"
# libcufile is loaded by cudarc under the name libcufile.so (then .so.12 ... .so.1), from the
# loader's path; the toolkit may ship only libcufile.so.0: link it into a directory on
# LD_LIBRARY_PATH.
CUFILE=$(ls /usr/local/cuda*/lib64/libcufile.so.0 /usr/local/cuda*/targets/*/lib/libcufile.so.0 2>/dev/null | head -1)
if [ -n "$CUFILE" ]; then
    mkdir -p "$TMPDIR/cufile-lib" && ln -sf "$CUFILE" "$TMPDIR/cufile-lib/libcufile.so"
    export LD_LIBRARY_PATH="$TMPDIR/cufile-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export CUFILE_LOGFILE_PATH="$OUT/cufile.log"
# With a GPU visible, a test that skips for want of the GPU (or of cuFile) fails.
if nvidia-smi -L >/dev/null 2>&1; then
    export NIXL_REQUIRE_DEPS=1 NIXL_ALLOW_SKIP="${NIXL_ALLOW_SKIP:-nvidia-fs,s3,etcd,netns,nixl,efa,fi-hmem,rocm-gpu,libfabric,ucx,cuda-ucx,io-uring,multi-gpu}"
fi
{ nvidia-smi; df -T "$TMPDIR"; echo "libcufile: $CUFILE"; ls -l /usr/local/cuda*/lib64/libcufile.so* ; lsmod | grep -E 'nvidia|nvfs'; } > "$OUT/storage-env.txt" 2>&1
say "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1); files on $(df -T "$TMPDIR" | tail -1 | awk '{print $2, $7}'); libcufile: ${CUFILE:-none}"
fail=0
run() { # name timeout cmd...
    local name=$1 t=$2; shift 2
    say "== $name: $*"
    timeout "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
    grep -E '^test result:|^skipping|SKIPPED|FAILED|panicked|path|GB/s|refused|took|fallback' "$OUT/$name.log" | head -40 | tee -a "$s"
    say "rc=$rc"
    [ $rc -eq 0 ] || fail=1
}
run storage-vram-file 120 "$B/storage-vram-file-test" --nocapture --test-threads=2
run storage-gds 120 "$B/storage-gds-test" --nocapture --test-threads=1
CUFILE_LOGFILE_PATH="$OUT/cufile-force-compat.log" NIXL_TEST_GDS_FORCE_COMPAT=1 \
    run storage-gds-force-compat 120 "$B/storage-gds-test" --nocapture --test-threads=1
# cuFile's own data path: the lent VMs run no udev daemon, so cuFile finds no ID_FS_USAGE for
# their disk and refuses every file (error 5027). With SUPPLY_UDEV=1, write the two properties
# udev records for an ext4 disk (only where no udev data exists) and run the GDS tests again:
# then cuFileRead/Write and the batch API carry the data (compatibility mode without nvidia-fs).
if [ "${SUPPLY_UDEV:-0}" = 1 ]; then
    U="/run/udev/data/b$(stat -c '%Hd:%Ld' "$TMPDIR")"
    if [ ! -e "$U" ]; then
        mkdir -p /run/udev/data && printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n' > "$U" && say "wrote $U (no udev on this machine)"
    fi
    CUFILE_LOGFILE_PATH="$OUT/cufile-udev.log" run storage-gds-udev 120 "$B/storage-gds-test" --nocapture --test-threads=1
fi
# On a GPU machine no VRAM test may skip.
if nvidia-smi -L >/dev/null 2>&1 && grep -qE 'SKIPPED\[gpu\]' "$OUT"/storage-*.log; then
    say "VRAM or GDS tests skipped although a GPU is visible"; fail=1
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
    say "== storage_vram bench (O_DIRECT, GB/s)"
    timeout 220 "$B/storage_vram" --dir "$TMPDIR" --size-mib 64,256 --block-mib 1,16 --iters 3 > "$OUT/storage-vram-bench.txt" 2>&1
    rc=$?
    tee -a "$s" < "$OUT/storage-vram-bench.txt"
    say "rc=$rc"; [ $rc -eq 0 ] || fail=1
fi
tail -n 20 "$OUT"/cufile*.log > "$OUT/cufile-tail.txt" 2>/dev/null || true
rm -rf "$TMPDIR"
say "overall: $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
exit $fail
)

case "${1:-}" in
    build | run) "$1" ;;
    *) echo "usage: scripts/gpu.sh storage build|run" >&2; exit 2 ;;
esac
