#!/usr/bin/env python3
"""NIXL's side of the registration benchmark (benches/registration.rs, issue 37): an agent with
its UCX backend registers R regions of host memory in one call, serializes its metadata
(`get_agent_metadata`), deregisters, and registers the same regions again. One JSON object
per region count, the keys `registration` prints.

    PYTHONPATH=$NIXL_PYTHONPATH python3 benches/reference/nixl_registration.py --regions 1,160,1280

`--compare BIN` also runs nixl-rs's `registration` (same arguments) before and after this
one and prints both sides' medians and the ratios as a table.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

try:
    from nixl_cu13._api import nixl_agent, nixl_agent_config
except ImportError:  # the non-CUDA-13 wheel names its module `nixl`
    from nixl._api import nixl_agent, nixl_agent_config


def measure(a):
    rows = []
    for k, n in enumerate(a.regions):
        bufs = [np.ones(a.region_bytes, dtype=np.uint8) for _ in range(n)]
        descs = [(b.ctypes.data, a.region_bytes, 0, "") for b in bufs]
        fresh, again, ser = [], [], []
        size = 0
        for r in range(max(a.rounds, 1)):
            agent = nixl_agent(f"nixl-registration-{os.getpid()}-{k}-{r}", nixl_agent_config(backends=["UCX"]))
            t = time.perf_counter()
            reg = agent.register_memory(descs, "DRAM")
            fresh.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            md = agent.get_agent_metadata()
            ser.append((time.perf_counter() - t) * 1e3)
            size = len(md)
            agent.deregister_memory(reg)
            t = time.perf_counter()
            reg = agent.register_memory(descs, "DRAM")
            again.append((time.perf_counter() - t) * 1e3)
            agent.deregister_memory(reg)
            del agent
        row = {"impl": "nixl", "regions": n, "region_bytes": a.region_bytes, "rounds": len(fresh)}
        for key, v in (("register_fresh", fresh), ("register_again", again), ("metadata", ser)):
            row[f"{key}_ms"] = round(statistics.median(v), 3)
            row[f"{key}_min_ms"] = round(min(v), 3)
        row["metadata_bytes"] = size
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def compare(a):
    args = ["--regions", ",".join(map(str, a.regions)), "--region-bytes", str(a.region_bytes),
            "--rounds", str(a.rounds)]
    env = dict(os.environ)
    if os.environ.get("NIXL_WHEEL_UCX"):
        env["NIXL_UCX_HOME"] = os.environ["NIXL_WHEEL_UCX"]
    runs = []
    for side in ["ours", "nixl", "nixl", "ours"]:
        cmd = [a.compare, *args] if side == "ours" else [sys.executable, __file__, *args]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=True).stdout
        for line in out.splitlines():
            if line.startswith("{"):
                print(line, flush=True)
                runs.append(json.loads(line))
    keys = ["register_fresh_ms", "register_again_ms", "metadata_ms", "metadata_bytes"]
    print(f"Registration, {a.region_bytes >> 10} KiB regions, host memory, UCX; medians of {a.rounds} "
          "rounds per run, two runs each (nixl-rs, NIXL, NIXL, nixl-rs); nixl-rs / NIXL")
    print("| regions | register, fresh (ms) | register, again (ms) | metadata (ms) | metadata (bytes) |")
    print("|---|---|---|---|---|")
    for n in a.regions:
        cells = []
        for key in keys:
            o = statistics.median(r[key] for r in runs if r["impl"] == "nixl-rs" and r["regions"] == n)
            x = statistics.median(r[key] for r in runs if r["impl"] == "nixl" and r["regions"] == n)
            fmt = "{:.0f}" if key == "metadata_bytes" else "{:.3f}"
            cells.append(f"{fmt.format(o)} / {fmt.format(x)} = {o / x:.2f}" if x else f"{o} / {x}")
        print(f"| {n} | " + " | ".join(cells) + " |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--regions", default="1,160,1280")
    p.add_argument("--region-bytes", type=int, default=1 << 20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--compare", help="nixl-rs's registration binary")
    a = p.parse_args()
    a.regions = [int(x) for x in a.regions.split(",")]
    if a.compare:
        compare(a)
    else:
        measure(a)
    sys.stdout.flush()
    os._exit(0)  # NIXL's bundled libnl may crash at exit


if __name__ == "__main__":
    main()
