#!/usr/bin/env bash
# GPU suite `handover` (issue 37): `scripts/gpu.sh handover build` here (after
# `scripts/gpu.sh nixl build`, which makes .carry/nixl312), `scripts/gpu.sh handover run` on the
# GPU machine. Carry [".carry/bin", ".carry/nixl312"].
#
# The handover benchmark (benches/handover.rs) beside NIXL 1.5.1 through its Python API as
# vLLM calls it (benches/reference/nixl_handover.py, torch tensors), interleaved by
# benches/reference/compare_handover.py: decode learns of a request -> its KV usable on the
# decode GPU, first contact and steady state, p50/p99. nixl-rs over CUDA_IPC, NIXL over UCX's
# CUDA transports; every byte of the checked requests compared on both sides. Shapes: Llama-3-8B
# TP 1 and Llama-3-70B TP 8 (16-token blocks), 1k-32k tokens. GPUs: HANDOVER_GPUS (default
# 0,0: both processes on GPU 0; 0,1 on two GPUs). ROUNDS (default 2), SHAPES (model:tp ...),
# TOKENS, CONTACTS, REQUESTS, LISTS (flat or strided); HANDOVER_S per shape and RUN_S per run (seconds).
# shellcheck source=scripts/gpu/pick.sh
. "$(dirname "$0")/pick.sh"
set -uo pipefail

build() {
    set -e
    [ -d .carry/nixl312 ] || { echo "run scripts/gpu.sh nixl build first (.carry/nixl312)" >&2; exit 1; }
    release_env /work/target-gpu fresh
    cp "$(cargo build --release -p nixl-bench --bin handover --message-format=json 2>/dev/null | pick handover)" .carry/bin/handover
    ls -la .carry/bin
    du -csm .carry/bin .carry/nixl312 | tail -n1
}

run() {
    start_summary handover
    local n="$PWD/.carry/nixl312" gpus="${HANDOVER_GPUS:-0,0}" ucx
    ucx="$(ls "$n"/nixl_cu1*.libs/libucp-*.so* | head -n1)"
    say "== $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n1); gpus $gpus; $(nproc) cores; python $(python3 -V 2>&1)"
    local shape
    local tokens="${TOKENS:-1024,4096,16384,32768}"
    for shape in ${SHAPES:-llama3-8b:1 llama3-70b:8}; do
        set -- "${shape%:*}" "${shape#*:}"
        say "== $1 TP $2, tokens $tokens"
        timeout "${HANDOVER_S:-280}" python3 benches/reference/compare_handover.py --handover .carry/bin/handover \
            --nixl-path "$n" --ucx "$ucx" --rounds "${ROUNDS:-2}" --timeout "${RUN_S:-120}" --out "$OUT/handover-$1${LISTS:+-$LISTS}.json" -- \
            --device cuda --gpus "$gpus" --model "$1" --tp "$2" --tokens "$tokens" --contacts "${CONTACTS:-5}" \
            --requests "${REQUESTS:-30}" --lists "${LISTS:-flat}" > "$OUT/handover-$1${LISTS:+-$LISTS}.log" 2>&1
        echo "rc=$?" >> "$OUT/handover-$1${LISTS:+-$LISTS}.log"
        tee -a "$s" < "$OUT/handover-$1${LISTS:+-$LISTS}.log"
    done
}

case "${1:-}" in
    build) build ;;
    run) run ;;
    *) echo "usage: scripts/gpu.sh handover build|run" >&2; exit 2 ;;
esac
