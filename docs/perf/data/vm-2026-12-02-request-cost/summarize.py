#!/usr/bin/env python3
"""Summary of scale.log: make and drop (release) in ns per descriptor per backend, pass and
size, before and after, each round's figure (best of its 3 inner rounds)."""
import re
from collections import defaultdict
from pathlib import Path

rows = defaultdict(list)
v = None
for line in (Path(__file__).resolve().parent / "scale.log").read_text().split("\n"):
    m = re.match(r"== round \d (before|final)", line)
    if m:
        v = "after" if m[1] == "final" else "before"
        continue
    m = re.match(r"# flat (\w+) \((shuffled|layers)", line)
    if m:
        cfg = (m[1], "1,280 regions, random pairs" if m[2] == "shuffled" else "1 region, 4 layers, the main job's ids")
        continue
    m = re.match(r"\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", line)
    if m and v:
        rows[(cfg, int(m[1]), v)].append((float(m[3]), float(m[4]), float(m[8])))
print("backend, pass, descriptors: make before / after; post before / after; drop before / after (ns per descriptor, round 1, round 2)")
for (cfg, n, ver) in sorted({(c, n, "x") for (c, n, _) in rows}):
    b, a = rows[(cfg, n, "before")], rows[(cfg, n, "after")]
    f = lambda xs, i: ", ".join(f"{x[i]:.1f}" for x in xs)
    print(f"{cfg[0]}, {cfg[1]}, {n}: make {f(b,0)} / {f(a,0)}; post {f(b,1)} / {f(a,1)}; drop {f(b,2)} / {f(a,2)}")
