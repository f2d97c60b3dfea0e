#!/usr/bin/env bash
# Sets up the machine (scripts/setup.sh) and runs the whole test suite: every crate, every
# feature that builds without a GPU (unit, scenario, conformance, two-process and doc tests),
# then the main job (examples/disagg_kv) in both directions, which verifies every byte.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
source .deps/env.sh
cargo test --workspace --all-features --no-fail-fast "$@"
for op in write read; do
  echo "== main job: disagg_kv --op $op"
  cargo run --quiet --all-features --example disagg_kv -- --op "$op" --requests 8 --layers 4 --blocks 64 --block-bytes 65536
done
echo "== main job over libfabric (shm)"
cargo run --quiet --all-features --example disagg_kv -- --op write --requests 4 --layers 4 --blocks 64 --block-bytes 65536 --backend libfabric --provider shm
