#!/usr/bin/env bash
# Builds the native NIXL reference (nixl_native.cpp) against the nixl-cu13 1.5.1 wheel's
# libnixl.so: no NIXL source is needed (nixl_abi.h declares the API it calls; the link checks
# every symbol by its mangled name). Needs g++ (C++20) and the wheel installed by
# scripts/deps/nixl.sh (or a slim copy from scripts/gpu/nixl_build.sh).
#   benches/reference/native/build.sh [OUT]     (default: $CARGO_TARGET_DIR/nixl-native/nixl_native)
# Environment: NIXL_PYTHONPATH (the wheel's install; default: what scripts/deps/nixl.sh prints).
# Run the binary with LD_LIBRARY_PATH and NIXL_PLUGIN_DIR pointing into the wheel
# (compare_native.py and scripts/gpu/native_run.sh do).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
WHEEL="${NIXL_PYTHONPATH:-}"
if [ -z "$WHEEL" ]; then
    eval "$(bash "$ROOT/scripts/deps/nixl.sh" | grep '^export ')"
    WHEEL="$NIXL_PYTHONPATH"
fi
LIBDIR="$(ls -d "$WHEEL"/.nixl_cu1*.mesonpy.libs 2>/dev/null | head -n1 || true)"
if [ -z "$LIBDIR" ] || [ ! -e "$LIBDIR/libnixl.so" ]; then
    echo "build.sh: no libnixl.so under $WHEEL/.nixl_cu*.mesonpy.libs (run scripts/deps/nixl.sh)" >&2
    exit 1
fi
OUT="${1:-${CARGO_TARGET_DIR:-$ROOT/target}/nixl-native/nixl_native}"
mkdir -p "$(dirname "$OUT")"
g++ -std=c++20 -O2 -Wall -Wextra -o "$OUT" "$HERE/nixl_native.cpp" -I"$HERE" \
    -L"$LIBDIR" -lnixl -lnixl_build
echo "build.sh: built $OUT against $LIBDIR"
