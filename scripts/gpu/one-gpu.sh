#!/usr/bin/env bash
# GPU suite `one-gpu`: `scripts/gpu.sh one-gpu build` here, `scripts/gpu.sh one-gpu run` on
# the GPU machine.
#
# build:
# Builds the GPU test and bench binaries of nixl-mem HERE (a machine with the Rust toolchain)
# and copies them, stripped, to .carry/bin/ for scripts/gpu.sh one-gpu run on the GPU machine (which
# has no toolchain). The binaries load libcuda at run time, so no CUDA is needed to build.
# run:
# Runs nixl-mem's GPU tests and the CUDA_IPC bench on the GPU machine, from prebuilt binaries
# only (see scripts/gpu.sh one-gpu build, which puts them in .carry/bin/). Writes logs and results to
# $OUT and prints a summary: the tests, the bench (two processes, 1 and 4 MiB x 1024 blocks),
# and the copy kernel's shape sweep (gpu_bench --sweep: per-block VRAM<->VRAM WRITE and READ at
# 1 and 4 MiB x 1024 blocks for every shape of KernelShape::sweep(), table + best shape).
# A normal run takes about four minutes; bounded by the timeouts below (3 x 90 s tests, 150 s
# bench, 180 s sweep, optional 60 s copy-engine comparison with NIXL_GPU_CE=1). SKIP_BENCH=1
# runs the tests only.

build() (
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-mem}"
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols
BIN=.carry/bin
mkdir -p "$BIN"
cargo build --release -p nixl-bench --bin gpu_bench
cp "$CARGO_TARGET_DIR/release/gpu_bench" "$BIN/gpu_bench"
# Test executables: the lib's unit tests and the tests/gpu*.rs integration tests.
cargo test --release -p nixl-mem --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys, shutil
names = {("lib", "nixl_mem"): "nixl-mem-lib", ("test", "gpu"): "nixl-mem-gpu", ("test", "gpu_agent"): "nixl-mem-gpu-agent"}
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m.get("profile", {}).get("test"):
        continue
    t = m["target"]
    key = (t["kind"][0], t["name"])
    if key in names:
        shutil.copy(m["executable"], sys.argv[1] + "/" + names[key])
        print("copied", names[key])
' "$BIN"
ls -la "$BIN"
du -sh "$BIN"
)

run() (
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN="${NIXL_GPU_BIN:-.carry/bin}"
OUT="${OUT:-/tmp/nixl-gpu-out}"
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }

for b in nixl-mem-lib nixl-mem-gpu nixl-mem-gpu-agent gpu_bench; do
    if [ ! -x "$BIN/$b" ]; then say "missing $BIN/$b: run scripts/gpu.sh one-gpu build on the build machine and carry .carry"; exit 2; fi
done

{ nvidia-smi; nvidia-smi topo -m; } > "$OUT/nvidia-smi.txt" 2>&1 || true
say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
say "GPUs visible: $NGPU"
# With a GPU visible, a test that skips for want of one fails (nixl_core::testing::skip).
if [ "$NGPU" -ge 1 ]; then
    allow="nvidia-fs,s3,etcd,netns,nixl,efa,fi-hmem,rocm-gpu,libfabric,ucx,cuda-ucx,io-uring"
    [ "$NGPU" -ge 2 ] || allow="$allow,multi-gpu"
    export NIXL_REQUIRE_DEPS=1 NIXL_ALLOW_SKIP="${NIXL_ALLOW_SKIP:-$allow}"
fi

fail=0
for t in nixl-mem-lib nixl-mem-gpu nixl-mem-gpu-agent; do
    timeout 90 "$BIN/$t" --nocapture > "$OUT/$t.log" 2>&1
    rc=$?
    res=$(grep -E '^test result:' "$OUT/$t.log" | tail -1)
    say "tests $t: rc=$rc $res"
    grep -E '^skipping|SKIPPED|FAILED|panicked' "$OUT/$t.log" | head -20 | tee -a "$summary"
    [ $rc -eq 0 ] || fail=1
    if [ "$NGPU" -ge 1 ] && grep -qE '^skipping|SKIPPED\[gpu\]' "$OUT/$t.log"; then say "  ^ tests skipped although a GPU is visible"; fail=1; fi
done

