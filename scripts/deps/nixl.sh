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
#   NIXL_OLDER        the older NIXL versions in the field, each `version=pythonpath=libucp`
#                     (space-separated; NIXL_OLDER_VERSIONS, default "1.4.1 1.3.1": vLLM's
#                     and TensorRT-LLM's in Dynamo 1.6), under $NIXL_NIXL_PREFIX/v<version>:
#                     scripts/test.sh runs the interop tests against each (issue 40). NIXL
#                     1.3's Python module imports torch at load, for tensor helpers the tests
#                     never call; where torch is absent, its path ends with a placeholder
#                     `torch` module (one `Tensor` class, so no argument is taken for a
#                     tensor): NIXL's agent, its UCX and the wire stay the real 1.3 ones.
# Idempotent, non-interactive, fast when already installed.
set -euo pipefail

PREFIX="${NIXL_NIXL_PREFIX:-/opt/nixl-deps/nixl}"
VERSION="1.5.1"
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
TARGET="$PREFIX/py$PYV"

# The import path of an installed TARGET (with its torch placeholder, where it has one).
pypath() {
    if [ -d "$1-torch" ]; then echo "$1:$1-torch"; else echo "$1"; fi
}

# install VERSION TARGET: the wheel and numpy into TARGET (once; a stamp marks it done).
install() {
    local version=$1 target=$2
    if [ -f "$target/.installed-$version" ] \
        && PYTHONPATH="$(pypath "$target")" "$PY" -c 'import nixl_cu13._api, numpy' >/dev/null 2>&1; then
        echo "nixl.sh: NIXL $version already installed at $target"
        return
    fi
    echo "nixl.sh: installing nixl-cu13==$version and numpy into $target"
    $SUDO mkdir -p "$PREFIX"
    $SUDO chown "$(id -u):$(id -g)" "$PREFIX" 2>/dev/null || true
    rm -rf "$target" "$target-torch"
    mkdir -p "$(dirname "$target")"
    "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --target "$target" "nixl-cu13==$version" numpy
    # NIXL 1.3 imports torch at load (tensor helpers only): a placeholder where torch is absent.
    if ! PYTHONPATH="$target" "$PY" -c 'import nixl_cu13._api' >/dev/null 2>&1 \
        && ! "$PY" -c 'import torch' >/dev/null 2>&1; then
        mkdir -p "$target-torch/torch"
        cat >"$target-torch/torch/__init__.py" <<'PY'
"""Placeholder for NIXL 1.3, which imports torch at load: no value is a Tensor here."""


class Tensor:
    pass
PY
    fi
    PYTHONPATH="$(pypath "$target")" "$PY" -c 'import nixl_cu13._api, numpy'
    touch "$target/.installed-$version"
}

ucp_of() {
    local ucp
    ucp="$(ls "$1"/nixl_cu13.libs/libucp-*.so* 2>/dev/null | head -n1 || true)"
    if [ -z "$ucp" ]; then
        echo "nixl.sh: the wheel carries no libucp under $1/nixl_cu13.libs" >&2
        exit 1
    fi
    echo "$ucp"
}

install "$VERSION" "$TARGET"
echo "export NIXL_PYTHONPATH=$TARGET"
echo "export NIXL_WHEEL_UCX=$(ucp_of "$TARGET")"
older=""
for v in ${NIXL_OLDER_VERSIONS:-1.4.1 1.3.1}; do
    t="$PREFIX/v$v/py$PYV"
    install "$v" "$t"
    older="$older $v=$(pypath "$t")=$(ucp_of "$t")"
done
echo "export NIXL_OLDER=\"${older# }\""
