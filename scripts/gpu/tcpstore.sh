#!/usr/bin/env bash
# GPU suite `tcpstore` (issue 40): PyTorch's own c10d TCPStore, which the GPU machines have
# (torch) and CI does not. `scripts/gpu.sh tcpstore build` here (after `scripts/gpu.sh nixl
# build`, which makes .carry/nixl312), `scripts/gpu.sh tcpstore run` there. Carry
# [".carry/bin", ".carry/nixl312"].
#
# Runs nixl-core/tests/tcpstore.rs (nixl-rs's client and exchange against a store torch hosts,
# a torch client against nixl-rs's server; the rest as in CI) and nixl-backend-ucx's
# `metadata_by_tcpstore_both_ways` (NIXL 1.5.1 for Python 3.12 and nixl-rs through nixl-rs's
# store and through torch's), with torch required: a skip for it fails the run.
# shellcheck source=scripts/gpu/pick.sh
. "$(dirname "$0")/pick.sh"
set -uo pipefail

build() {
    set -e
    [ -d .carry/nixl312 ] || { echo "run scripts/gpu.sh nixl build first (.carry/nixl312)" >&2; exit 1; }
    release_env /work/target-gpu
    cp "$(cargo test --release -p nixl-core --all-features --test tcpstore --no-run --message-format=json 2>/dev/null | pick tcpstore)" .carry/bin/tcpstore
    cp "$(cargo test --release -p nixl-backend-ucx --all-features --test nixl_interop --no-run --message-format=json 2>/dev/null | pick nixl_interop)" .carry/bin/nixl-interop
    ls -la .carry/bin
    du -csm .carry/bin .carry/nixl312 | tail -n1
}

run() {
    start_summary tcpstore
    local n="$PWD/.carry/nixl312"
    export NIXL_PYTHONPATH="$n" NIXL_WHEEL_UCX
    NIXL_WHEEL_UCX="$(ls "$n"/nixl_cu1*.libs/libucp-*.so* | head -n1)"
    export NIXL_PEER_SCRIPT="$PWD/nixl-core/testkit/py/nixl_peer.py"
    export TORCH_STORE_SCRIPT="$PWD/nixl-core/testkit/py/torch_store.py"
    export UCX_MODULES='^ib,rdmacm' NIXL_REQUIRE_DEPS=1 NIXL_ALLOW_SKIP=gpu
    say "== $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n1); $(nproc) cores; python $(python3 -V 2>&1); torch $(python3 -c 'import torch; print(torch.__version__)' 2>&1 | tail -n1)"
    say "== nixl-core tcpstore tests"
    timeout 300 .carry/bin/tcpstore --nocapture --test-threads 2 > "$OUT/tcpstore.log" 2>&1
    echo "rc=$?" >> "$OUT/tcpstore.log"
    grep -E "^test |against PyTorch|SKIPPED|panicked|test result|rc=" "$OUT/tcpstore.log" | tee -a "$s"
    say "== NIXL 1.5.1 through a TCPStore"
    timeout 300 .carry/bin/nixl-interop metadata_by_tcpstore_both_ways --exact --nocapture > "$OUT/nixl-tcpstore.log" 2>&1
    echo "rc=$?" >> "$OUT/nixl-tcpstore.log"
    grep -E "^test |through|against|SKIPPED|panicked|test result|rc=" "$OUT/nixl-tcpstore.log" | tee -a "$s"
}

case "${1:-}" in
    build) build ;;
    run) run ;;
    *) echo "usage: scripts/gpu.sh tcpstore build|run" >&2; exit 2 ;;
esac
