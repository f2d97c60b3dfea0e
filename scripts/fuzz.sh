#!/usr/bin/env bash
# Runs every fuzz target (or those named) for SECONDS each, instrumented for coverage on the
# stable toolchain (libFuzzer's sanitizer-coverage passes; no nightly, no AddressSanitizer).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]        default 60 s, every target; a target is
#                                                CRATE/NAME (core, mem, ucx, libfabric:
#                                                ucx/unpack_rkey) or a NAME (in every crate)
#   FUZZ_JOBS=2 scripts/fuzz.sh ...              targets run two at a time (default: 2)
#   FUZZ_FORK=1 scripts/fuzz.sh ...              the UCX and libfabric targets in libFuzzer's
#                                                fork mode (a job per process; stats summed)
#
# Targets that create UCX or libfabric endpoints from mutated bytes run in their own network,
# pid, IPC and mount namespaces (loopback only, a private /dev/shm): a mutant may name a
# host and port, a pid for CMA or a shared memory segment, and must reach nothing outside.
# Without the namespaces (no root, no user namespaces) those targets fail instead of running
# unconfined.
#
# Each target prints one summary line (runs, coverage, and for the UNPACK targets how many
# inputs loaded and reached ucp_ep_create / rkey unpack / fi_av_insert / RMA posts); the log
# of each is kept under target/fuzz-smoke/logs. Exit status: non-zero if any target crashed,
# leaked, timed out or could not run.
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
jobs=${FUZZ_JOBS:-2}
[ -f .deps/env.sh ] && source .deps/env.sh
out=target/fuzz-smoke
triple=$(rustc -vV | sed -n 's/^host: //p')
flags="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
rm -rf "$out/failed"
mkdir -p "$out/logs" "$out/corpus" "$out/artifacts" "$out/failed"

