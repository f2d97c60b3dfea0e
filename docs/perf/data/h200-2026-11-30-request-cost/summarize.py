#!/usr/bin/env python3
"""Summarizes main.log (run.sh): per shape, op and binary, the medians of make, post and post
to done, the main job's GB/s (bytes over median make + post + done) per round, and its ratio
to the paged benchmark's 16 KiB GB/s of the same call."""
import re
import sys

log = open(sys.argv[1] if len(sys.argv) > 1 else "main.log").read()
head = re.compile(r"== round (\d+): (\S+) .*--op (\w+) .*--blocks-per-request (\d+) .*--layers (\d+)")
line = re.compile(r"per request: make median ([\d.]+)(µs|ms), post median ([\d.]+)(µs|ms), "
                  r"post to done median ([\d.]+)(µs|ms); .*?: ([\d.]+) GB/s")
paged = {m.group(1).upper(): float(m.group(2))
         for m in re.finditer(r"^(WRITE|READ)\s+16384 B x \d+:\s+([\d.]+) GB/s", log, re.M)}
rows = {}
cur = None
for l in log.splitlines():
    h = head.search(l)
    if h:
        cur = (int(h.group(5)), int(h.group(4)), h.group(3).upper(), h.group(2), int(h.group(1)))
        continue
    m = line.search(l)
    if m and cur:
        us = lambda v, u: float(v) * (1000 if u == "ms" else 1)
        rows[cur] = (us(m.group(1), m.group(2)), us(m.group(3), m.group(4)),
                     us(m.group(5), m.group(6)), float(m.group(7)))
print("paged benchmark, 16 KiB x 2048 blocks:", ", ".join(f"{k} {v:.2f} GB/s" for k, v in paged.items()))
print(f"{'shape':>10} {'op':5} {'binary':17} {'make us':>15} {'post us':>13} {'p2d us':>15} {'GB/s':>15} {'/paged':>11}")
keys = sorted({k[:4] for k in rows})
for k in keys:
    rs = [rows[k + (r,)] for r in (1, 2) if k + (r,) in rows]
    f = lambda i, fmt: ", ".join(fmt.format(r[i]) for r in rs)
    ratio = ", ".join(f"{r[3] / paged[k[2]]:.2f}" for r in rs) if k[2] in paged else "-"
    print(f"{k[0]:>3}x{k[1]:<6} {k[2]:5} {k[3]:17} {f(0, '{:.1f}'):>15} {f(1, '{:.1f}'):>13} "
          f"{f(2, '{:.1f}'):>15} {f(3, '{:.2f}'):>15} {ratio:>11}")
