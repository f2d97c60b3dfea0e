#!/usr/bin/env python3
"""Summarizes main-burst.log: per round, op and block size, the main job one request at a
time (its bytes over the summed make + post + done of its requests) and in bursts of 8 (over
the summed bursts, each from its first make to its last request done), beside the paged benchmark of the same round (8,192 and 2,048 blocks per
request), with the ratios."""
import re, sys

log = open(sys.argv[1] if len(sys.argv) > 1 else "main-burst.log").read().splitlines()
paged, main = {}, {}
rnd, cur = None, None
for line in log:
    m = re.match(r"== round (\d+): (\S+)", line)
    if m:
        rnd = int(m.group(1))
        cur = None
        m2 = re.search(r"--op (\w+) --block-bytes (\d+) .*--burst (\d+)", line)
        if m2:
            cur = (rnd, m2.group(1).upper(), int(m2.group(2)) >> 10, int(m2.group(3)))
        continue
    m = re.match(r"blocks (\d+): (\w+)\s+(\d+) B x \d+:\s+([\d.]+) GB/s", line)
    if m:
        paged[(rnd, m.group(2), int(m.group(3)) >> 10, int(m.group(1)))] = float(m.group(4))
        continue
    if cur is None:
        continue
    m = re.search(r"make \+ post \+ done: .*?: ([\d.]+) GB/s", line)
    if m and cur[3] == 1:
        main[cur] = float(m.group(1))
    m = re.search(r"bursts of \d+ requests .*?: ([\d.]+) GB/s", line)
    if m:
        main[cur] = float(m.group(1))
print("| round, op, block | one at a time | bursts of 8 | paged, 8,192 / 2,048 blocks | one at a time / paged 8,192 | bursts / paged 8,192 | bursts / paged 2,048 |")
print("|---|---|---|---|---|---|---|")
for (r, op, kib, burst), v in sorted(main.items()):
    if burst != 1:
        continue
    b = main.get((r, op, kib, 8))
    p8, p2 = paged.get((r, op, kib, 8192)), paged.get((r, op, kib, 2048))
    print(f"| {r}, {op}, {kib} KiB | {v:.2f} | {b:.2f} | {p8:.2f} / {p2:.2f} | {v / p8:.2f} | {b / p8:.2f} | {b / p2:.2f} |")
