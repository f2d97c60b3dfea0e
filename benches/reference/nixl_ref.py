#!/usr/bin/env python3
"""NIXL 1.5.1 reference for the nixl-rs comparison (docs/perf/ucx.md).

Two processes, DRAM -> DRAM over NIXL's UCX backend: the initiator registers one buffer, the
target one buffer; per point (block size, batch size) both sides prepare descriptor lists once
(`prep_xfer_dlist`; descriptors laid out with a one-page gap so none merge), the initiator makes
one request by index (`make_prepped_xfer`) and posts it repeatedly (`transfer` + polling
`check_xfer_state`). Prints one JSON object per point: block, batch, op, GB/s, median and p99
request latency in microseconds.

Same pattern as `cargo bench -p nixl-bench --bench nixlbench -- --mode sweep`. Install the reference with
    pip install --no-deps --target /opt/nixl-deps/nixl-ref nixl-cu13==1.5.1 && \
    pip install --target /opt/nixl-deps/nixl-ref numpy
and run with PYTHONPATH=/opt/nixl-deps/nixl-ref.
"""
import argparse
import json
import subprocess
import sys
import time

import numpy as np

try:
    from nixl_cu13._api import nixl_agent, nixl_agent_config
except ImportError:  # the non-CUDA-13 wheel names its module `nixl`
    from nixl._api import nixl_agent, nixl_agent_config

PAGE = 4096


def layout(block, batch):
    stride = block + PAGE
    return [(i * stride, block) for i in range(batch)]


def span(block, batch):
    return batch * (block + PAGE)


def target(args):
    cfg = nixl_agent_config(enable_prog_thread=True, enable_listen_thread=True, listen_port=args.port)
    agent = nixl_agent("target", cfg)
    buf = np.ones(args.buffer, dtype=np.uint8)
    agent.register_memory([(buf.ctypes.data, args.buffer, 0, "")], "DRAM")
    print(f"addr {buf.ctypes.data}", flush=True)
    # Stay up until the initiator says so (stdin closes).
    sys.stdin.read()


def initiator(args):
    child = subprocess.Popen(
        [sys.executable, __file__, "--role", "target", "--port", str(args.port), "--buffer", str(args.buffer)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        raddr = None
        while raddr is None:
            line = child.stdout.readline()
            if not line:
                raise RuntimeError("target exited")
            if line.startswith("addr "):
                raddr = int(line.split()[1])
        cfg = nixl_agent_config(enable_prog_thread=True, enable_listen_thread=True, listen_port=args.port + 1)
        agent = nixl_agent("initiator", cfg)
        buf = np.ones(args.buffer, dtype=np.uint8)  # touched pages, like nixlbench's source
        agent.register_memory([(buf.ctypes.data, args.buffer, 0, "")], "DRAM")
        laddr = buf.ctypes.data
        agent.fetch_remote_metadata("target", "127.0.0.1", args.port)
        deadline = time.time() + 30
        while not agent.check_remote_metadata("target"):
            if time.time() > deadline:
                raise RuntimeError("no target metadata")
            time.sleep(0.01)
        for op in args.ops:
            for block in args.blocks:
                for batch in args.batches:
                    if span(block, batch) > args.buffer:
                        continue
                    run_point(agent, args, op, block, batch, laddr, raddr)
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def run_point(agent, args, op, block, batch, laddr, raddr):
    descs = layout(block, batch)
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(laddr + o, n, 0) for o, n in descs], "DRAM")
    remote = agent.prep_xfer_dlist("target", [(raddr + o, n, 0) for o, n in descs], "DRAM")
    idx = list(range(batch))
    h = agent.make_prepped_xfer(op, local, idx, remote, idx)
    total_bytes = block * batch
    iters = max(args.min_iters, min(args.max_iters, int(args.bytes_per_point // total_bytes)))
    lat = []
    warmup = min(args.warmup, max(2, min(10, int(2e8 // total_bytes))))
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        st = agent.transfer(h)
        while st == "PROC":
            st = agent.check_xfer_state(h)
        if st != "DONE":
            raise RuntimeError(f"transfer failed: {st}")
        if i >= warmup:
            lat.append(time.perf_counter() - t0)
    lat.sort()
    total = sum(lat)
    print(json.dumps({
        "impl": "nixl-1.5.1", "op": op, "block": block, "batch": batch, "iters": iters,
        "gbps": total_bytes * iters / total / 1e9,
        "lat_med_us": lat[len(lat) // 2] * 1e6,
        "lat_p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6,
    }), flush=True)
    agent.release_xfer_handle(h)
    agent.release_dlist_handle(local)
    agent.release_dlist_handle(remote)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--role", default="initiator")
    p.add_argument("--port", type=int, default=18555)
    p.add_argument("--ops", nargs="+", default=["READ", "WRITE"])
    p.add_argument("--blocks", nargs="+", type=int, default=[4096, 65536, 1 << 20, 16 << 20, 64 << 20])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    p.add_argument("--buffer", type=int, default=(64 << 20) * 32 + 32 * PAGE)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--min-iters", type=int, default=8)
    p.add_argument("--max-iters", type=int, default=20000)
    p.add_argument("--bytes-per-point", type=float, default=2e9)
    args = p.parse_args()
    if args.role == "target":
        target(args)
    else:
        initiator(args)


if __name__ == "__main__":
    main()
