#!/usr/bin/env python3
"""Medians of the paged benchmark's GB/s per case, before and after, over the rounds of a log
of run-2.sh (usage: summarize.py LOG)."""
import re, statistics, sys
log = open(sys.argv[1]).read()
sec = re.split(r"^== round (\d+) (old|new): \S+.*$", log, flags=re.M)
d = {}
for i in range(1, len(sec), 3):
    v, body = sec[i + 1], sec[i + 2]
    for m in re.finditer(r"^(WRITE|READ)\s+(\d+) B x 2048:\s+([\d.]+) GB/s", body, re.M):
        d.setdefault((m.group(1), int(m.group(2))), {}).setdefault(v, []).append(float(m.group(3)))
print("| paged_bench case | rounds | before: median (min-max) GB/s | after: median (min-max) GB/s | after / before (medians) |")
print("|---|---|---|---|---|")
for (op, b), x in sorted(d.items(), key=lambda k: (k[0][1], k[0][0])):
    o, n = x["old"], x["new"]
    f = lambda v: f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"
    print(f"| {op} {b} B x 2048 | {len(o)} / {len(n)} | {f(o)} | {f(n)} | {statistics.median(n) / statistics.median(o):.3f} |")
