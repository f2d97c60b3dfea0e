#!/usr/bin/env bash
# Sets up the machine (scripts/setup.sh) and runs the whole test suite: every crate, every
# feature that builds without a GPU, unit + scenario + conformance + doc tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
source .deps/env.sh
cargo test --workspace --all-features --no-fail-fast "$@"
