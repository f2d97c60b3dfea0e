#!/usr/bin/env bash
# Installs what nixl-backend-ucx's tests, example and benches need on Debian 12 and Ubuntu 24.04:
#   - a UCX recent enough for zero-copy shared-memory RMA between processes: the PyPI wheel
#     libucx-cu13==1.22.0 unpacked into $NIXL_UCX_PREFIX (default /opt/nixl-deps/ucx);
#     the backend finds it through NIXL_UCX_HOME=$NIXL_UCX_PREFIX/libucx (printed at the end);
#   - the system's libucx0 (Debian 12: 1.13, Ubuntu 24.04: 1.16) as the fallback (optional;
#     the wheel is enough).
# Idempotent, non-interactive, fast when already installed.
set -euo pipefail

PREFIX="${NIXL_UCX_PREFIX:-/opt/nixl-deps/ucx}"
VERSION="1.22.0"
HOME_DIR="$PREFIX/libucx"
STAMP="$PREFIX/.installed-$VERSION"

if [ -f "$STAMP" ] && [ -e "$HOME_DIR/lib/libucp.so.0" ]; then
    echo "ucx.sh: UCX $VERSION already installed at $HOME_DIR"
    echo "export NIXL_UCX_HOME=$HOME_DIR"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

PY="$(command -v python3 || true)"
if [ -z "$PY" ] || ! "$PY" -m pip --version >/dev/null 2>&1; then
    echo "ucx.sh: installing python3-pip"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3 python3-pip >/dev/null
    PY="$(command -v python3)"
fi

$SUDO mkdir -p "$PREFIX"
$SUDO chown "$(id -u):$(id -g)" "$PREFIX" 2>/dev/null || true
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
WHEEL="$(ls /tmp/wheels/libucx_cu13-$VERSION-*.whl 2>/dev/null | head -n1 || true)"
if [ -z "$WHEEL" ]; then
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$TMP" "libucx-cu13==$VERSION"
    WHEEL="$(ls "$TMP"/libucx_cu13-*.whl | head -n1)"
fi
# A wheel is a zip: unpack it directly (no pip install, so no Python environment is touched;
# `--break-system-packages` is not needed on the externally-managed Python of Debian 12 or
# Ubuntu 24.04).
"$PY" -m zipfile -e "$WHEEL" "$PREFIX"
chmod +x "$HOME_DIR"/bin/* 2>/dev/null || true
test -e "$HOME_DIR/lib/libucp.so.0"
touch "$STAMP"
echo "ucx.sh: UCX $VERSION installed at $HOME_DIR"
echo "export NIXL_UCX_HOME=$HOME_DIR"
