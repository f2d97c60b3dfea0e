#!/usr/bin/env bash
# One-time (idempotent) set-up of a fresh Debian/Ubuntu machine for nixl-rs: a Rust toolchain,
# base build packages, and every backend's dependencies (scripts/deps/*.sh: UCX, libfabric,
# etcd, an S3 test server, ...). Environment the builds and tests need is written to
# .deps/env.sh, which scripts/main.sh and scripts/test.sh source.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mkdir -p .deps
export NIXL_DEPS_DIR="$root/.deps"
export NIXL_ENV_FILE="$root/.deps/env.sh"
: > "$NIXL_ENV_FILE"

sudo_() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

need_apt=()
for p in build-essential pkg-config python3 python3-pip curl ca-certificates; do
  dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive sudo_ apt-get install -y -qq "${need_apt[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi
echo "export PATH=\"$(dirname "$(command -v cargo)"):\$PATH\"" >> "$NIXL_ENV_FILE"

# The whole suite builds every feature, ROCm's HIP bindings included.
export NIXL_MEM_ROCM="${NIXL_MEM_ROCM:-1}"
echo "export HIP_PATH=\${HIP_PATH:-/usr}" >> "$NIXL_ENV_FILE"
# Each deps script installs what its crate's tests need and prints `export NAME=value` lines
# for the environment the builds and tests need; those lines go to the env file.
for s in scripts/deps/*.sh; do
  [ -e "$s" ] || continue
  echo "== setup: $s"
  bash "$s" | tee "$NIXL_DEPS_DIR/last.log"
  grep -E '^export [A-Za-z_][A-Za-z0-9_]*=' "$NIXL_DEPS_DIR/last.log" >> "$NIXL_ENV_FILE" || true
done
echo "== setup done (environment in $NIXL_ENV_FILE)"
