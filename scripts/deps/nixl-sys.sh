#!/usr/bin/env bash
# Fetches nixl-sys 1.5.2 (the published crate of NIXL's Rust bindings) from crates.io, checked
# against its registry checksum, for scripts/nixl-sys-tests.sh: its own tests/ run unchanged
# against compat/nixl-sys (issue 38). Only the crate's test files are used; nothing of NIXL's
# C++ is built. Idempotent: fast when present.
set -euo pipefail

version=1.5.2
sha256=467fa7d1a1a6b30c63928f2246a3e53dfe0a5dc6feebcc769000da1a630b1b00
dir=/opt/nixl-deps/nixl-sys
crate="$dir/nixl-sys-$version.crate"
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

if [ ! -d "$dir/nixl-sys-$version/tests" ]; then
    $SUDO mkdir -p "$dir"
    $SUDO chown "$(id -u)" "$dir"
    tmp="$crate.part"
    curl -sSfL --retry 3 -o "$tmp" "https://static.crates.io/crates/nixl-sys/nixl-sys-$version.crate"
    echo "$sha256  $tmp" | sha256sum -c --quiet -
    mv "$tmp" "$crate"
    tar -xzf "$crate" -C "$dir"
fi
echo "nixl-sys.sh: nixl-sys $version's tests in $dir/nixl-sys-$version/tests"
echo "export NIXL_SYS_CRATE=$dir/nixl-sys-$version"
