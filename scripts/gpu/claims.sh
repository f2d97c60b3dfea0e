#!/usr/bin/env bash
# GPU suite `claims` (issue 39): every GPU test, and every GPU bench a claim in README.md or
# docs/perf/*.md cites, in ONE device call per machine kind, with the summary the docs quote.
#
#   scripts/gpu.sh claims build   HERE (toolchain, PyPI; no CUDA needed): every binary below,
#                                 packed into .carry/claims/ (xz; under the 64 MiB a call carries)
#   scripts/gpu.sh claims run     on the GPU machine (carry [".carry/claims"]): unpacks, runs
#                                 the parts of this machine kind, each under its own timeout,
#                                 and writes $OUT/claims-summary.txt (scripts/gpu/claims_summary.py)
#
# Parts (time caps in seconds; the one-GPU parts together stay under one device call's ten
# minutes, CLAIMS_ONLY="part ..." runs some of them):
#   tests      nixl-mem (lib, gpu, gpu_agent, gpu_blocks, async_gpu, arrival_gpu), the GDS/POSIX
#              VRAM tests, the UCX VRAM tests; kill cases at NIXL_KILLS (the tests' default, 6) per op
#   paged      gpu_bench, 1024 blocks of 1 and 4 MiB, two processes (docs/perf/gpu.md's table)
#   main       the main job over CUDA_IPC, 512 MiB requests of 64 KiB blocks, READ and WRITE
#              (README), and 8,192-descriptor requests of 16 and 64 KiB in bursts of 8 beside
#              paged_bench at the same request size (issue 37's main job / paged)
#   handover   the handover bench beside NIXL 1.5.1's Python API (README: first contact, a
#              16k-token Llama-3-8B request), one round
#   arrival    examples/layerwise at Llama-3-70B's shape (layer 0 usable vs the whole request)
#   two-gpu    only where two GPUs are visible: nixl-mem's two-GPU tests, paged blocks and the
#              main job both ways (GPU 0 -> 1 and 1 -> 0), WRITE and READ; `arrival` then runs
#              the layer-wise example between the GPUs
# A part that fails marks the run FAIL (the summary says which); a test that skips for want of
# the GPU, cuFile or a CUDA-aware UCX fails its binary (NIXL_REQUIRE_DEPS).
# shellcheck source=scripts/gpu/pick.sh
. "$(dirname "$0")/pick.sh"
set -uo pipefail

C=.carry/claims

build() (
set -euo pipefail
release_env /work/target-gpu fresh
export CARGO_PROFILE_BENCH_DEBUG=0 CARGO_PROFILE_BENCH_STRIP=symbols
# nixl-mem's GPU tests, gpu_bench, the storage binaries, the UCX VRAM test, UCX's libraries.
bash scripts/gpu.sh ucx build
local_bin=.carry/bin
for t in gpu_blocks async_gpu arrival_gpu two_gpus kv_gpus; do
    cp "$(cargo test --release -p nixl-mem --test "$t" --no-run --message-format=json 2>/dev/null | pick "$t")" "$local_bin/test-$t"
done
for e in disagg_kv layerwise; do
    cp "$(cargo build --release --example "$e" --message-format=json 2>/dev/null | pick "$e")" "$local_bin/$e"
done
for b in paged_bench handover; do
    cp "$(cargo build --release -p nixl-bench --bin "$b" --message-format=json 2>/dev/null | pick "$b")" "$local_bin/$b"
done
# NIXL 1.5.1 for CPython 3.12, slim (.carry/nixl312), for the handover bench's NIXL side.
[ -d .carry/nixl312 ] || bash scripts/gpu.sh nixl build
rm -rf "$C" && mkdir -p "$C"
tar -C .carry -cJf "$C/bin.tar.xz" bin ucx $( [ -d .carry/libucx_cu13.libs ] && echo libucx_cu13.libs )
tar -C .carry -cJf "$C/nixl312.tar.xz" nixl312
git rev-parse HEAD > "$C/commit"
git status --porcelain --untracked-files=no | head -n 20 > "$C/dirty"
ls -la "$C"
local size
size=$(du -sm "$C" | cut -f1)
echo "carry $C: ${size} MiB"
[ "$size" -lt 64 ] || { echo "$C is over the 64 MiB the device tool carries" >&2; exit 1; }
)

