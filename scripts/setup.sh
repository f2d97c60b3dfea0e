#!/usr/bin/env bash
# One-time (idempotent) set-up of a fresh Debian/Ubuntu machine for nixl-rs: a Rust toolchain,
# base build packages, and every backend's dependencies (scripts/deps/*.sh: UCX, libfabric,
# etcd, an S3 test server, ...). Environment the builds and tests need is written to
# .deps/env.sh, which scripts/main.sh and scripts/test.sh source.
#
# Proven on fresh minimal roots of Debian 12 and Ubuntu 24.04 (the GPU machines' system) by
# scripts/fresh-machine.sh (FRESH_DIST=noble for Ubuntu). What differs on Ubuntu 24.04:
#   - python3-pip, etcd-server, libfabric1/libfabric-bin and libamdhip64-dev are in the
#     universe component, which a stock install enables; where it is off, this stops with
#     that reason before installing anything (`add-apt-repository universe` enables it);
#   - Python 3.12 (Debian: 3.11), externally managed on both (PEP 668): nothing is installed
#     into the system Python; the deps scripts use `pip install --target` / `pip download`
#     into /opt/nixl-deps, and nixl.sh picks the wheel of this python3 (nixl-cu13 cp312);
#   - otherwise the same package names and paths, some newer: etcd 3.4.30 (Debian: 3.4.23),
#     ROCm's HIP 5.7.1 (5.2.3; headers in /usr/include/hip on both, so HIP_PATH=/usr);
#     libfabric 1.17.0 and iproute2 6.1 on both; UCX 1.22 is the same PyPI wheel on both.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mkdir -p .deps
export NIXL_DEPS_DIR="$root/.deps"
export NIXL_ENV_FILE="$root/.deps/env.sh"
: > "$NIXL_ENV_FILE"

sudo_() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# Ubuntu keeps packages the set-up needs in universe: when one of them is still to be installed
# and apt cannot find it, say so instead of failing halfway through a deps script.
if grep -qs '^ID=ubuntu' /etc/os-release; then
  universe=(python3-pip etcd-server libfabric1 libfabric-bin)
  if [ "${NIXL_MEM_ROCM:-1}" = 1 ]; then universe+=(libamdhip64-dev); fi
  missing=()
  for p in "${universe[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    sudo_ apt-get update -qq
    for p in "${missing[@]}"; do
      # Into a variable first: `grep -q` leaves early, and a SIGPIPE'd apt-cache would fail
      # the pipeline under pipefail.
      policy=$(apt-cache policy "$p" 2>/dev/null || true)
      if ! grep -q 'Candidate: [^(]' <<<"$policy"; then
        echo "setup.sh: apt has no package $p here: on Ubuntu the set-up's ${universe[*]}" \
          "come from the universe component, which this machine's apt sources leave out;" \
          "enable it (add-apt-repository universe) and run again" >&2
        exit 1
      fi
    done
  fi
fi

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
