#!/usr/bin/env bash
# Installs NIXL itself for the interoperability tests (nixl-backend-ucx/tests/nixl_interop.rs,
# examples/nixl_prefill.py): the PyPI wheel nixl-cu13==1.5.1 (for this machine's python3) and
# numpy, into $NIXL_NIXL_PREFIX/py<version> (default /opt/nixl-deps/nixl/py311 on Debian 12,
# py312 on Ubuntu 24.04) with `pip --target`, so the system's externally-managed Python is
# not touched. The wheel bundles its own UCX (nixl_cu13.libs/libucp-*.so.0.0.0); the tests
# load that same libucp on the Rust side.
# Prints the environment the tests read:
#   NIXL_PYTHONPATH   where `import nixl_cu13` works
#   NIXL_WHEEL_UCX    the wheel's libucp (UcxParams::library_path for a NIXL peer)
# Idempotent, non-interactive, fast when already installed.
set -euo pipefail

PREFIX="${NIXL_NIXL_PREFIX:-/opt/nixl-deps/nixl}"
VERSION="1.5.1"
TARGET="$PREFIX/py"
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

PY="$(command -v python3 || true)"
if [ -z "$PY" ] || ! "$PY" -m pip --version >/dev/null 2>&1; then
    echo "nixl.sh: installing python3-pip"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3 python3-pip >/dev/null
    PY="$(command -v python3)"
fi
# One wheel per Python minor version: keep them apart so a second python3 does not reuse
# another's binary module.
PYV="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
TARGET="$TARGET$PYV"
STAMP="$TARGET/.installed-$VERSION"

have() {
    PYTHONPATH="$TARGET" "$PY" -c 'import nixl_cu13._api, numpy' >/dev/null 2>&1
}
if [ -f "$STAMP" ] && have; then
    echo "nixl.sh: NIXL $VERSION already installed at $TARGET"
else
    echo "nixl.sh: installing nixl-cu13==$VERSION and numpy into $TARGET"
    $SUDO mkdir -p "$PREFIX"
    $SUDO chown "$(id -u):$(id -g)" "$PREFIX" 2>/dev/null || true
    rm -rf "$TARGET"
    "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --target "$TARGET" "nixl-cu13==$VERSION" numpy
    have
    touch "$STAMP"
fi
UCP="$(ls "$TARGET"/nixl_cu13.libs/libucp-*.so* 2>/dev/null | head -n1 || true)"
if [ -z "$UCP" ]; then
    echo "nixl.sh: the wheel carries no libucp under $TARGET/nixl_cu13.libs" >&2
    exit 1
fi
echo "export NIXL_PYTHONPATH=$TARGET"
echo "export NIXL_WHEEL_UCX=$UCP"
