#!/usr/bin/env python3
"""Reads main-vs-paged.log (this folder) and prints, per block size and op: the main job's
GB/s from its median make + post + done latency, the paged benchmark's GB/s, their ratio, and
make per descriptor. Run: python3 summarize.py > summary.txt"""
import re
log = open(__file__.rsplit("/", 1)[0] + "/main-vs-paged.log").read()
paged = {(m[0], int(m[1])): float(m[2]) for m in re.findall(r"(READ|WRITE)\s+(\d+) B x \d+:\s+([\d.]+) GB/s", log)}
cur = None
print("op    block  descs  make/desc(ns)  main(GB/s)  post-to-done(GB/s)  paged(GB/s)  main/paged  p2d/paged")
for line in log.splitlines():
    m = re.match(r"== disagg_kv .*--op (\w+) --block-bytes (\d+) --blocks \d+ --blocks-per-request (\d+) .*--layers (\d+)", line)
    if m:
        cur = (m[1].upper(), int(m[2]), int(m[3]) * int(m[4]))
        continue
    m = re.search(r"(READ|WRITE) transfer \(post to done\): \d+ requests x (\d+) KiB: ([\d.]+) GB/s", line)
    if m and cur:
        p2d = float(m[3])
        continue
    m = re.search(r"per request: make median ([\d.]+)(ms|µs).*latency median ([\d.]+)(ms|µs)", line)
    if m and cur:
        op, bb, descs = cur
        mk = float(m[1]) * (1e-3 if m[2] == "ms" else 1e-6)
        lat = float(m[3]) * (1e-3 if m[4] == "ms" else 1e-6)
        main = bb * descs / lat / 1e9
        pg = paged[(op, bb)]
        print(f"{op:5} {bb:6} {descs:6} {mk / descs * 1e9:14.0f} {main:11.1f} {p2d:19.2f} {pg:12.2f} {main / pg:11.2f} {p2d / pg:10.2f}")
