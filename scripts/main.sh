#!/usr/bin/env bash
# Sets up the machine (scripts/setup.sh) and runs the main job: the two-process
# disaggregated-prefill KV-cache transfer (examples/disagg_kv.rs) over UCX, verifying every byte.
# Extra arguments go to the example (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
source .deps/env.sh
cargo run --release --example disagg_kv -- "$@"
