#!/usr/bin/env bash
# GPU suite `two-gpu` (issue 24): `scripts/gpu.sh two-gpu build` here, `scripts/gpu.sh two-gpu
# run` on a two-GPU machine (kind nvidia-h100-x2 / nvidia-h200-x2). Carry [".carry/bin",
# ".carry/nixl312"].
#
# issue 24 on a two-GPU machine (kind nvidia-h100-x2 / nvidia-h200-x2):
# topology and copy limits (torch), the two-GPU tests (nixl-mem tests/two_gpus.rs)
# and the one-GPU ones (gpu.rs, gpu_agent.rs, gpu_blocks.rs) under
# NIXL_REQUIRE_DEPS, the main job both ways (disagg_kv --device cuda --gpus 0,1
# and 1,0, WRITE and READ), and the paged-block benchmark (2048 blocks of 4 KiB to
# 1 MiB per request, one block apart, shuffled) of nixl-rs (paged_bench) and of
# NIXL 1.5.1 (benches/reference/nixl_paged_gpu.py) side by side: GPU 0 -> 1,
# GPU 1 -> 0, and two processes on GPU 0.
# shellcheck source=scripts/gpu/pick.sh
. "$(dirname "$0")/pick.sh"
set -uo pipefail

pick() {
    python3 -c 'import json,sys
want = set(sys.argv[1:])
for l in sys.stdin:
    try: m=json.loads(l)
    except ValueError: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"] in want:
        print(m["target"]["name"], m["executable"])' "$@"
}

build() {
    set -e
    release_env /work/target-gpu fresh
    local bin=.carry/bin
    cargo test --release -p nixl-mem --test two_gpus --test gpu_agent --test gpu_blocks --test gpu \
        --no-run --message-format=json 2>/dev/null | pick two_gpus gpu_agent gpu_blocks gpu \
        | while read -r name exe; do cp "$exe" "$bin/test-$name"; done
    cargo build --release -p nixl-bench --bin paged_bench --message-format=json 2>/dev/null \
        | pick paged_bench | while read -r name exe; do cp "$exe" "$bin/$name"; done
    cargo build --release --example disagg_kv --message-format=json 2>/dev/null \
        | pick disagg_kv | while read -r name exe; do cp "$exe" "$bin/$name"; done
    [ -d .carry/nixl312 ] || bash scripts/gpu.sh nixl build
    rm -rf .carry/nixl-bin
    ls -la "$bin"
    local size; size=$(du -sm .carry | cut -f1)
    echo "carry .carry/bin .carry/nixl312: ${size} MiB"
    [ "$size" -lt 64 ] || { echo ".carry is over the 64 MiB the device tool carries" >&2; exit 1; }
}

run() {
    start_summary two-gpu
    local B=.carry/bin
    step() {
        local name=$1 t=$2; shift 2
        say "== $name: $*"
        timeout "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
        grep -a -E "GB/s|^test |test result|panicked|SKIPPED|verified|path|rc=|failed|error" "$OUT/$name.log" \
            | grep -v '^warning' | tail -n 60 | tee -a "$s"
        say "rc=$rc"
    }
    local ngpu; ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    say "== $(date -u) GPUs: $ngpu; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n1)"
    nvidia-smi topo -m > "$OUT/topo.txt" 2>&1; tee -a "$s" < "$OUT/topo.txt"
    step limit 120 python3 scripts/gpu/two_gpu_limit.py --mib 1024 --reps 10 --json "$OUT/limit.json"
    gpu_test_env
    for t in two_gpus gpu gpu_agent gpu_blocks; do
        step "test-$t" 300 "$B/test-$t" --test-threads 1
    done
    for g in 0,1 1,0; do
        for op in write read; do
            step "disagg-${g/,/}-$op" 120 "$B/disagg_kv" --device cuda --gpus "$g" --op "$op" \
                --requests 8 --layers 4 --blocks 1024 --block-bytes 65536 --blocks-per-request 512
        done
    done
    local sizes=4096,16384,65536,1048576 json="$OUT/paged.jsonl"
    : > "$json"
    export PYTHONPATH="$PWD/.carry/nixl312${PYTHONPATH:+:$PYTHONPATH}"
    export UCX_MODULES="${UCX_MODULES:-^ib,rdmacm}"
    for pair in "0 1" "1 0" "0 0"; do
        set -- $pair
        step "paged-rs-$1$2" 240 "$B/paged_bench" --gpu "$1" --target-gpu "$2" --blocks 2048 \
            --block-bytes "$sizes" --iters 20 --reps 5 --json "$json.rs-$1$2"
        step "paged-nixl-$1$2" 300 python3 benches/reference/nixl_paged_gpu.py --gpu "$1" \
            --target-gpu "$2" --blocks 2048 --block-bytes "$sizes" --iters 10 --reps 3 \
            --json "$json.nixl-$1$2"
    done
    cat "$json".* > "$json" 2>/dev/null
    say "== table (GB/s; limit from limit.json)"
    python3 - "$OUT/limit.json" "$json" <<'EOF' | tee -a "$s"
import json, sys
lim = json.load(open(sys.argv[1]))["gbps"]
rows = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
key = lambda r: (r["gpu"], r["target_gpu"], r["op"].upper(), r["block_bytes"])
cell = {}
for r in rows:
    cell.setdefault(key(r), {})[r["impl"]] = r["gbs"]
print(f"{'initiator':>9} {'target':>6} {'op':5} {'block':>8} {'nixl-rs':>9} {'NIXL':>8} {'limit':>7} {'rs/limit':>8} {'rs/NIXL':>8}")
for k in sorted(cell):
    g, t, op, b = k
    if g == t:
        l = lim.get(f"gpu{g}->gpu{g}")
    else:
        src, dst = (g, t) if op == "WRITE" else (t, g)
        l = lim.get(f"gpu{src}->gpu{dst}")
    rs, nx = cell[k].get("nixl-rs"), cell[k].get("nixl-1.5.1")
    f = lambda x: f"{x:8.2f}" if x else "      - "
    print(f"{g:>9} {t:>6} {op:5} {b:>8} {f(rs):>9} {f(nx):>8} {f(l):>7} "
          f"{(rs / l if rs and l else 0):8.2f} {(rs / nx if rs and nx else 0):8.1f}")
EOF
}

case "${1:-}" in
    build | run) "$1" ;;
    *) echo "usage: scripts/gpu.sh two-gpu build|run" >&2; exit 2 ;;
esac
