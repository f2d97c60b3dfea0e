#!/usr/bin/env bash
# System packages for nixl-mem. The default build needs none: CUDA (libcuda) is loaded at run
# time and its tests skip without a GPU; Gaudi's libhl-thunk is loaded at run time too.
# Only the `rocm` feature links against HIP at build time, so when ROCm is wanted
# (NIXL_MEM_ROCM=1, or `mem.sh --rocm`) this installs libamdhip64-dev (Debian 12: HIP 5.2;
# Ubuntu 24.04: 5.7, in universe; headers in /usr/include/hip on both) and prints the HIP_PATH
# to build with. Idempotent, non-interactive, quick when already installed.
set -euo pipefail

want_rocm="${NIXL_MEM_ROCM:-0}"
for a in "$@"; do [ "$a" = "--rocm" ] && want_rocm=1; done

if [ "$want_rocm" != "1" ]; then
    echo "mem.sh: nothing to install for the default features (set NIXL_MEM_ROCM=1 for --features rocm)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

if dpkg-query -W -f='${Status}' libamdhip64-dev 2>/dev/null | grep -q "install ok installed"; then
    echo "mem.sh: libamdhip64-dev already installed"
else
    echo "mem.sh: installing libamdhip64-dev (HIP headers and libamdhip64 for nixl-mem's rocm feature)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends libamdhip64-dev >/dev/null
fi
test -f /usr/include/hip/hip_runtime_api.h
echo "export HIP_PATH=/usr"
