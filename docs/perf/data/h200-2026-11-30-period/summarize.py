#!/usr/bin/env python3
"""Reads a log of this folder (default main.log, run.sh's call) and prints,
per block size, op and binary (before / after), per round: make per descriptor, the main job's
GB/s from its median make + post + done latency, the paged benchmark's GB/s in the same call
from the initiator's GPU (decode's for READ, prefill's for WRITE) and their ratio.
Run: python3 summarize.py [log] >> summary.txt"""
import re
import sys
name = sys.argv[1] if len(sys.argv) > 1 else "main.log"
log = open(__file__.rsplit("/", 1)[0] + "/" + name).read()
paged = {}
gpu = "0"
for line in log.splitlines():
    m = re.match(r"paged_bench: initiator GPU (\d+)", line)
    if m:
        gpu = m[1]
    m = re.match(r"(READ|WRITE)\s+(\d+) B x \d+:\s+([\d.]+) GB/s", line)
    if m:
        paged[(gpu, m[1], int(m[2]))] = float(m[3])
cur = None
print(f"# {name}")
print("round binary            op    block layers  descs  make/desc(ns)  make(us)  main(GB/s)  paged(GB/s)  main/paged")
for line in log.splitlines():
    m = re.match(r"== round (\d+): (\S+) .*--gpus (\d+),(\d+) --op (\w+) --block-bytes (\d+) --blocks \d+ --blocks-per-request (\d+) .*--layers (\d+)", line)
    if m:
        op = m[5].upper()
        init = m[4] if op == "READ" else m[3]
        cur = (m[1], m[2], op, int(m[6]), int(m[7]) * int(m[8]), init, int(m[8]))
        continue
    m = re.search(r"per request: make median ([\d.]+)(ms|µs).*latency median ([\d.]+)(ms|µs)", line)
    if m and cur:
        rnd, which, op, bb, descs, init, layers = cur
        mk = float(m[1]) * (1e-3 if m[2] == "ms" else 1e-6)
        lat = float(m[3]) * (1e-3 if m[4] == "ms" else 1e-6)
        main = bb * descs / lat / 1e9
        pg = paged[(init, op, bb)]
        print(f"{rnd:5} {which:17} {op:5} {bb:6} {layers:6} {descs:6} {mk / descs * 1e9:14.0f} {mk * 1e6:9.1f} {main:11.1f} {pg:12.2f} {main / pg:11.2f}")
        cur = None
