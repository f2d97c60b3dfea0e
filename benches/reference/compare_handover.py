#!/usr/bin/env python3
"""The handover benchmark, nixl-rs beside NIXL in one run (issue 37; docs/perf/scale.md).

Runs `handover --json` (benches/handover.rs) and benches/reference/nixl_handover.py (NIXL's
Python API, as vLLM calls it) with the same shape arguments, alternating which goes first
each round, and prints per (tokens, phase) the medians over rounds of each side's p50 and
p99 (us) and of its make / post / done, and NIXL / nixl-rs for p50 and p99 (above 1: nixl-rs
is faster). nixl-rs loads the wheel's libucp (NIXL_UCX_HOME=$NIXL_WHEEL_UCX) so both run one
UCX. Every run checks its bytes and exits non-zero on a mismatch; this one then prints what it
has and exits non-zero.

    python3 benches/reference/compare_handover.py --handover target/release/handover \\
        --nixl-path $NIXL_PYTHONPATH --rounds 2 -- --model llama3-8b --tokens 1024,4096

Arguments after `--` go to both sides. `--metadata listener` goes to NIXL only (its own side
channel instead of the pipe); `--out FILE` keeps every run's JSON.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, env, timeout):
    """The JSON rows of one run, each printed as it is read; a run that fails or times out
    prints its output's tail and gives what it printed before."""
    rows = []
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        dec = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        out, err, rc = dec(e.stdout), dec(e.stderr), f"timed out after {timeout} s"
    for line in out.splitlines():
        if line.startswith("{"):
            rows.append(json.loads(line))
            print(line, flush=True)
    if rc != 0:
        sys.stderr.write(out[-2000:] + err[-4000:])
        print(f"FAILED: {os.path.basename(cmd[1] if cmd[0] == sys.executable else cmd[0])}: {rc}", flush=True)
        FAILED.append(cmd)
    return rows


FAILED = []


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--handover", required=True)
    p.add_argument("--nixl-path", default=os.environ.get("NIXL_PYTHONPATH", ""))
    p.add_argument("--ucx", default=os.environ.get("NIXL_WHEEL_UCX", ""))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--metadata", default="pipe")
    p.add_argument("--timeout", type=int, default=300, help="per run, seconds")
    p.add_argument("--out")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    a = p.parse_args()
    shape = [x for x in a.rest if x != "--"]
    env = dict(os.environ)
    if a.ucx:
        env["NIXL_UCX_HOME"] = a.ucx
    penv = dict(env)
    penv["PYTHONPATH"] = a.nixl_path + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    ours = [a.handover, "--json", *shape]
    nixl = [sys.executable, os.path.join(HERE, "nixl_handover.py"), "--metadata", a.metadata, *shape]
    runs = []
    for r in range(a.rounds):
        order = [("nixl-rs", ours, env), ("nixl", nixl, penv)]
        if r % 2:
            order.reverse()
        for name, cmd, e in order:
            load = os.getloadavg()[0]
            for row in run(cmd, e, a.timeout):
                row.update(round=r, load=load)
                runs.append(row)
            print(f"round {r + 1}/{a.rounds}: {name} done (load {load:.2f})", file=sys.stderr, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(runs, f, indent=1)
    keys = []
    for row in runs:
        k = (row["tokens"], row["phase"])
        if k not in keys:
            keys.append(k)
    med = lambda impl, k, f: statistics.median(
        x[f] for x in runs if x["impl"] == impl and (x["tokens"], x["phase"]) == k)
    if not runs:
        sys.exit("no run printed a result")
    first = runs[0]
    print(f"Handover, {first['model']} TP {first['tp']}, {first['device']}, {first.get('lists', 'flat')} lists; {a.rounds} rounds, "
          f"medians over rounds; us (NIXL's metadata: {a.metadata})")
    print("| tokens | phase | MiB | nixl-rs p50 / p99 | NIXL p50 / p99 | NIXL / nixl-rs, p50 / p99 "
          "| nixl-rs make / post / done | NIXL make / post / done |")
    print("|---|---|---|---|---|---|---|---|")
    for k in keys:
        if not all(any(x["impl"] == i and (x["tokens"], x["phase"]) == k for x in runs) for i in ["nixl-rs", "nixl"]):
            print(f"| {k[0]} | {k[1]} | (not both measured) |")
            continue
        o = {f: med("nixl-rs", k, f) for f in ["p50_us", "p99_us", "make_us", "post_us", "done_us", "bytes"]}
        n = {f: med("nixl", k, f) for f in ["p50_us", "p99_us", "make_us", "post_us", "done_us"]}
        print(f"| {k[0]} | {k[1]} | {o['bytes'] / 2**20:.0f} | {o['p50_us']:.0f} / {o['p99_us']:.0f} "
              f"| {n['p50_us']:.0f} / {n['p99_us']:.0f} | {n['p50_us'] / o['p50_us']:.2f} / "
              f"{n['p99_us'] / o['p99_us']:.2f} | {o['make_us']:.0f} / {o['post_us']:.0f} / {o['done_us']:.0f} "
              f"| {n['make_us']:.0f} / {n['post_us']:.0f} / {n['done_us']:.0f} |")
    if all(any(x["impl"] == i for x in runs) for i in ["nixl-rs", "nixl"]):
        startup(runs, keys, med)
    if FAILED:
        sys.exit(f"{len(FAILED)} run(s) failed")


def startup(runs, keys, med):
    """Prefill's agent with its backend and its registration, per first-contact size."""
    rows = [k for k in keys if k[1] == "first contact"]
    if not rows or not all("agent_us" in x for x in runs if x["phase"] == "first contact"):
        return
    print()
    print("| tokens | prefill's agent + backend, nixl-rs / NIXL (us) | its registration, nixl-rs / NIXL (us) |")
    print("|---|---|---|")
    for k in rows:
        print(f"| {k[0]} | {med('nixl-rs', k, 'agent_us'):.0f} / {med('nixl', k, 'agent_us'):.0f} "
              f"| {med('nixl-rs', k, 'register_us'):.0f} / {med('nixl', k, 'register_us'):.0f} |")


if __name__ == "__main__":
    main()
