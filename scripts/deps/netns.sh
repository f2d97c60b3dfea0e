#!/usr/bin/env bash
# Installs what the tests across network namespaces need on Debian 12 and Ubuntu 24.04
# (nixl_core::testing::netns: tests/netns, nixl-core/tests/netns_harness.rs, and
# `disagg_kv --hosts 2`):
#   - iproute2: `ip netns`, veth pairs, bridges, and `tc` (tbf) to slow a link down;
#   - util-linux (`unshare`), coreutils (`timeout`) and mount come with every Debian and Ubuntu.
# The tests need root (creating namespaces); elsewhere they skip with a printed reason
# (Dep::Netns). Idempotent, non-interactive, fast when installed.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
    echo "netns.sh: installing ${need[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "netns.sh: $(ip -V); $(unshare --version | head -n1)"
