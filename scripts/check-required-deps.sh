#!/usr/bin/env bash
# Proves that a missing dependency fails CI instead of passing silently: runs tests that need
# UCX, libfabric, etcd and the S3 server with that one dependency hidden, under the settings
# of scripts/test.sh (NIXL_REQUIRE_DEPS=1, only hardware may skip), and expects each run to
# fail with "requires <dep>". Then it shows the skip summary scripts/test.sh prints, from a
# run where the skips are allowed. Exit status 0 means every hidden dependency failed its
# tests as it must.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
[ -f .deps/env.sh ] && source .deps/env.sh
export CARGO_TERM_COLOR=never

# The test binaries (built once; run directly so that PATH can lack etcd).
bin() {
    cargo test -q --all-features --no-run "$@" --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n1
}
ucx=$(bin -p nixl-backend-ucx --test conformance)
lf=$(bin -p nixl-backend-libfabric --test conformance)
etcd=$(bin -p nixl-core --test etcd)
s3=$(bin -p nixl-backend-gds --test s3)
for b in "$ucx" "$lf" "$etcd" "$s3"; do
    [ -x "$b" ] || { echo "could not build the test binaries"; exit 1; }
done

export NIXL_REQUIRE_DEPS=1
export NIXL_ALLOW_SKIP=gpu,multi-gpu,rocm-gpu,cuda-ucx,efa,fi-hmem,nvidia-fs,ucx-1.23,torch
log=$(mktemp -d)
export NIXL_SKIP_LOG="$log/skips.log"
failed=0

# expect_failure NAME DEP FILTER COMMAND...: runs COMMAND FILTER, which must fail for DEP
expect_failure() {
    local name=$1 dep=$2 filter=$3
    shift 3
    local out="$log/$dep.out"
    "$@" "$filter" --test-threads=2 >"$out" 2>&1
    local rc=$?
    local n
    n=$(grep -c "requires $dep, which this run must have" "$out")
    local summary
    summary=$(grep -E '^test result' "$out" | tail -n1)
    if [ "$rc" -ne 0 ] && [ "$n" -gt 0 ]; then
        echo "ok    $name hidden: exit $rc, $n tests failed with 'requires $dep' ($summary)"
    else
        echo "FAIL  $name hidden: exit $rc, $n 'requires $dep' failures ($summary)"
        failed=1
    fi
}

# UCX is found through NIXL_UCX_HOME, UCX_HOME, the set-up's install and the system's: hide
# the install in a private mount namespace (root), with no other UCX named.
ucx_home=/opt/nixl-deps/ucx
can_hide_ucx() {
    [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null && [ -d "$ucx_home" ] &&
        unshare -m true 2>/dev/null
}
hide_ucx() {
    unshare -m sh -c 'mount -t tmpfs none "$0" && shift && exec env "$@"' "$ucx_home" \
        NIXL_UCX_HOME=/nonexistent UCX_HOME= "$@"
}
if can_hide_ucx; then
    expect_failure "UCX (install hidden, NIXL_UCX_HOME=/nonexistent)" ucx write_then_read \
        hide_ucx "$ucx"
else
    echo "skip  UCX: hiding $ucx_home needs root and a mount namespace (unshare -m)"
fi
expect_failure "libfabric (NIXL_LIBFABRIC_PATH=/nonexistent)" libfabric write_then_read \
    env NIXL_LIBFABRIC_PATH=/nonexistent/libfabric.so.1 "$lf"
expect_failure "etcd (PATH without etcd)" etcd lease \
    env PATH=/nonexistent "$etcd"
expect_failure "S3 server (PATH without python3, so no moto)" s3 conformance_s3 \
    env PATH=/nonexistent NIXL_S3_MOTO_PYTHONPATH=/nonexistent "$s3"

echo "== the skip summary scripts/test.sh prints, for the same runs with the skips allowed:"
: >"$NIXL_SKIP_LOG"
export NIXL_REQUIRE_DEPS=0
can_hide_ucx && hide_ucx "$ucx" write_then_read >/dev/null 2>&1
env NIXL_LIBFABRIC_PATH=/nonexistent/libfabric.so.1 "$lf" write_then_read >/dev/null 2>&1
env PATH=/nonexistent "$etcd" lease >/dev/null 2>&1
env PATH=/nonexistent "$s3" conformance_s3 >/dev/null 2>&1
cut -f1 "$NIXL_SKIP_LOG" | sort | uniq -c | sort -rn
rm -rf "$log"
exit $failed