# Tests that must have run and passed by name (a renamed or filtered test would hide them).
must_pass() { # log test
    if grep -q "test $2 \.\.\. ok" "$OUT/$1.log"; then say "  ok: $2"; else say "  NOT PASSED: $2 (see $1.log)"; fail=1; fi
}
must_pass nixl-mem-lib cuda::kernel::tests::the_ptx_copies_every_byte_when_simulated
must_pass nixl-mem-lib cuda::kernel::tests::every_sweep_shape_copies_every_byte_when_simulated
must_pass nixl-mem-lib cuda::kernel::tests::the_gpu_tests_first_request_races_and_the_fixed_one_does_not
must_pass nixl-mem-lib cuda::ptx_sim::tests::races_between_threads_are_reported
must_pass nixl-mem-lib cuda_ipc::complete::tests::the_thread_sends_without_polling_in_post_order
must_pass nixl-mem-lib cuda_ipc::complete::tests::a_real_event_ticket_is_sent_by_the_thread
must_pass nixl-mem-gpu-agent gpu_agent_notification_without_initiator_polling
must_pass nixl-mem-gpu-agent gpu_agent_copy_kernel_scatter_gather
# The conformance suite is a module of tests: every one of them must pass, and some must run.
n_ok=$(grep -c "^test gpu_conformance_suite::.* \.\.\. ok" "$OUT/nixl-mem-gpu-agent.log")
n_bad=$(grep -cE "^test gpu_conformance_suite::.* \.\.\. (FAILED|ignored)" "$OUT/nixl-mem-gpu-agent.log")
if [ "$n_ok" -gt 0 ] && [ "$n_bad" -eq 0 ]; then say "  ok: gpu_conformance_suite ($n_ok cases)"; else say "  NOT PASSED: gpu_conformance_suite ($n_ok ok, $n_bad failed or ignored)"; fail=1; fi
must_pass nixl-mem-gpu-agent gpu_agent_two_processes_vram_and_dram
must_pass nixl-mem-gpu-agent gpu_agent_a_killed_target_never_ends_done_unless_landed
must_pass nixl-mem-gpu-agent gpu_agent_a_peer_naming_this_process_is_refused
# Which engine the per-block VRAM copies used, and any fallback warning.
grep -hE 'path: .*copy kernel|copy kernel (unavailable|not prepared|launch failed)|did not load' "$OUT"/nixl-mem-gpu-agent.log | sort | uniq -c | head -5 | tee -a "$summary"

if [ "${SKIP_BENCH:-0}" = 1 ]; then
    say ""
    say "overall (tests only, SKIP_BENCH=1): $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
    exit $fail
fi

say ""
say "== gpu_bench: two processes, GPU 0 -> GPU 0, 1024 blocks per request =="
timeout 150 "$BIN/gpu_bench" --blocks 1024 --block-sizes 1,4 --iters 20 --out "$OUT/bench-gpu0.jsonl" > "$OUT/bench-gpu0.txt" 2>&1
rc=$?
tee -a "$summary" < "$OUT/bench-gpu0.txt"
[ $rc -eq 0 ] || { say "gpu_bench failed rc=$rc"; fail=1; }
if [ "$NGPU" -ge 1 ] && grep -q 'skipped' "$OUT/bench-gpu0.txt"; then say "gpu_bench skipped although a GPU is visible"; fail=1; fi
if [ "$NGPU" -ge 1 ] && grep -q 'copy kernel unavailable\|copy kernel not prepared\|copy kernel launch failed' "$OUT/bench-gpu0.txt"; then say "the copy kernel fell back to the copy engines (see the path column)"; fail=1; fi

say ""
say "== gpu_bench --sweep: copy kernel shapes, per-block VRAM<->VRAM, 1024 blocks of 1 and 4 MiB, GPU 0 =="
timeout 180 "$BIN/gpu_bench" --sweep --blocks 1024 --block-sizes 1,4 --iters 10 --reps 5 --out "$OUT/sweep-gpu0.jsonl" > "$OUT/sweep-gpu0.txt" 2> "$OUT/sweep-gpu0.log"
rc=$?
tee -a "$summary" < "$OUT/sweep-gpu0.txt"
tail -5 "$OUT/sweep-gpu0.log" | tee -a "$summary"
[ $rc -eq 0 ] || { say "gpu_bench --sweep failed rc=$rc (see sweep-gpu0.log)"; fail=1; }
if [ "$NGPU" -ge 1 ] && grep -q 'skipped' "$OUT/sweep-gpu0.txt"; then say "gpu_bench --sweep skipped although a GPU is visible"; fail=1; fi

if [ "${NIXL_GPU_CE:-0}" = 1 ]; then
    say ""
    say "== gpu_bench --no-copy-kernel (copy engines only, for comparison), 1 MiB blocks =="
    timeout 60 "$BIN/gpu_bench" --blocks 1024 --block-sizes 1 --iters 10 --no-copy-kernel --out "$OUT/bench-gpu0-copy-engines.jsonl" > "$OUT/bench-gpu0-copy-engines.txt" 2>&1
    rc=$?
    tee -a "$summary" < "$OUT/bench-gpu0-copy-engines.txt"
    [ $rc -eq 0 ] || { say "gpu_bench --no-copy-kernel failed rc=$rc"; fail=1; }
fi

if [ "$NGPU" -ge 2 ]; then
    say ""
    say "== gpu_bench: two processes, GPU 0 -> GPU 1 =="
    timeout 60 "$BIN/gpu_bench" --blocks 1024 --block-sizes 1 --iters 10 --target-gpu 1 --out "$OUT/bench-gpu01.jsonl" > "$OUT/bench-gpu01.txt" 2>&1
    rc=$?
    tee -a "$summary" < "$OUT/bench-gpu01.txt"
    [ $rc -eq 0 ] || { say "gpu_bench (2 GPUs) failed rc=$rc"; fail=1; }
fi

say ""
say "overall: $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
exit $fail
)

case "${1:-}" in
    build | run) "$1" ;;
    *) echo "usage: scripts/gpu.sh one-gpu build|run" >&2; exit 2 ;;
esac