# One part: NAME CAP COMMAND...; its output to $OUT/NAME.log, rc and seconds to the summary.
part() {
    local name=$1 cap=$2 t0 rc
    shift 2
    t0=$(date +%s)
    timeout "$cap" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "rc=$rc" >> "$OUT/$name.log"
    say "part $name: rc=$rc $(( $(date +%s) - t0 )) s (cap $cap s)"
    [ $rc -eq 0 ] || fail=1
}

wanted() { [ -z "${CLAIMS_ONLY:-}" ] || [[ " $CLAIMS_ONLY " == *" $1 "* ]]; }

run_tests() {
    local b=$W/bin t rc bad=0
    # nixl-mem's lib, gpu and gpu_agent tests with their must-pass names; the storage tests
    # (POSIX bounce, GDS plain and in cuFile's compat mode): the suites' own runs, our binaries.
    NIXL_GPU_BIN=$b SKIP_BENCH=1 bash scripts/gpu.sh one-gpu run || bad=1
    NIXL_GPU_BIN=$b SKIP_BENCH=1 bash scripts/gpu.sh storage run || bad=1
    gpu_test_env
    [ "$NGPU" -ge 2 ] || export NIXL_ALLOW_SKIP="$NIXL_ALLOW_SKIP,multi-gpu"
    for t in test-gpu_blocks test-async_gpu test-arrival_gpu; do
        timeout 120 "$b/$t" --test-threads 1 --nocapture > "$OUT/$t.log" 2>&1
        rc=$?
        echo "tests $t: rc=$rc $(grep -a -E '^test result:' "$OUT/$t.log" | tail -n1)"
        [ $rc -eq 0 ] || bad=1
    done
    (
        use_carried_ucx "$W"
        export UCX_MODULES='^ib,rdmacm'
        export NIXL_ALLOW_SKIP="$NIXL_ALLOW_SKIP,multi-gpu,s3,etcd,netns,libfabric"
        timeout 150 "$b/ucx-vram" --nocapture > "$OUT/ucx-vram.log" 2>&1
        rc=$?
        echo "tests ucx-vram: rc=$rc $(grep -a -E '^test result:' "$OUT/ucx-vram.log" | tail -n1)"
        exit $rc
    ) || bad=1
    return $bad
}

run_paged() {
    "$W/bin/gpu_bench" --blocks 1024 --block-sizes 1,4 --iters 20 --out "$OUT/paged.jsonl"
}

run_main() {
    local b=$W/bin op bb rc=0
    for op in write read; do
        echo "== main: disagg_kv --device cuda --gpus 0,0 --op $op --layers 4 --blocks 4096 --blocks-per-request 2048 --block-bytes 65536 --requests 16"
        "$b/disagg_kv" --device cuda --gpus 0,0 --op "$op" --layers 4 --blocks 4096 --blocks-per-request 2048 \
            --block-bytes 65536 --requests 16 2>&1 | tail -n 12 || rc=1
    done
    for bb in 16384 65536; do
        for op in read write; do
            # The first burst (the copy kernel's load, staging buffers) is left out, as the
            # paged benchmark warms up.
            echo "== burst: disagg_kv --device cuda --gpus 0,0 --op $op --layers 4 --blocks 16384 --blocks-per-request 2048 --block-bytes $bb --requests 48 --burst 8 --warmup 1"
            "$b/disagg_kv" --device cuda --gpus 0,0 --op "$op" --layers 4 --blocks 16384 --blocks-per-request 2048 \
                --block-bytes "$bb" --requests 48 --burst 8 --warmup 1 2>&1 | tail -n 12 || rc=1
        done
    done
    echo "== paged_bench --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536"
    "$b/paged_bench" --gpu 0 --target-gpu 0 --blocks 8192 --block-bytes 16384,65536 --iters 20 --reps 3 \
        --json "$OUT/main-paged.jsonl" 2>&1 | tail -n 20 || rc=1
    return $rc
}

run_handover() {
    local n="$W/nixl312" ucx
    ucx="$(ls "$n"/nixl_cu1*.libs/libucp-*.so* | head -n1)"
    python3 benches/reference/compare_handover.py --handover "$W/bin/handover" \
        --nixl-path "$n" --ucx "$ucx" --rounds 1 --timeout 100 --out "$OUT/handover.json" -- \
        --device cuda --gpus 0,0 --model llama3-8b --tp 1 --tokens 1024,16384 --contacts 3 --requests 5 --lists flat
}

