#!/usr/bin/env python3
"""Figures of fill.log: each main-job line over paged_bench's same op and block size in the
same round (python3 summarize.py fill.log)."""
import re, sys

rows, paged, cur = [], {}, None
for line in open(sys.argv[1]):
    m = re.match(r"== round (\d): (\S+) (.*)", line)
    if m:
        cur = (int(m.group(1)), m.group(2), m.group(3))
        continue
    m = re.match(r"(READ|WRITE)\s+(\d+) B x \d+:\s+([\d.]+) GB/s", line)
    if m and cur:
        paged[(cur[0], m.group(1), int(m.group(2)))] = float(m.group(3))
        continue
    m = re.search(r"(READ|WRITE) bursts of (\d+) requests (posted back to back|\(first make to last done\)).*: ([\d.]+) GB/s", line)
    if m and cur:
        bb = int(re.search(r"--block-bytes (\d+)", cur[2]).group(1))
        mode = "posted" if m.group(3).startswith("posted") else "overlapping"
        rows.append((cur[0], cur[1], m.group(1), bb, int(m.group(2)), mode, float(m.group(4))))
print("round fill   op    block  burst mode         GB/s   / paged same op")
for r, b, op, bb, burst, mode, g in rows:
    p = paged.get((r, op, bb))
    fill = "runs" if b.endswith("runs") else "block"
    print(f"{r:5} {fill:6} {op:5} {bb:6} {burst:5} {mode:11} {g:8.2f}   {g / p:.3f}" if p else f"{r} {fill} {op} {bb} {burst} {mode} {g}")
for k, v in sorted(paged.items()):
    print(f"paged round {k[0]} {k[1]} {k[2]} B: {v:.2f} GB/s")
