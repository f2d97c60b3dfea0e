#!/usr/bin/env python3
"""summary.txt from this folder's logs: the main job's bursts (ab.log, the 16-byte block-table
pieces before / after) and the scale bench's make in ns per descriptor (disjoint.log,
reached.log, reached2.log: random pairs over 1,280 regions, before / after)."""
import re

out = []
out.append("ab.log (table16 experiment, reverted): round version op block | make us | post us | "
           "burst GB/s (first make to last done) | posted GB/s (first post to last done)")
cur = None
for line in open("ab.log"):
    m = re.match(r"== round (\d) (\w+): .*--op (\w+) --block-bytes (\d+)", line)
    if m:
        cur = m.groups()
        continue
    if cur is None:
        continue
    m = re.search(r"make median ([\d.]+)µs, post median ([\d.]+)µs", line)
    if m:
        mk = m.groups()
    m = re.search(r"first make to last done\): .*?([\d.]+) GB/s", line)
    if m:
        fm = m.group(1)
    m = re.search(r"first post to last done\): .*?([\d.]+) GB/s", line)
    if m:
        out.append(f"{' '.join(cur)} | {mk[0]} | {mk[1]} | {fm} | {m.group(1)}")
for line in open("ab.log"):
    if " B x " in line:
        out.append("paged_bench: " + line.split("  path:")[0].strip())

for log in ["disjoint.log", "reached.log", "reached2.log", "footprint.log"]:
    out.append("")
    out.append(f"{log}: make ns/desc at 128 / 1024 / 16384 (NULL, then CUDA_IPC, same run; "
               "random pairs over 1,280 regions, or the main job's ids where only CUDA_IPC ran)")
    who = backend = None
    rows = {}
    for line in open(log):
        m = re.match(r"== (before|after): scale", line)
        if m:
            if who:
                out.append(f"{who}: NULL {rows.get('NULL')} | CUDA_IPC {rows.get('CUDA_IPC')}")
            who, rows = m.group(1), {}
            continue
        m = re.match(r"# flat (\S+) ", line)
        if m:
            backend = m.group(1)
            rows[backend] = []
            continue
        m = re.match(r"\s+(128|1024|16384)\s+\S+\s+(\S+)", line)
        if m and backend:
            rows[backend].append(m.group(2))
    if who:
        out.append(f"{who}: NULL {rows.get('NULL')} | CUDA_IPC {rows.get('CUDA_IPC')}")
open("summary.txt", "w").write("\n".join(out) + "\n")
print("\n".join(out))
