#!/usr/bin/env bash
# Builds the GPU test and bench binaries of nixl-mem HERE (a machine with the Rust toolchain)
# and copies them, stripped, to .carry/bin/ for scripts/gpu/run.sh on the GPU machine (which
# has no toolchain). The binaries load libcuda at run time, so no CUDA is needed to build.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-mem}"
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
BIN=.carry/bin
mkdir -p "$BIN"
cargo build --release -p nixl-mem --example gpu_bench
cp "$CARGO_TARGET_DIR/release/examples/gpu_bench" "$BIN/gpu_bench"
# Test executables: the lib's unit tests and the tests/gpu*.rs integration tests.
cargo test --release -p nixl-mem --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys, shutil
names = {("lib", "nixl_mem"): "nixl-mem-lib", ("test", "gpu"): "nixl-mem-gpu", ("test", "gpu_agent"): "nixl-mem-gpu-agent"}
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m.get("profile", {}).get("test"):
        continue
    t = m["target"]
    key = (t["kind"][0], t["name"])
    if key in names:
        shutil.copy(m["executable"], sys.argv[1] + "/" + names[key])
        print("copied", names[key])
' "$BIN"
ls -la "$BIN"
du -sh "$BIN"
