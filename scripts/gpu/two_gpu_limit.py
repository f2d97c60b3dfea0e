#!/usr/bin/env python3
"""The copy limits of a two-GPU host (issue 18, item 1), with torch (on the GPU machines):
GPU0 -> GPU1 and back with peer access enabled (the same copies cudaMemcpyPeer makes), and
pinned host <-> each GPU, each timed with CUDA events, best of --reps, in GB/s (1e9 B/s).

    python3 scripts/gpu/two_gpu_limit.py [--mib 1024] [--reps 10] [--json OUT]

With fewer than two GPUs it measures host <-> GPU 0 and says why the peer rows are missing.
"""
import argparse
import json
import sys

import torch


def timed(copy, nbytes, reps, stream_dev):
    best = 0.0
    with torch.cuda.device(stream_dev):
        for _ in range(2):
            copy()
        torch.cuda.synchronize()
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            copy()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
            best = max(best, nbytes / (ms / 1e3) / 1e9)
    torch.cuda.synchronize()
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json")
    a = p.parse_args()
    n = a.mib << 20
    count = torch.cuda.device_count()
    rows = {}
    print(f"GPUs: {count}; {a.mib} MiB per copy, best of {a.reps}")
    for g in range(min(count, 2)):
        dev = torch.empty(n, dtype=torch.uint8, device=f"cuda:{g}")
        host = torch.empty(n, dtype=torch.uint8).pin_memory()
        rows[f"host->gpu{g}"] = timed(lambda: dev.copy_(host, non_blocking=True), n, a.reps, g)
        rows[f"gpu{g}->host"] = timed(lambda: host.copy_(dev, non_blocking=True), n, a.reps, g)
        rows[f"gpu{g}->gpu{g}"] = timed(
            lambda: dev[n // 2 :].copy_(dev[: n // 2], non_blocking=True), n // 2, a.reps, g
        )
        del dev, host
    if count >= 2:
        peer01 = torch.cuda.can_device_access_peer(0, 1)
        peer10 = torch.cuda.can_device_access_peer(1, 0)
        print(f"peer access 0->1: {peer01}, 1->0: {peer10}")
        x0 = torch.empty(n, dtype=torch.uint8, device="cuda:0")
        x1 = torch.empty(n, dtype=torch.uint8, device="cuda:1")
        rows["gpu0->gpu1"] = timed(lambda: x1.copy_(x0, non_blocking=True), n, a.reps, 0)
        rows["gpu1->gpu0"] = timed(lambda: x0.copy_(x1, non_blocking=True), n, a.reps, 1)
    else:
        print("peer rows: not measured (this machine has fewer than two GPUs)")
    for k, v in rows.items():
        print(f"{k:>12}: {v:8.1f} GB/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpus": count, "mib": a.mib, "gbps": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
