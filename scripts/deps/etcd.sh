#!/usr/bin/env bash
# Installs what nixl-core's `etcd` tests and examples need on Debian 12 and Ubuntu 24.04
# (building the feature needs nothing: its etcd client is pure Rust, no protoc):
#   - etcd-server: the real `etcd` binary that nixl-core/tests/etcd.rs and
#     benches/etcd_scale.rs start on 127.0.0.1 (Debian 12 ships 3.4.23, Ubuntu
#     24.04 3.4.30, in universe).
# The package also starts an etcd system service on a default install; the tests do not use it
# (each starts its own server on free ports), so it is stopped and disabled when systemd runs
# it, leaving port 2379 free. Idempotent, non-interactive, fast when installed.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
if [ ${#need[@]} -gt 0 ]; then
    echo "etcd.sh: installing ${need[*]}"
    $SUDO apt-get update -qq
    # policy-rc.d 101: do not start the packaged service during installation.
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
        $SUDO chmod +x /usr/sbin/policy-rc.d
        trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
    $SUDO systemctl disable --now etcd >/dev/null 2>&1 || true
fi

echo "etcd.sh: etcd $(etcd --version | sed -n 's/^etcd Version: //p')"
