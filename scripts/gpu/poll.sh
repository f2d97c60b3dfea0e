#!/usr/bin/env bash
# GPU suite `poll`: `scripts/gpu.sh poll build` here, `scripts/gpu.sh poll run` on the GPU
# machine, whose host has many cores: the quiet place to measure how long an async poll holds
# its executor's thread and how late a future's deadline ends it (issue 33), where the 2-core
# development VM's scheduler adds milliseconds of its own.
#
# build:
#   .carry/bin/poll   the poll bench (benches/poll.rs, release, stripped)
#   .carry/ucx/lib    UCX 1.22's shared libraries (stripped), as scripts/gpu/ucx.sh carries them
# Carry [".carry"] (under 64 MiB).
# run:
#   the poll bench in full (1,000 requests per path and phase, the idle table) over UCX tcp,
#   UCX cma, UCX direct CMA and INPROC (libfabric is not installed there: its row says so);
#   results in $OUT/poll.log and a summary in $OUT/poll-summary.txt.
# shellcheck source=scripts/gpu/pick.sh
. "$(dirname "$0")/pick.sh"

build() (
set -euo pipefail
release_env /work/target-gpu
mkdir -p .carry/bin
exe=$(cargo bench -p nixl-bench --bench poll --no-run --message-format=json 2>/dev/null | pick poll)
cp "$exe" .carry/bin/poll
carry_ucx "${NIXL_UCX_HOME:-/opt/nixl-deps/ucx/libucx}"
carry_fits
)

run() (
set -uo pipefail
start_summary poll /tmp/nixl-poll-out
[ -x .carry/bin/poll ] || { say "missing .carry/bin/poll: run scripts/gpu.sh poll build and carry .carry"; exit 2; }
say "== host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
use_carried_ucx
export UCX_MODULES='^ib,rdmacm,cuda'
timeout 540 .carry/bin/poll --bench --paths ucx-tcp,ucx-cma,ucx-direct-cma,inproc > "$OUT/poll.log" 2>&1
say "rc=$?"
grep -E '^\||^Async|^Idle' "$OUT/poll.log" | tee -a "$s"
)

case "${1:-}" in
build) build ;;
run) run ;;
*) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