run_arrival() {
    # GPU 0 -> GPU 1 where there are two, else within GPU 0 (the example picks).
    echo "== layerwise --layers 160 --blocks 2048 --block-kib 32"
    "$W/bin/layerwise" --layers 160 --blocks 2048 --block-kib 32
}

run_two_gpu() {
    local b=$W/bin rc=0 t g op
    gpu_test_env
    for t in test-two_gpus test-kv_gpus; do
        timeout 150 "$b/$t" --test-threads 1 --nocapture > "$OUT/$t.log" 2>&1 || rc=1
        echo "$t $(grep -a -E '^test result:' "$OUT/$t.log" | tail -n1)"
    done
    # Both directions (either GPU's process initiating), WRITE and READ.
    for g in "0 1" "1 0"; do
        set -- $g
        echo "== paged_bench --gpu $1 --target-gpu $2 --blocks 2048 --block-bytes 4096,16384,65536,1048576"
        "$b/paged_bench" --gpu "$1" --target-gpu "$2" --blocks 2048 --block-bytes 4096,16384,65536,1048576 \
            --iters 20 --reps 3 --json "$OUT/two-gpu-paged-$1$2.jsonl" 2>&1 | tail -n 20 || rc=1
        for op in write read; do
            echo "== main: disagg_kv --device cuda --gpus $1,$2 --op $op --layers 4 --blocks 4096 --blocks-per-request 2048 --block-bytes 65536 --requests 16"
            "$b/disagg_kv" --device cuda --gpus "$1,$2" --op "$op" --layers 4 --blocks 4096 --blocks-per-request 2048 \
                --block-bytes 65536 --requests 16 2>&1 | tail -n 12 || rc=1
        done
    done
    return $rc
}

run() (
set -uo pipefail
start_summary claims /tmp/nixl-claims-out
[ -f "$C/bin.tar.xz" ] || { say "missing $C: run scripts/gpu.sh claims build and carry .carry/claims"; exit 2; }
W=$(mktemp -d /tmp/nixl-claims.XXXXXX)
tar -C "$W" -xJf "$C/bin.tar.xz" && tar -C "$W" -xJf "$C/nixl312.tar.xz" || { say "unpacking failed"; exit 2; }
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
say "== claims run: commit $(cat "$C/commit") $( [ -s "$C/dirty" ] && echo '(with uncommitted changes)'); $(date -u +%FT%TZ)"
say "== host: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n1); GPUs $NGPU; $(nproc) cores; $(python3 -V 2>&1)"
{ nvidia-smi; nvidia-smi topo -m; } > "$OUT/nvidia-smi.txt" 2>&1
export W NGPU OUT
fail=0
wanted tests && part tests "${CAP_TESTS:-180}" bash -o pipefail -c "$(declare -f run_tests use_carried_ucx gpu_test_env); run_tests"
wanted paged && part paged "${CAP_PAGED:-110}" bash -o pipefail -c "$(declare -f run_paged); run_paged"
wanted main && part main "${CAP_MAIN:-150}" bash -o pipefail -c "$(declare -f run_main); run_main"
wanted handover && part handover "${CAP_HANDOVER:-120}" bash -o pipefail -c "$(declare -f run_handover); run_handover"
wanted arrival && part arrival "${CAP_ARRIVAL:-30}" bash -o pipefail -c "$(declare -f run_arrival); run_arrival"
if [ "$NGPU" -ge 2 ] && wanted two-gpu; then
    part two-gpu "${CAP_TWO_GPU:-240}" bash -o pipefail -c "$(declare -f run_two_gpu gpu_test_env); run_two_gpu"
fi
python3 scripts/gpu/claims_summary.py "$OUT" >> "$s" 2>&1 || fail=1
say "claims run: $([ $fail -eq 0 ] && echo PASS || echo FAIL)${CLAIMS_ONLY:+ (parts: $CLAIMS_ONLY only)}"
# Every log in one archive beside the summary (the device tool returns few files per call).
(cd "$OUT" && find . -maxdepth 1 -type f ! -name claims-summary.txt ! -name claims-logs.tar.xz -printf '%P\n' \
    | tar -cJf claims-logs.tar.xz -T - --remove-files)
rm -rf "$W"
exit $fail
)

case "${1:-}" in
    build) build ;;
    run) run ;;
    *) echo "usage: scripts/gpu.sh claims build|run" >&2; exit 2 ;;
esac
