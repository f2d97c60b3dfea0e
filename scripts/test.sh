#!/usr/bin/env bash
# Sets up the machine (scripts/setup.sh) and runs the whole test suite: every crate, every
# feature that builds without a GPU (unit, scenario, conformance, two-process and doc tests),
# then the main job (examples/disagg_kv) in both directions, which verifies every byte, on one
# host and across a network between two (`--hosts 2`: network namespaces, needs root).
#
# A test whose dependency is missing fails here instead of passing silently
# (nixl_core::testing): every dependency the set-up installs is required; only what a CPU
# machine cannot have may skip (NIXL_ALLOW_SKIP). The skips are counted by reason at the end.
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh -p nixl-core`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
source .deps/env.sh

export NIXL_REQUIRE_DEPS="${NIXL_REQUIRE_DEPS:-1}"
export NIXL_ALLOW_SKIP="${NIXL_ALLOW_SKIP:-gpu,multi-gpu,rocm-gpu,cuda-ucx,efa,fi-hmem,nvidia-fs,ucx-1.23,torch}"
# NIXL's wheel bundles UCX 1.23 with ib/rdmacm modules whose libnl crashes at process exit;
# machines without an RDMA device have no use for those modules.
if [ -z "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
    export UCX_MODULES="${UCX_MODULES:-^ib,rdmacm}"
fi
export NIXL_SKIP_LOG="${NIXL_SKIP_LOG:-$(pwd)/target/skips.log}"
mkdir -p "$(dirname "$NIXL_SKIP_LOG")"
: >"$NIXL_SKIP_LOG"

skip_summary() {
    echo "== skipped tests by missing dependency (required here: all but $NIXL_ALLOW_SKIP):"
    if [ -s "$NIXL_SKIP_LOG" ]; then
        cut -f1 "$NIXL_SKIP_LOG" | sort | uniq -c | sort -rn
        echo "   (details: $NIXL_SKIP_LOG)"
    else
        echo "   none"
    fi
}
trap skip_summary EXIT

echo "== NIXL interop tests run against: nixl-cu13 $(PYTHONPATH="${NIXL_PYTHONPATH:-}" python3 -c 'from importlib.metadata import version; print(version("nixl-cu13"))' 2>/dev/null || echo 'MISSING (scripts/deps/nixl.sh)'), UCX $(basename "${NIXL_WHEEL_UCX:-none}")"
cargo test --workspace --all-features --no-fail-fast "$@"
# Every NIXL in the field (issue 40): the interop tests (metadata blob, side channel both
# roles, etcd keys, notifications, READ and WRITE both ways, restarts, kills) against each
# version the set-up installed, each with the UCX its wheel carries; a matrix at the end.
echo "== NIXL versions in the field: nixl-backend-ucx's interop tests against each"
interop_matrix() {
    local rc=0 logs=()
    if [ -z "${NIXL_OLDER:-}" ] && [ "$NIXL_REQUIRE_DEPS" != 0 ]; then
        echo "interop matrix: no older NIXL installed (NIXL_OLDER empty; scripts/deps/nixl.sh)" >&2
        rc=1
    fi
    for entry in "1.5.1=${NIXL_PYTHONPATH:-}=${NIXL_WHEEL_UCX:-}" ${NIXL_OLDER:-}; do
        IFS='=' read -r v pp ucp <<<"$entry"
        local log="target/interop-nixl-$v.log"
        echo "-- NIXL $v, its UCX $(basename "$ucp")"
        # The path must hold that version: a matrix column is never another version's run.
        local got
        got=$(PYTHONPATH="$pp" python3 -c 'from importlib.metadata import version; print(version("nixl-cu13"))' 2>&1)
        if [ "$got" != "$v" ]; then
            echo "interop matrix: $pp holds nixl-cu13 $got, not $v" >&2
            rc=1
            continue
        fi
        if ! NIXL_PYTHONPATH="$pp" NIXL_WHEEL_UCX="$ucp" timeout 600 cargo test -p nixl-backend-ucx \
            --all-features --test nixl_interop -- --test-threads 2 >"$log" 2>&1; then
            rc=1
            grep -E "panicked|FAILED" "$log" | head -20
        fi
        logs+=("$v=$log")
    done
    python3 - "${logs[@]}" <<'PY'
import re, sys
cols, rows = [], {}
for arg in sys.argv[1:]:
    v, log = arg.split("=", 1)
    cols.append(v)
    for line in open(log, errors="replace"):
        m = re.match(r"test (\S+) \.\.\. (ok|FAILED|ignored)", line)
        if m:
            rows.setdefault(m.group(1), {})[v] = m.group(2)
print("| interop test | " + " | ".join("NIXL " + c for c in cols) + " |")
print("|---|" + "---|" * len(cols))
for t in sorted(rows):
    print(f"| {t} | " + " | ".join(rows[t].get(c, "MISSING") for c in cols) + " |")
PY
    return $rc
}
interop_matrix
# The nixl-sys drop-in (issue 38): nixl-sys 1.5.2's own tests, unchanged, against compat/nixl-sys.
echo "== nixl-sys 1.5.2's test suite against the drop-in (compat/nixl-sys)"
bash scripts/nixl-sys-tests.sh
echo "== a block manager shaped like Dynamo's, on the nixl-sys API (host -> disk -> host, then to a second process)"
cargo run --quiet -p nixl-rs-sys --example block_manager -- --blocks 64 --block-bytes 65536
echo "== quick start (docs/concepts.md, two processes over UCX)"
cargo run --quiet --all-features --example quickstart
for op in write read; do
    echo "== main job: disagg_kv --op $op"
    cargo run --quiet --all-features --example disagg_kv -- --op "$op" --requests 8 --layers 4 --blocks 64 --block-bytes 65536
    echo "== main job, bursts of 4 requests on disjoint blocks, made on two threads: disagg_kv --op $op --burst 4 --make-threads 2"
    cargo run --quiet --all-features --example disagg_kv -- --op "$op" --requests 8 --burst 4 --make-threads 2 --layers 4 --blocks 64 --blocks-per-request 16 --block-bytes 65536
    echo "== main job, a warm-up burst left out, each burst made before it is posted: disagg_kv --op $op --burst 4 --warmup 1 --post-after-make"
    out=$(cargo run --quiet --all-features --example disagg_kv -- --op "$op" --requests 12 --burst 4 --warmup 1 --post-after-make --layers 4 --blocks 64 --blocks-per-request 16 --block-bytes 65536)
    echo "$out" | grep -v '^\[' || true
    echo "$out" | grep -qF "posted back to back (first post to last done): 2 bursts" \
        || { echo "disagg_kv --warmup 1 --post-after-make: no line for the 2 bursts measured" >&2; exit 1; }
done
for role in prefill decode; do
    echo "== main job with a stock NIXL agent: disagg_kv --nixl-peer --role $role"
    cargo run --quiet --all-features --example disagg_kv -- --nixl-peer --role "$role" --op write --requests 4 --layers 4 --blocks 64 --block-bytes 65536
done
# The handover benchmark beside NIXL (issue 37) at a small shape, both list kinds: each side
# checks every byte of its first and last requests; the comparison exits non-zero if either fails.
for lists in flat strided; do
    echo "== handover beside NIXL (--lists $lists)"
    cargo build --quiet -p nixl-bench --bin handover
    python3 benches/reference/compare_handover.py --handover target/debug/handover --rounds 1 --timeout 120 -- \
        --model llama3-70b --tp 8 --layers 4 --tokens 16,64 --contacts 2 --requests 3 --lists "$lists"
done
echo "== main job with KV layouts: prefill TP 2 (HND, 16-token blocks) -> decode TP 4 (32-token blocks), and TP 4 -> 2 writes"
cargo run --quiet --all-features --example disagg_kv -- --tp 2:4 --kv-order hnd --block-tokens 16:32 --op read --requests 2 --layers 2 --tokens 70
cargo run --quiet --all-features --example disagg_kv -- --tp 4:2 --op write --requests 2 --layers 2 --tokens 70
echo "== main job with authentication on (a cluster credential for the side channel, metadata and hellos)"
cargo run --quiet --all-features --example disagg_kv -- --op write --requests 4 --layers 4 --blocks 64 --block-bytes 65536 --auth
echo "== main job, metadata through a c10d TCPStore (prefill serves it): disagg_kv --metadata tcpstore"
cargo run --quiet --all-features --example disagg_kv -- --metadata tcpstore --op read --requests 4 --layers 4 --blocks 64 --block-bytes 65536
echo "== storage tiers: kv_offload (DRAM -> file -> S3 and back, every hop verified), as README documents it"
cargo run --quiet --all-features --example kv_offload -- --blocks 32 --block-kib 256
echo "== main job over libfabric (shm)"
cargo run --quiet --all-features --example disagg_kv -- --op write --requests 4 --layers 4 --blocks 64 --block-bytes 65536 --backend libfabric --provider shm
# Across a network: prefill and decode on two hosts (network namespaces joined by a virtual
# link; needs root), each backend over tcp, metadata over the side channel, over etcd and over a
# c10d TCPStore (both on prefill's host); the run fails unless every byte is verified and the path report names
# the network transport. Skipped (and counted as a netns skip) where namespaces cannot be made.
netns_or_skip() {
    [ "$(id -u)" -eq 0 ] && return 0
    printf 'netns\tdisagg_kv --hosts 2\tnot root\n' >>"$NIXL_SKIP_LOG"
    case ",$NIXL_ALLOW_SKIP," in
    *,netns,*) ;;
    *) if [ "$NIXL_REQUIRE_DEPS" != 0 ]; then
        echo "disagg_kv --hosts 2 needs root (network namespaces), which this run requires" >&2
        exit 1
    fi ;;
    esac
    echo "SKIPPED[netns] disagg_kv --hosts 2: not root"
    return 1
}
netns_or_skip && for backend in ucx libfabric; do
    for meta in side-channel etcd tcpstore; do
        for op in write read; do
            echo "== main job on two hosts: disagg_kv --hosts 2 --backend $backend --metadata $meta --op $op"
            cargo run --quiet --all-features --example disagg_kv -- --hosts 2 --backend "$backend" \
                --metadata "$meta" --op "$op" --requests 4 --layers 4 --blocks 64 --block-bytes 65536
        done
    done
done
# The disk the run took (CI's fresh root has about 8 GiB for the toolchain's builds: the dev
# profile keeps debug info out of the binaries, Cargo.toml).
echo "== disk: target/ holds $(du -sh target 2>/dev/null | cut -f1); $(df -h --output=avail . | tail -n 1 | tr -d ' ') free"
