#!/usr/bin/env bash
# Installs what nixl-backend-libfabric's tests and benches need on Debian 12 and Ubuntu 24.04
# (universe there): libfabric 1.17 (libfabric1, with the tcp, shm and sockets providers) and
# fi_info (libfabric-bin, for diagnostics). The crate itself builds without them (libfabric is
# loaded at run time). libfabric-dev and libclang-dev are only needed to regenerate the
# committed bindings (nixl-backend-libfabric/scripts/gen-bindings.sh); pass --dev to install
# them too.
# Idempotent, non-interactive, fast when already installed.
set -euo pipefail

PKGS=(libfabric1 libfabric-bin)
if [ "${1:-}" = "--dev" ]; then PKGS+=(libfabric-dev libclang-dev); fi

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "libfabric.sh: ${PKGS[*]} already installed"
else
    SUDO=""
    if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
    echo "libfabric.sh: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The tests use the tcp provider on loopback and the shm provider.
if command -v fi_info >/dev/null 2>&1; then
    fi_info -l 2>/dev/null | grep -E '^(tcp|shm|sockets):' | tr '\n' ' ' || true
    echo
fi
