#!/usr/bin/env python3
"""Summarizes run1.log / run3.log: per main-job run, the make and post medians and the median
burst (first make to last done) as GB/s and over paged_bench's GB/s for the same operation and
block size in the same round.  usage: summarize.py LOG..."""
import re
import sys

for path in sys.argv[1:]:
    print(f"# {path}")
    runs, paged = [], {}
    cur = None
    rnd = None
    for line in open(path):
        m = re.match(r"== round (\d+): (\S+) disagg_kv .*?(?:--block-bytes (\d+))?.* --op (\w+)(?: --block-bytes (\d+))?", line)
        if m and "disagg_kv" in line:
            bb = m.group(3) or m.group(5) or re.search(r"--block-bytes (\d+)", line).group(1)
            cur = {"round": m.group(1), "v": m.group(2), "op": m.group(4).upper(), "bb": bb}
            runs.append(cur)
            continue
        m = re.match(r"== round (\d+): paged_bench", line)
        if m:
            rnd, cur = m.group(1), None
            continue
        m = re.match(r"(READ|WRITE)\s+(\d+) B x \d+:\s+([\d.]+) GB/s", line)
        if m and rnd:
            paged[(rnd, m.group(1), m.group(2))] = float(m.group(3))
            continue
        if cur is None:
            continue
        m = re.search(r"make median ([\d.]+)µs, post median ([\d.]+)µs", line)
        if m:
            cur["make"], cur["post"] = m.group(1), m.group(2)
        m = re.search(r"bursts of \d+ requests \(first make to last done\): .*?: ([\d.]+) GB/s", line)
        if m:
            cur["gbs"] = float(m.group(1))
    print("round version op    block | make us | post us | bursts GB/s | / paged (same round, op, block)")
    for r in runs:
        p = paged.get((r["round"], r["op"], r["bb"]))
        ratio = f"{r['gbs'] / p:.3f}" if p and "gbs" in r else "-"
        print(f"{r['round']:>5} {r['v']:<7} {r['op']:<5} {r['bb']:>5} | {r.get('make', '-'):>7} | {r.get('post', '-'):>7} | {r.get('gbs', '-'):>11} | {ratio}")
    for k, v in sorted(paged.items()):
        print(f"paged round {k[0]} {k[1]} {k[2]} B: {v} GB/s")
