#!/usr/bin/env bash
# nixl-sys 1.5.2's own test suite, unchanged, against the drop-in (compat/nixl-sys, issue 38).
#
# The published crate's tests/ (fetched and checksum-checked by scripts/deps/nixl-sys.sh, never
# copied into this repository) become the tests of a throwaway crate whose `nixl-sys`
# dependency is the drop-in, renamed as a user would rename it. An etcd on 127.0.0.1 serves
# their etcd test (it runs only when NIXL_ETCD_ENDPOINTS is set). At the end: passed / failed /
# not applicable, with the reason of each test that cannot run here.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
src="${NIXL_SYS_CRATE:?NIXL_SYS_CRATE is unset: run scripts/setup.sh (scripts/deps/nixl-sys.sh)}"
h="$root/target/nixl-sys-upstream"
rm -rf "$h"
mkdir -p "$h/src"
cp -r "$src/tests" "$h/tests"
: >"$h/src/lib.rs"
cat >"$h/Cargo.toml" <<TOML
[package]
name = "nixl-sys-upstream-tests"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
# The one line a nixl-sys user changes.
nixl-sys = { package = "nixl-rs-sys", path = "$root/compat/nixl-sys" }

[dev-dependencies]
tempfile = "3"

[workspace]
TOML
# The workspace's versions, so the build reuses what the suite built.
cp Cargo.lock "$h/Cargo.lock"

etcd_dir=$(mktemp -d)
ports=$(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
read -r cport pport <<<"$ports"
etcd --data-dir "$etcd_dir" --name nixl-sys-tests \
    --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
    --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "nixl-sys-tests=http://127.0.0.1:$pport" >"$etcd_dir/log" 2>&1 &
etcd_pid=$!
trap 'kill $etcd_pid 2>/dev/null || true; wait $etcd_pid 2>/dev/null || true; rm -rf "$etcd_dir"' EXIT
export NIXL_ETCD_ENDPOINTS="http://127.0.0.1:$cport"
# Ready before the tests (bounded): the etcd test must meet a server, not a start-up race.
for _ in $(seq 100); do
    python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $cport), 0.2)" 2>/dev/null && break
    sleep 0.1
done

log="$root/target/nixl-sys-upstream.log"
rc=0
CARGO_TARGET_DIR="$root/target" timeout 1200 cargo test --manifest-path "$h/Cargo.toml" \
    --no-fail-fast 2>&1 | tee "$log" || rc=1

python3 - "$log" "$src/tests" <<'PY' || rc=1
import re, sys, pathlib
log, tests = sys.argv[1], pathlib.Path(sys.argv[2])
upstream = {}
for f in ["tests.rs", "test_sync_manager.rs", "mem_view.rs"]:
    text = (tests / f).read_text()
    upstream[f] = re.findall(r"#\[test\]\s*(?:#\[[^\]]*\]\s*)*fn\s+(\w+)", text)
ran = {}
for line in open(log, errors="replace"):
    m = re.match(r"test (?:\S+::)?(\w+)(?: - should panic)? \.\.\. (ok|FAILED|ignored)", line)
    if m:
        ran[m.group(1)] = m.group(2)
# Tests that cannot run here, with why (docs/nixl-sys.md lists them).
na = {f: "NIXL's device API (GPU memory views); the file compiles only with cfg(has_cuda), "
         "which NIXL's build script sets beside a CUDA toolkit" for f in ["mem_view.rs"]}
counts = {"passed": 0, "failed": 0, "not applicable": 0}
for f, names in upstream.items():
    for n in names:
        if f in na:
            counts["not applicable"] += 1
            print(f"  n/a     {f}::{n}: {na[f]}")
        elif ran.get(n) == "ok":
            counts["passed"] += 1
        else:
            counts["failed"] += 1
            print(f"  FAILED  {f}::{n}: {ran.get(n, 'did not run')}")
total = sum(len(v) for v in upstream.values())
print(f"== nixl-sys 1.5.2's tests against nixl-rs-sys: {total} tests: "
      f"{counts['passed']} passed, {counts['failed']} failed, {counts['not applicable']} not applicable")
sys.exit(1 if counts["failed"] else 0)
PY
exit $rc
