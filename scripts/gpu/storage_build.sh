#!/usr/bin/env bash
# Builds the VRAM <-> FILE storage binaries of nixl-backend-gds HERE (a machine with the Rust
# toolchain; no CUDA needed: libcuda and libcufile are loaded at run time) and copies them,
# release and stripped, to .carry/bin/ for scripts/gpu/storage_run.sh on the GPU machine:
#   storage_vram             the bench (benches/storage_vram.rs), features posix + gds
#   storage-vram-file-test   tests/vram_file.rs
#   storage-gds-test         tests/gds.rs
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
cargo bench -p nixl-backend-gds --features gds --bench storage_vram --no-run --message-format=json 2>/dev/null \
  | pick bench:storage_vram=storage_vram
cargo test --release -p nixl-backend-gds --features gds --test vram_file --test gds --no-run --message-format=json 2>/dev/null \
  | pick test:vram_file=storage-vram-file-test test:gds=storage-gds-test
ls -la "$BIN"/storage*
du -sh "$BIN"
