#!/usr/bin/env bash
# Installs what nixl-backend-gds's tests, example and benches need on Debian 12 and Ubuntu 24.04:
#   - POSIX: nothing (io_uring is probed at run time; the thread pool is the fallback);
#   - S3: a real S3 server for tests on 127.0.0.1: moto's server (`pip install moto[server]`,
#     into $NIXL_GDS_PREFIX/moto, run as `python3 -m moto.server`), found by the tests through
#     NIXL_S3_MOTO_PYTHONPATH or on the default Python path;
#   - GDS: nothing (libcufile is loaded at run time; tests skip without a GPU).
# Idempotent, non-interactive, fast when already installed.
set -euo pipefail

PREFIX="${NIXL_GDS_PREFIX:-/opt/nixl-deps/gds}"
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

PY="$(command -v python3 || true)"
if [ -z "$PY" ] || ! "$PY" -m pip --version >/dev/null 2>&1; then
    echo "gds.sh: installing python3-pip"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3 python3-pip >/dev/null
    PY="$(command -v python3)"
fi

# moto: either already importable, or installed under $PREFIX/moto (a --target dir, so the
# system's externally-managed Python, PEP 668 on Debian 12 and Ubuntu 24.04, is not touched).
if "$PY" -c 'import moto.server, flask, werkzeug' >/dev/null 2>&1; then
    echo "gds.sh: moto server already importable"
elif PYTHONPATH="$PREFIX/moto" "$PY" -c 'import moto.server, flask, werkzeug' >/dev/null 2>&1; then
    echo "gds.sh: moto server already installed at $PREFIX/moto"
else
    echo "gds.sh: installing moto[server] into $PREFIX/moto"
    $SUDO mkdir -p "$PREFIX"
    $SUDO chown "$(id -u):$(id -g)" "$PREFIX" 2>/dev/null || true
    "$PY" -m pip install --quiet --disable-pip-version-check --target "$PREFIX/moto" 'moto[server]'
    PYTHONPATH="$PREFIX/moto" "$PY" -c 'import moto.server'
fi
echo "export NIXL_S3_MOTO_PYTHONPATH=$PREFIX/moto"
