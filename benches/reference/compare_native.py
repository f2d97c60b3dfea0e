#!/usr/bin/env python3
"""Interleaved nixl-rs vs native NIXL 1.5.1 (C++ API), optionally vs NIXL's Python binding too.

Each round runs, per point (default; --interleave sweep: per op), every implementation once in an
order that rotates between rounds and points:
  native  benches/reference/native/nixl_native (built by build.sh against the wheel's libnixl.so)
  ours    nixlbench --json (nixl-rs, UCX backend)
  python  benches/reference/nixl_ref.py (with --python; NIXL through its Python binding)
All use the same pattern: two processes, DRAM -> DRAM, prepared lists, one request by index
reposted, one page between blocks, progress thread off (native, ours; the Python reference keeps
NIXL's thread on, as its binding is normally used), and the same UCX: nixl-rs loads the wheel's
bundled libucp (NIXL_UCX_HOME=$NIXL_WHEEL_UCX). Then notification latency rounds (4 KiB WRITE +
notification, the target busy-polling): native vs ours.

Reports per point the median over rounds of GB/s, of the median and of the minimum request
latency (the minimum is the steadier figure on a loaded host), the ratio
nixl-rs / native (and / python), the load average before each run, and writes JSON with --out.

    python3 benches/reference/compare_native.py --nixlbench <nixlbench> \
        --native <nixl_native> --nixl-path $NIXL_PYTHONPATH --rounds 3 --out /tmp/native.json
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def run(cmd, env, timeout):
    try:
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"warning: {os.path.basename(cmd[0])} timed out", file=sys.stderr)
        return []
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.strip().startswith("{")]
    if out.returncode != 0:
        tail = " | ".join(out.stderr.strip().splitlines()[-3:])
        print(f"warning: {os.path.basename(cmd[0])} exited {out.returncode}: {tail}", file=sys.stderr)
    return rows


def wheel_env(nixl_path):
    libs = glob.glob(os.path.join(nixl_path, ".nixl_cu1*.mesonpy.libs"))
    ucp = glob.glob(os.path.join(nixl_path, "nixl_cu1*.libs", "libucp-*.so*"))
    if not libs or not ucp:
        sys.exit(f"compare_native.py: {nixl_path} is not a nixl-cu13 install (run scripts/deps/nixl.sh)")
    env = dict(os.environ)
    # The wheel's bundled libnl can crash at exit unless UCX's IB modules stay unloaded.
    env.setdefault("UCX_MODULES", "^ib,rdmacm")
    env["NIXL_UCX_HOME"] = ucp[0]
    env["LD_LIBRARY_PATH"] = libs[0] + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["NIXL_PLUGIN_DIR"] = os.path.join(libs[0], "plugins")
    return env


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nixlbench", required=True)
    p.add_argument("--native", required=True)
    p.add_argument("--nixl-path", default=os.environ.get("NIXL_PYTHONPATH", ""))
    p.add_argument("--python", action="store_true", help="also run the Python-binding reference")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--blocks", default="4096,65536,1048576,16777216,67108864")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--ops", default="READ,WRITE")
    p.add_argument("--interleave", choices=["point", "sweep"], default="point",
                   help="point: every (op, block, batch) runs each implementation back to back "
                        "(its own processes, buffers sized to the point); sweep: each "
                        "implementation runs a whole op sweep in turn")
    p.add_argument("--bytes-per-point", default="1e9")
    p.add_argument("--notif-rounds", type=int, default=None, help="default: --rounds; 0 skips")
    p.add_argument("--notif-iters", type=int, default=2000)
    p.add_argument("--timeout", type=int, default=1200, help="seconds per run")
    p.add_argument("--out", default="")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:ARGS",
                   help="also run nixlbench with these extra arguments as implementation NAME "
                        "(e.g. 't1:--cma-threads 1'); reported beside 'ours'")
    a = p.parse_args()
    variants = {}
    for v in a.variant:
        name, _, args = v.partition(":")
        variants[name] = args.split()
    env = wheel_env(a.nixl_path)
    py_env = dict(env, PYTHONPATH=a.nixl_path)
    blocks, batches, ops = a.blocks.split(","), a.batches.split(","), a.ops.split(",")
    buf = str(max(int(b) for b in blocks) * max(int(n) for n in batches) + 4096 * max(int(n) for n in batches))
    impls = ["native", "ours"] + list(variants) + (["python"] if a.python else [])
    results = {}  # (impl, op, block, batch) -> [row]
    loads = []
    # What one run covers: a whole op sweep, or one point (each implementation then runs it
    # back to back, so slow drifts of the host, e.g. memory bandwidth, hit both alike).
    if a.interleave == "sweep":
        units = [(op, blocks, batches, buf) for op in ops]
    else:
        units = [(op, [b], [n], str(int(n) * (int(b) + 4096))) for op in ops for b in blocks for n in batches]
    for r in range(a.rounds):
        for i, (op, ublocks, ubatches, ubuf) in enumerate(units):
            bl, bt = ",".join(ublocks), ",".join(ubatches)
            cmds = {
                "native": [a.native, "--mode", "sweep", "--op", op, "--blocks", bl, "--batches", bt,
                           "--buffer", ubuf, "--bytes-per-point", a.bytes_per_point],
                "ours": [a.nixlbench, "--json", "--progress-thread", "off", "--op", op, "--blocks", bl,
                         "--batches", bt, "--total-buffer-size", ubuf, "--bytes-per-point", a.bytes_per_point],
                "python": [sys.executable, os.path.join(HERE, "nixl_ref.py"), "--ops", op, "--blocks", *ublocks,
                           "--batches", *ubatches, "--buffer", ubuf, "--bytes-per-point", a.bytes_per_point],
            }
            for name, extra in variants.items():
                cmds[name] = cmds["ours"] + extra
            k = (r + i) % len(impls)
            for name in impls[k:] + impls[:k]:
                ld = load()
                loads.append(ld)
                for row in run(cmds[name], py_env if name == "python" else env, a.timeout):
                    key = (name, row["op"], row["block"], row["batch"])
                    results.setdefault(key, []).append(row)
                    print(f"round {r} load {ld:5.2f} {name:6} {row['op']:5} {row['block']:>9} x{row['batch']:<3} "
                          f"{row['gbps']:8.3f} GB/s  med {row['lat_med_us']:9.2f} us  "
                          f"min {row.get('lat_min_us', float('nan')):9.2f} us", flush=True)
    notif = {}
    for r in range(a.rounds if a.notif_rounds is None else a.notif_rounds):
        cmds = {
            "native": [a.native, "--mode", "notif", "--iters", str(a.notif_iters)],
            "ours": [a.nixlbench, "--json", "--mode", "notif", "--progress-thread", "off",
                     "--num-iter", str(a.notif_iters)],
        }
        order = ["native", "ours"] if r % 2 == 0 else ["ours", "native"]
        for name in order:
            ld = load()
            loads.append(ld)
            for row in run(cmds[name], env, a.timeout):
                notif.setdefault(name, []).append(row)
                print(f"notif round {r} load {ld:5.2f} {name:6} post->seen med {row['notif_med_us']:8.2f} us "
                      f"p99 {row['notif_p99_us']:9.2f} us min {row['notif_min_us']:6.2f} us", flush=True)

    def med(impl, op, b, n, f):
        rows = [x for x in results.get((impl, op, int(b), int(n)), []) if f in x]
        return statistics.median(x[f] for x in rows) if rows else None

    table = []
    for op in ops:
        for b in blocks:
            for n in batches:
                row = {"op": op, "block": int(b), "batch": int(n), "rounds": a.rounds}
                for impl in impls:
                    row[f"{impl}_gbps"] = med(impl, op, b, n, "gbps")
                    row[f"{impl}_lat_med_us"] = med(impl, op, b, n, "lat_med_us")
                    if impl != "python":
                        row[f"{impl}_lat_min_us"] = med(impl, op, b, n, "lat_min_us")
                if row["native_gbps"] and row["ours_gbps"]:
                    row["ratio_native"] = row["ours_gbps"] / row["native_gbps"]
                for name in variants:
                    if row["native_gbps"] and row.get(f"{name}_gbps"):
                        row[f"ratio_native_{name}"] = row[f"{name}_gbps"] / row["native_gbps"]
                if a.python and row.get("python_gbps") and row["ours_gbps"]:
                    row["ratio_python"] = row["ours_gbps"] / row["python_gbps"]
                table.append(row)
    print(f"\nload average during the runs: min {min(loads):.2f} median {statistics.median(loads):.2f} "
          f"max {max(loads):.2f}")
    head = ("| op | block | batch | native GB/s | nixl-rs GB/s | ratio | native med us | nixl-rs med us "
            "| native min us | nixl-rs min us |")
    for name in variants:
        head += f" {name} GB/s | {name} ratio |"
    if a.python:
        head += " Python GB/s | ratio vs Python |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    fmt = lambda v, d=3: "-" if v is None else f"{v:.{d}f}"
    for t in table:
        line = (f"| {t['op']} | {t['block']} | {t['batch']} | {fmt(t['native_gbps'])} | {fmt(t['ours_gbps'])} | "
                f"{fmt(t.get('ratio_native'), 2)} | {fmt(t['native_lat_med_us'], 2)} | {fmt(t['ours_lat_med_us'], 2)} | "
                f"{fmt(t.get('native_lat_min_us'), 2)} | {fmt(t.get('ours_lat_min_us'), 2)} |")
        for name in variants:
            line += f" {fmt(t.get(f'{name}_gbps'))} | {fmt(t.get(f'ratio_native_{name}'), 2)} |"
        if a.python:
            line += f" {fmt(t.get('python_gbps'))} | {fmt(t.get('ratio_python'), 2)} |"
        print(line)
    summary = {}
    for name, rows in notif.items():
        summary[name] = {k: statistics.median(r[k] for r in rows)
                         for k in ("notif_med_us", "notif_p99_us", "notif_min_us", "lat_med_us")}
        summary[name]["runs"] = len(rows)
        print(f"notification latency {name:6}: median of medians {summary[name]['notif_med_us']:.2f} us "
              f"(p99 {summary[name]['notif_p99_us']:.2f}, min {summary[name]['notif_min_us']:.2f}; "
              f"{len(rows)} runs x {a.notif_iters})")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"table": table, "notif": summary, "loads": loads,
                       "raw": {"|".join(map(str, k)): v for k, v in results.items()},
                       "notif_raw": notif}, f, indent=1)


if __name__ == "__main__":
    main()
