#!/usr/bin/env bash
# Runs an unpack fuzz target (unpack_address or unpack_key) in libFuzzer's fork mode (each job a
# child process, so a crash is caught, reported and counted while fuzzing goes on), then sums
# what the jobs counted: inputs, loaded, refused, and how many reached fi_av_insert and an RMA.
#
#   scripts/fuzz-unpack.sh unpack_address 600     # target, seconds (default 600)
#
# Needs root (a nightly toolchain and cargo-fuzz too): it runs in its own network namespace
# (loopback only: mutated addresses name hosts nobody can reach, so connects fail at once and
# nothing leaves the machine) and mount namespace with a private /dev/shm (fork-mode jobs end
# with exit(), leaving their shm regions behind; they go with the namespace, and no mutated shm
# name can reach another program's regions).
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: $0 unpack_address|unpack_key [seconds]}
secs=${2:-600}
stats=$(mktemp -d /tmp/nixl-lf-fuzz-stats.XXXXXX)
log=${NIXL_FUZZ_LOG:-/tmp/nixl-lf-fuzz-$target.log}
cargo +nightly fuzz build -O "$target"
start=$(date +%s)
unshare --net --mount --propagation private sh -c '
    set -e
    mount -t tmpfs -o size=8g tmpfs /dev/shm
    ip link set lo up
    ASAN_OPTIONS=detect_leaks=0 NIXL_FUZZ_STATS="$1" cargo +nightly fuzz run -O "$2" -- \
        -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 -timeout=60 \
        -detect_leaks=0 -max_total_time="$3"
' sh "$stats" "$target" "$secs" 2>&1 | tee "$log" | grep -E '^#[0-9]+: |INFO: fuzzed|crash|CRASH|deadly|==ERROR' || true
end=$(date +%s)
echo "== $target: $((end - start)) s wall; libFuzzer's last status:"
grep -E '^#[0-9]+: ' "$log" | tail -n 1
echo "== summed over $(ls "$stats" | wc -l) job processes:"
cat "$stats"/* | awk '{ for (i = 1; i < NF; i += 2) sum[$i] += $(i + 1) }
    END { for (k in sum) printf "%s %d ", k, sum[k]; printf "\n" }'
rm -rf "$stats"
