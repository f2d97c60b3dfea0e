#!/usr/bin/env python3
"""Interleaved nixl-rs vs NIXL 1.5.1 comparison on this machine (docs/perf/ucx.md).

Runs ROUNDS alternating sweeps: NIXL (benches/reference/nixl_ref.py, PYTHONPATH=the nixl-cu13
install) then nixl-rs (`nixlbench --json`), same points, same pattern (two processes, DRAM to
DRAM, prepared lists, index-based requests reposted, one-page gaps so no descriptor merges).
Reports the median over rounds per point, the ratio, and the 4 KiB x1 median request latency.

    python3 benches/reference/compare.py --nixlbench target/release/deps/nixlbench-<hash> \
        --nixl-path /opt/nixl-deps/nixl-ref --rounds 3 --out /tmp/compare.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, env=None):
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=3600)
    rows = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    if out.returncode != 0:
        print(f"warning: {cmd[0]} exited {out.returncode}", file=sys.stderr)
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nixlbench", required=True)
    p.add_argument("--nixl-path", default="/opt/nixl-deps/nixl-ref")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--blocks", default="4096,65536,1048576,16777216,67108864")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--ops", default="READ,WRITE")
    p.add_argument("--bytes-per-point", default="1e9")
    p.add_argument("--out", default="")
    a = p.parse_args()
    blocks, batches, ops = a.blocks.split(","), a.batches.split(","), a.ops.split(",")
    buf = str(max(int(b) for b in blocks) * max(int(n) for n in batches) + 4096 * max(int(n) for n in batches))
    env = dict(os.environ, PYTHONPATH=a.nixl_path)
    results = {}  # (impl, op, block, batch) -> [row]
    for r in range(a.rounds):
        for op in ops:
            nixl_cmd = [sys.executable, os.path.join(HERE, "nixl_ref.py"), "--ops", op, "--blocks", *blocks,
                        "--batches", *batches, "--buffer", buf, "--bytes-per-point", a.bytes_per_point]
            ours_cmd = [a.nixlbench, "--json", "--op", op, "--blocks", a.blocks, "--batches", a.batches,
                        "--total-buffer-size", buf, "--bytes-per-point", a.bytes_per_point]
            order = [("nixl", nixl_cmd, env), ("ours", ours_cmd, None)]
            if r % 2 == 1:
                order.reverse()
            for name, cmd, e in order:
                for row in run(cmd, e):
                    key = (name, row["op"], row["block"], row["batch"])
                    results.setdefault(key, []).append(row)
                    print(f"round {r} {name:5} {row['op']:5} {row['block']:>9} x{row['batch']:<3} "
                          f"{row['gbps']:8.3f} GB/s  med {row['lat_med_us']:9.2f} us", flush=True)
    table = []
    for op in ops:
        for b in blocks:
            for n in batches:
                k1, k2 = ("nixl", op, int(b), int(n)), ("ours", op, int(b), int(n))
                if k1 not in results or k2 not in results:
                    continue
                g1 = statistics.median(x["gbps"] for x in results[k1])
                g2 = statistics.median(x["gbps"] for x in results[k2])
                l1 = statistics.median(x["lat_med_us"] for x in results[k1])
                l2 = statistics.median(x["lat_med_us"] for x in results[k2])
                table.append({"op": op, "block": int(b), "batch": int(n), "nixl_gbps": g1, "ours_gbps": g2,
                              "ratio": g2 / g1 if g1 else float("inf"), "nixl_lat_med_us": l1, "ours_lat_med_us": l2,
                              "rounds": a.rounds})
    print()
    print("| op | block | batch | NIXL 1.5.1 GB/s | nixl-rs GB/s | ratio | NIXL median us | nixl-rs median us |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for t in table:
        print(f"| {t['op']} | {t['block']} | {t['batch']} | {t['nixl_gbps']:.3f} | {t['ours_gbps']:.3f} | "
              f"{t['ratio']:.2f} | {t['nixl_lat_med_us']:.2f} | {t['ours_lat_med_us']:.2f} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"table": table, "raw": {"|".join(map(str, k)): v for k, v in results.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
