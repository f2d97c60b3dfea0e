#!/usr/bin/env python3
"""Summary of ab2.log (and ab3.log): per run the make and post medians, the median burst's
time and GB/s (8 requests of 128 MiB or 512 MiB over the median burst, first make to last
done: steady state, where the GB/s the main job prints divides by every burst, the first with
its one-time costs included), and that GB/s over paged_bench's in the same round."""
import re
import sys
from pathlib import Path

here = Path(__file__).resolve().parent


def us(v, unit):
    return float(v) * (1000 if unit == "ms" else 1)


def main():
    text = (here / "ab2.log").read_text().split("\n")
    runs, paged, cur, rnd = [], {}, None, None
    for line in text:
        m = re.match(r"== round (\d) (before|after): .*--op (\w+) --block-bytes (\d+)", line)
        if m:
            cur = dict(round=int(m[1]), v=m[2], op=m[3], bb=int(m[4]))
            runs.append(cur)
            continue
        m = re.match(r"== round (\d): paged_bench", line)
        if m:
            rnd, cur = int(m[1]), None
            continue
        m = re.match(r"(WRITE|READ)\s+(\d+) B x 8192:\s+([\d.]+) GB/s", line)
        if m and rnd:
            paged[(rnd, m[1].lower(), int(m[2]))] = float(m[3])
        if cur is None:
            continue
        m = re.search(r"make median ([\d.]+)(µs|ms), post median ([\d.]+)(µs|ms)", line)
        if m:
            cur["make"], cur["post"] = us(m[1], m[2]), us(m[3], m[4])
        m = re.search(r"bursts of 8 requests \(first make to last done\): (\d+) bursts x (\d+) KiB: ([\d.]+) GB/s, latency median ([\d.]+)(µs|ms)", line)
        if m:
            cur["all_gbs"], cur["kib"], cur["burst"] = float(m[3]), int(m[2]), us(m[4], m[5])
    print("round version op block | make us | post us | median burst us | median burst GB/s | paged GB/s | / paged | GB/s over all bursts")
    for r in runs:
        if "burst" not in r:
            print(r["round"], r["v"], r["op"], r["bb"], "| incomplete (the call's ten minutes ran out)")
            continue
        gbs = r["kib"] * 1024 / (r["burst"] * 1e-6) / 1e9
        p = paged.get((r["round"], r["op"], r["bb"])) or paged.get((1, r["op"], r["bb"]))
        print(f'{r["round"]} {r["v"]} {r["op"]} {r["bb"]} | {r["make"]:.1f} | {r["post"]:.1f} | {r["burst"]:.1f} | {gbs:.1f} | {p:.2f} | {gbs / p:.2f} | {r["all_gbs"]:.2f}')
    ab3 = here / "ab3.log"
    if ab3.exists():
        print("--post-after-make (ab3.log), round 1 paged of ab2.log:")
        op = None
        for line in ab3.read_text().split("\n"):
            m = re.search(r"--op (\w+) .*--post-after-make", line)
            if m:
                op = m[1]
            m = re.search(r"posted back to back \(first post to last done\): .*: ([\d.]+) GB/s", line)
            if m and op:
                g = float(m[1])
                print(f"{op} 16384 posted back to back {g:.2f} GB/s / paged {paged[(1, op, 16384)]:.2f} = {g / paged[(1, op, 16384)]:.2f}")


main()
