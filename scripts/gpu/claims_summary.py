#!/usr/bin/env python3
"""The summary of a `scripts/gpu.sh claims run` (issue 39): what the docs quote, read from the
run's own logs in OUT, one block per part. Exits non-zero when a part's figure is missing.

    python3 scripts/gpu/claims_summary.py OUT
"""
import json
import re
import sys
from pathlib import Path

OUT = Path(sys.argv[1])
missing = []


def read(name):
    p = OUT / name
    return p.read_text(errors="replace") if p.exists() else ""


def jsonl(name):
    rows = []
    for line in read(name).splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows


def need(what, value):
    if value is None:
        missing.append(what)
        print(f"  {what}: MISSING")
    return value


def tests():
    print("tests (test result lines of every GPU test binary):")
    seen = []
    parts = {"tests", "paged", "main", "handover", "arrival", "two-gpu"}
    for log in sorted(l for l in OUT.glob("*.log") if l.stem not in parts):
        results = re.findall(r"^test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored", log.read_text(errors="replace"), re.M)
        if results:
            ok = all(r[0] == "ok" for r in results)
            passed = sum(int(r[1]) for r in results)
            failed = sum(int(r[2]) for r in results)
            print(f"  {log.stem}: {'ok' if ok else 'FAILED'}, {passed} passed, {failed} failed")
            seen.append(log.stem)
            if not ok:
                missing.append(f"{log.stem} passing")
    need("GPU test binaries", seen or None)
    for name in ("summary.txt", "storage-summary.txt"):
        for line in read(name).splitlines():
            if line.startswith(("  NOT PASSED", "overall")):
                print(f"  {name}: {line.strip()}")


def paged():
    print("paged (gpu_bench --blocks 1024 --block-sizes 1,4, two processes on GPU 0; GB/s, every byte verified):")
    rows = re.findall(r"^(\S+ \S+)\s+(\d+) MiB\s+(\d+)\s+(merged|per-block)\s+([\d.]+)\s+(yes|no)", read("paged.log"), re.M)
    if not need("gpu_bench rows", rows or None):
        return
    by = {}
    for case, mib, _, mode, gbs, ver in rows:
        by.setdefault((case, mib), {})[mode] = (float(gbs), ver)
    for (case, mib), m in by.items():
        cells = ", ".join(f"{mode} {g:.1f}{'' if v == 'yes' else ' (NOT VERIFIED)'}" for mode, (g, v) in m.items())
        ratio = ""
        if "merged" in m and "per-block" in m:
            ratio = f"; per-block / merged {m['per-block'][0] / m['merged'][0]:.2f}"
        print(f"  {case} {mib} MiB x 1024: {cells}{ratio}")


def main_job():
    log = read("main.log")
    print("main job (disagg_kv over CUDA_IPC, two processes on GPU 0, every byte verified):")
    for op, who in (("WRITE", "prefill"), ("READ", "decode")):
        m = re.search(rf"{who}: {op} transfer \(post to done\): 16 requests x 524288 KiB: ([\d.]+) GB/s", log)
        need(f"main {op} 512 MiB post to done", m and m.group(1))
        if m:
            print(f"  {op}, 512 MiB requests of 64 KiB blocks (4 x 2,048), post to done: {m.group(1)} GB/s")
    paged = {(r["op"], r["block_bytes"]): r["gbs"] for r in jsonl("main-paged.jsonl")}
    for sect in re.split(r"^== burst: ", log, flags=re.M)[1:]:
        head = sect.splitlines()[0]
        op = re.search(r"--op (\w+)", head).group(1).upper()
        bb = int(re.search(r"--block-bytes (\d+)", head).group(1))
        b = re.search(r"bursts of 8 requests \(first make to last done\): .*?: ([\d.]+) GB/s", sect)
        mk = re.search(rf"{op} per request: make median ([\d.]+)", sect)
        p = need(f"paged_bench {op} {bb}", paged.get((op, bb)))
        if need(f"burst {op} {bb}", b and b.group(1)) and p:
            print(f"  {op}, {bb // 1024} KiB blocks, bursts of 8 requests of 8,192 descriptors: {b.group(1)} GB/s; "
                  f"paged_bench, 8,192 blocks: {p:.2f} GB/s; bursts / paged {float(b.group(1)) / p:.2f}"
                  + (f"; make median {mk.group(1)} us" if mk else ""))


def handover():
    log = read("handover.log")
    print("handover (benches/handover.rs beside NIXL 1.5.1's Python API, Llama-3-8B TP 1, two processes on GPU 0; us):")
    table = [l for l in log.splitlines() if l.startswith("|")]
    if need("handover table", table or None):
        for l in table:
            print(f"  {l}")


def arrival():
    log = read("arrival.log")
    print("arrival (examples/layerwise, Llama-3-70B's KV: 160 tensors of 2,048 blocks of 32 KiB):")
    m = re.search(r"(\d+) bytes GPU (\d) -> GPU (\d): layer 0 usable at ([\d.]+) ms, the whole request at ([\d.]+) ms", log)
    if need("layerwise line", m):
        print(f"  GPU {m.group(2)} -> GPU {m.group(3)}: layer 0 usable at {m.group(4)} ms of {m.group(5)} ms "
              f"({float(m.group(4)) / float(m.group(5)):.3f} of the request)")


def two_gpu():
    log = read("two-gpu.log")
    print("two GPUs (paged_bench 2,048 blocks, GB/s; the main job over CUDA_IPC, 512 MiB requests of 64 KiB blocks, post to done):")
    for src, dst in (("0", "1"), ("1", "0")):
        rows = need(f"paged_bench GPU {src} -> GPU {dst}", jsonl(f"two-gpu-paged-{src}{dst}.jsonl") or None) or []
        for r in rows:
            print(f"  GPU {src} -> GPU {dst} paged {r['op']} {r['block_bytes']} B: {r['gbs']:.2f}")
    for sect in re.split(r"^== main: ", log, flags=re.M)[1:]:
        head = sect.splitlines()[0]
        gpus = re.search(r"--gpus (\d),(\d)", head).groups()
        op = re.search(r"--op (\w+)", head).group(1).upper()
        who = "prefill" if op == "WRITE" else "decode"
        m = re.search(rf"{who}: {op} transfer \(post to done\): 16 requests x 524288 KiB: ([\d.]+) GB/s", sect)
        if need(f"main {op} GPUs {gpus[0]},{gpus[1]}", m and m.group(1)):
            print(f"  main GPU {gpus[0]} (prefill) -> GPU {gpus[1]} (decode) {op}: {m.group(1)} GB/s")


# A part is judged where it ran (the run writes NAME.log for each part it runs; CLAIMS_ONLY
# selects some); a run of none has nothing to show.
ran = 0
for name, part in (("tests", tests), ("paged", paged), ("main", main_job), ("handover", handover),
                   ("arrival", arrival), ("two-gpu", two_gpu)):
    if (OUT / f"{name}.log").exists():
        ran += 1
        part()
    elif name != "two-gpu":
        print(f"{name}: not run in this call")
need("a part run", ran or None)
if missing:
    print(f"missing figures: {', '.join(missing)}")
    sys.exit(1)
