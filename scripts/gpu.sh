#!/usr/bin/env bash
# One entry point for every GPU campaign: `scripts/gpu.sh SUITE build` HERE (a machine with the
# Rust toolchain and PyPI; no CUDA needed, libcuda is loaded at run time) puts what the suite
# runs into .carry/ (git-ignored; the device tool carries at most 64 MiB), and
# `scripts/gpu.sh SUITE run` on the GPU machine (no toolchain, no internet) runs it, with
# results and logs under $OUT and a summary in $OUT/*-summary.txt. Each suite is
# scripts/gpu/SUITE.sh (its header says what it measures and what to carry):
#
#   claims           issue 39: every GPU test and every GPU bench a doc claim cites, one call per
#                    machine kind, with the summary the docs quote (docs/perf/gpu.md, Measuring)
#   two-gpu          issue 24: two GPUs, both directions, paged blocks vs the peer-copy limit
#                    and NIXL 1.5.1, the two-GPU tests and the main job both ways
#   one-gpu          nixl-mem's GPU tests and gpu_bench (incl. the copy kernel's shape sweep)
#   all              every one-GPU suite in one call (one-gpu, storage, the UCX VRAM test)
#   storage          POSIX/GDS VRAM <-> file tests and the storage bench
#   ucx              the UCX backend with VRAM, nixlbench over UCX, the main job on GPUs
#   nixl             VRAM interop with a stock NIXL 1.5.1 agent
#   native           DRAM sweep against native NIXL 1.5.1 on the GPU host's CPUs
#   scale            block tables at Llama/MoE scale through CUDA_IPC
#   kv               issue 26: KV layouts between GPUs (prefill TP on GPU 0, decode TP on GPU 1)
#   arrival          issue 27: async completion and GPU-waitable per-layer arrival on GPUs
#   poll             issue 33: async poll durations and deadline overruns on a many-core host
#   landed           issue 33: the kill conformance case over CUDA_IPC (VRAM, two processes)
#   tcpstore         issue 40: PyTorch's own TCPStore (torch on the GPU machines) and NIXL 1.5.1 over it
#   recheck, cma     issue 14's re-measurements; direct CMA against native NIXL
#   two-gpu-issue18  the first two-GPU run (gpu_bench, nixlbench over UCX)
set -uo pipefail
cd "$(dirname "$0")/.."
suite=${1:-}
what=${2:-}
if [ -z "$suite" ] || [ -z "$what" ] || [ ! -f "scripts/gpu/$suite.sh" ]; then
    echo "usage: scripts/gpu.sh SUITE build|run, SUITE one of:" \
        $(cd scripts/gpu && ls *.sh | grep -v '^pick.sh$' | sed 's/\.sh$//') >&2
    exit 2
fi
exec bash "scripts/gpu/$suite.sh" "$what"