# Every target as CRATE/NAME, and the fuzz crate of each.
declare -A crate_of=()
for d in nixl-core/fuzz nixl-mem/fuzz nixl-backend-ucx/fuzz nixl-backend-libfabric/fuzz; do
    short=${d%/fuzz}; short=${short#nixl-backend-}; short=${short#nixl-}
    for t in $(sed -n 's/^name = "\(.*\)"/\1/p' "$d/Cargo.toml" | tail -n +2); do
        crate_of[$short/$t]=$d
    done
done
all=($(printf '%s\n' "${!crate_of[@]}" | sort))
targets=()
for want in "$@"; do
    n=0
    for t in "${all[@]}"; do
        if [ "$t" = "$want" ] || [ "${t#*/}" = "$want" ]; then targets+=("$t"); n=$((n + 1)); fi
    done
    [ $n -gt 0 ] || { echo "unknown fuzz target $want (known: ${all[*]})"; exit 2; }
done
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")

echo "== building fuzz targets (instrumented, release)"
# Each crate in its own target directory: two crates have targets of the same name.
for t in "${targets[@]}"; do echo "${t%%/*} ${crate_of[$t]}"; done | sort -u | while read -r short d; do
    RUSTFLAGS="$flags" cargo build -q --release --locked --target "$triple" \
        --manifest-path "$d/Cargo.toml" --target-dir "$out/build/$short" || exit 1
done || exit 1

# Whether a target makes endpoints from mutated bytes (runs confined).
confined() { [[ $1 == ucx/unpack_* || $1 == libfabric/unpack_* ]]; }
# How to confine: as root, or in a user namespace where this kernel allows one.
ns=(unshare --net --pid --ipc --mount --fork --mount-proc)
if [ "$(id -u)" != 0 ]; then ns=(unshare --user --map-root-user "${ns[@]:1}"); fi
need_ns=0
for t in "${targets[@]}"; do confined "$t" && need_ns=1; done
if [ $need_ns = 1 ] && ! "${ns[@]}" true 2> /dev/null; then
    echo "fuzz: cannot create network, pid, IPC and mount namespaces (${ns[*]}): the UCX and"
    echo "libfabric targets would reach this machine's processes and network; not running them"
    exit 1
fi

run_one() {
    local t=$1 id=${1/\//-}
    local log="$out/logs/$id.log" stats="$out/stats/$id" rc
    local exe="$out/build/${t%%/*}/$triple/release/${t#*/}"
    rm -rf "$stats"; mkdir -p "$stats" "$out/corpus/$id" "$out/artifacts/$id"
    local args=(-max_total_time="$secs" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1
        -artifact_prefix="$out/artifacts/$id/" "$out/corpus/$id")
    if confined "$t" && [ "${FUZZ_FORK:-0}" != 0 ]; then
        args=(-fork="${FUZZ_FORK}" "${args[@]}")
    fi
    local start=$SECONDS
    if confined "$t"; then
        # Every confined fuzzer is pid 1: its own TMPDIR keeps fork mode's files (named by
        # pid) apart.
        rm -rf "$out/tmp/$id"; mkdir -p "$out/tmp/$id"
        TMPDIR="$PWD/$out/tmp/$id" NIXL_FUZZ_STATS="$PWD/$stats" "${ns[@]}" \
            bash -c 'ip link set lo up && mount -t tmpfs -o size=1g tmpfs /dev/shm && exec "$@"' \
            confined "$exe" "${args[@]}" > "$log" 2>&1
        rc=$?
    else
        "$exe" "${args[@]}" > "$log" 2>&1
        rc=$?
    fi
    local cov runs unpack=""
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
    [ -z "$runs" ] && runs=$(grep -oE '#[0-9]+' "$log" | tail -1 | tr -d '#')
    if ls "$stats"/* > /dev/null 2>&1; then
        # Sum the per-process counters ("name value" pairs) over every job.
        unpack=$(cat "$stats"/* | awk '{for (i = 1; i < NF; i += 2) s[$i] += $(i + 1); if (!o) o = $0}
            END {n = split(o, f, " "); for (i = 1; i < n; i += 2) printf "%s %d ", f[i], s[f[i]]}')
    fi
    if [ $rc -eq 0 ]; then
        printf 'FUZZ %-26s ok    %4ss runs %-9s %-10s %s\n' "$t" $((SECONDS - start)) "${runs:-?}" "${cov:-cov: ?}" "$unpack"
    else
        printf 'FUZZ %-26s FAIL  rc %s after %ss (log %s):\n' "$t" "$rc" $((SECONDS - start)) "$log"
        # libFuzzer's and Rust's own lines first: a UCX target logs an ERROR per refused peer,
        # which would otherwise crowd the finding out.
        grep -E 'libFuzzer|panicked|SUMMARY|Test unit written|Base64:|==[0-9]+==|^ *#[0-9]+ 0x' "$log" |
            grep -v ' UCX ' | head -30 | sed 's/^/    /'
        tail -5 "$log" | sed 's/^/    /'
        # The short form, printed again at the end: what failed, how, and the input.
        {
            printf 'FUZZ %s FAIL rc %s after %ss\n' "$t" "$rc" $((SECONDS - start))
            grep -E 'libFuzzer: |panicked at|Test unit written|Base64:' "$log" | head -4 | cut -c1-400 | sed 's/^/    /'
        } > "$out/failed/$id.txt"
    fi
    return $rc
}

echo "== running ${#targets[@]} targets for ${secs}s each, $jobs at a time"
fail=0
pids=()
for t in "${targets[@]}"; do
    run_one "$t" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$jobs" ]; then
        wait "${pids[0]}" || fail=1
        pids=("${pids[@]:1}")
    fi
done
for p in "${pids[@]}"; do wait "$p" || fail=1; done
if [ $fail -eq 0 ]; then
    echo "== fuzz: every target ran ${secs}s without a finding"
else
    # Again at the end, where a reader of only the last lines (CI's recap) sees which target.
    echo "== fuzz: FAILED:"
    cat "$out"/failed/*.txt 2> /dev/null
fi
exit $fail
