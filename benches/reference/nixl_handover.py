#!/usr/bin/env python3
"""NIXL's side of the handover benchmark (benches/handover.rs, issue 37), through NIXL's Python
API as vLLM's NIXL connector calls it.

The same shapes, steps and checks as `handover`: every layer's K and V caches are regions of
`pool` blocks (16 tokens of 8 / tp KV heads of 128, bf16), both sides prepare every block once
(`prep_xfer_dlist`, region by region), and a request of T tokens is one READ of 2 x layers x
T / 16 descriptors by index (`make_prepped_xfer` with a notification, `transfer`, polling
`check_xfer_state` until DONE, `release_xfer_handle`).

- first contact: prefill starts a fresh agent (untimed); decode's clock starts when it learns
  of the request and stops when the READ is done: metadata (over this program's pipe to
  prefill, as vLLM's handshake carries it, then `add_remote_agent`; or, with
  `--metadata listener`, NIXL's own side channel: `fetch_remote_metadata` then polling
  `check_remote_metadata`), the remote list's preparation, make, post, done.
- steady state: make + post + done (release timed apart).

Host memory (numpy) over UCX, or with `--device cuda` GPU memory (torch) over UCX's CUDA
transports. Every byte of the first and last request of each size (in host memory, of every
first-contact request) is checked, and that nothing else of decode's pool was written; in host
memory the first word of every block of the others.

    PYTHONPATH=$NIXL_PYTHONPATH python3 benches/reference/nixl_handover.py --tokens 1024,4096

Prints one JSON object per (size, phase), the keys `handover --json` prints.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

try:
    from nixl_cu13._api import nixl_agent, nixl_agent_config
except ImportError:  # the non-CUDA-13 wheel names its module `nixl`
    from nixl._api import nixl_agent, nixl_agent_config

M64 = (1 << 64) - 1


def cli():
    p = argparse.ArgumentParser()
    p.add_argument("--role", default="decode")
    p.add_argument("--model", default="llama3-8b")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--layers", type=int, default=None, help="instead of the model's")
    p.add_argument("--tokens", default="1024,4096,16384")
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--contacts", type=int, default=5)
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--device", default="cpu")
    p.add_argument("--gpus", default="0,0")
    p.add_argument("--pool", type=int, default=None)
    p.add_argument("--ucx-spin-us", type=int, default=0,
                   help="nixl-rs's UcxParams::progress_spin; ignored here (NIXL's thread never sleeps)")
    p.add_argument("--lists", default="flat", choices=["flat", "strided"],
                   help="strided: one Nx5 row (address, len, dev, stride, count) per region")
    p.add_argument("--metadata", default="pipe", choices=["pipe", "listener"])
    p.add_argument("--port", type=int, default=0, help="listener: prefill's first port")
    a = p.parse_args()
    a.tokens = [int(t) for t in a.tokens.split(",")]
    layers = a.layers or {"llama3-8b": 32, "llama3-70b": 80}[a.model]
    if a.tp <= 0 or 8 % a.tp:
        sys.exit("--tp must divide the 8 KV heads")
    a.regions = 2 * layers
    a.block_bytes = a.block_tokens * (8 // a.tp) * 128 * 2
    most = max((t + a.block_tokens - 1) // a.block_tokens for t in a.tokens)
    a.pool = a.pool or most + most // 4
    a.gpu = [int(g) for g in a.gpus.split(",")]
    return a


def words(region, blocks):
    """The word (uint64) every 8 bytes of prefill's `blocks` of `region` hold: handover.rs' `word`."""
    x = (np.uint64(region) << np.uint64(32)) | np.asarray(blocks, dtype=np.uint64)
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (x ^ (x >> np.uint64(31))) | np.uint64(1)


class Pool:
    """2 x layers regions of `pool` blocks, in host (numpy) or GPU (torch) memory."""

    def __init__(self, a, prefill):
        self.a = a
        n = a.pool * a.block_bytes
        if a.device == "cuda":
            import torch

            self.torch = torch
            self.dev = a.gpu[0 if prefill else 1]
            self.regions = [torch.zeros(n, dtype=torch.uint8, device=f"cuda:{self.dev}") for _ in range(a.regions)]
            self.addrs = [t.data_ptr() for t in self.regions]
            self.mem = "VRAM"
        else:
            self.dev = 0
            self.regions = [np.zeros(n, dtype=np.uint8) for _ in range(a.regions)]
            self.addrs = [r.ctypes.data for r in self.regions]
            self.mem = "DRAM"

    def rows(self, r):
        """Region r as (pool, block_bytes / 8) words."""
        t = self.regions[r]
        if self.mem == "VRAM":
            return t.view(self.torch.int64).view(self.a.pool, -1)
        return t.view(np.uint64).reshape(self.a.pool, -1)

    def fill(self):
        for r in range(len(self.regions)):
            w = words(r, np.arange(self.a.pool))
            if self.mem == "VRAM":
                self.rows(r).copy_(self.torch.from_numpy(w.view(np.int64))[:, None].expand(-1, self.rows(r).shape[1]))
            else:
                self.rows(r)[:] = w[:, None]

    def clear(self):
        for t in self.regions:
            t.fill(0) if self.mem == "DRAM" else t.zero_()

    def clear_words(self, dst):
        if self.mem == "VRAM":
            return
        for r in range(len(self.regions)):
            self.rows(r)[dst, 0] = 0

    def check(self, src, dst, full):
        if self.mem == "VRAM" and not full:
            return
        mask = np.ones(self.a.pool, dtype=bool)
        mask[dst] = False
        if self.mem == "VRAM":  # compared on the GPU
            torch = self.torch
            dst_t = torch.from_numpy(np.asarray(dst, dtype=np.int64)).to(f"cuda:{self.dev}")
            mask_t = torch.from_numpy(mask).to(f"cuda:{self.dev}")
        for r in range(len(self.regions)):
            rows = self.rows(r)
            want = words(r, src)
            if self.mem == "VRAM":
                want_t = torch.from_numpy(want.view(np.int64)).to(f"cuda:{self.dev}")
                if not bool((rows[dst_t] == want_t[:, None]).all()):
                    raise SystemExit(f"region {r}: a destination block is not its source's")
                if bool(rows[mask_t].any()):
                    raise SystemExit(f"region {r}: a byte outside the request was written")
                continue
            if full:
                if not (rows[dst] == want[:, None]).all():
                    raise SystemExit(f"region {r}: a destination block is not its source's")
                if rows[mask].any():
                    raise SystemExit(f"region {r}: a byte outside the request was written")
            elif not (rows[dst, 0] == want).all():
                raise SystemExit(f"region {r}: a destination block's first word is not its source's")

    def descs(self, addrs=None, dev=None):
        bb, pool = self.a.block_bytes, self.a.pool
        base = np.asarray(addrs if addrs is not None else self.addrs, dtype=np.int64)
        if self.a.lists == "strided":
            out = np.empty((len(base), 5), dtype=np.int64)
            out[:, 0] = base
            out[:, 1] = bb
            out[:, 2] = self.dev if dev is None else dev
            out[:, 3] = bb
            out[:, 4] = pool
            return out
        offs = np.arange(pool, dtype=np.int64) * bb
        out = np.empty((len(base) * pool, 3), dtype=np.int64)
        out[:, 0] = (base[:, None] + offs[None, :]).reshape(-1)
        out[:, 1] = bb
        out[:, 2] = self.dev if dev is None else dev
        return out

    def reg_descs(self):
        n = self.a.pool * self.a.block_bytes
        return [(addr, n, self.dev, "") for addr in self.addrs]


def prefill(a):
    pool = Pool(a, True)
    pool.fill()
    if pool.mem == "VRAM":
        pool.torch.cuda.synchronize()
    out = sys.stdout
    print("pool", file=out, flush=True)
    current = None
    for line in sys.stdin:
        cmd = line.split()
        if current is not None:
            current.get_new_notifs()
        if cmd[:1] == ["agent"]:
            current = None  # decode has removed it
            name = f"nixl-handover-prefill-{os.getpid()}-{cmd[1]}"
            if a.metadata == "listener":
                port = a.port + int(cmd[1])
                cfg = nixl_agent_config(enable_listen_thread=True, listen_port=port, backends=["UCX"])
            else:
                port = 0
                cfg = nixl_agent_config(backends=["UCX"])
            t = time.perf_counter()
            current = nixl_agent(name, cfg)
            agent_us = (time.perf_counter() - t) * 1e6
            t = time.perf_counter()
            current.register_memory(pool.reg_descs(), pool.mem)
            reg_us = (time.perf_counter() - t) * 1e6
            print("ready", name, f"127.0.0.1:{port}", f"{agent_us:.1f}", f"{reg_us:.1f}", *pool.addrs, file=out, flush=True)
        elif cmd[:1] == ["md"]:
            print("md", current.get_agent_metadata().hex(), file=out, flush=True)
        elif cmd[:1] == ["quit"]:
            break
        else:
            raise SystemExit(f"prefill: unknown command {cmd}")
    out.flush()
    os._exit(0)  # NIXL's bundled libnl may crash at exit


def pct(v, p):
    v = sorted(v)
    return v[min(int(len(v) * p), len(v) - 1)] if v else float("nan")


def report(a, tokens, phase, times, nbytes):
    whole = [t["fetch"] + t["prep"] + t["make"] + t["post"] + t["done"] for t in times]
    med = lambda k: pct([t[k] for t in times], 0.5)
    print(json.dumps({
        "impl": "nixl", "model": a.model, "tp": a.tp, "device": a.device, "lists": a.lists, "tokens": tokens,
        "phase": phase, "n": len(times), "bytes": nbytes, "metadata": a.metadata,
        "p50_us": round(pct(whole, 0.5), 1), "p99_us": round(pct(whole, 0.99), 1),
        **{f"{k}_us": round(med(k), 1) for k in ["fetch", "prep", "make", "post", "done", "release"]},
        **{f"{k}_us": round(med(k), 1) for k in ["agent", "register"] if k in times[0]},
    }), flush=True)


def decode(a):
    pool = Pool(a, False)
    port = a.port or 20000 + os.getpid() % 20000
    if a.metadata == "listener":
        # NIXL's fetch is served by the asking agent's listener thread too.
        cfg = nixl_agent_config(enable_listen_thread=True, listen_port=port, backends=["UCX"])
    else:
        cfg = nixl_agent_config(backends=["UCX"])
    agent = nixl_agent(f"nixl-handover-decode-{os.getpid()}", cfg)
    agent.register_memory(pool.reg_descs(), pool.mem)
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", pool.descs(), pool.mem)
    child = subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--role", "prefill", "--port", str(port)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def answer():
        # NIXL logs to stdout too: skip its lines.
        while True:
            line = child.stdout.readline()
            if not line:
                raise SystemExit("prefill exited")
            if line.split()[:1] in (["pool"], ["ready"], ["md"]):
                return line.split()

    def ask(cmd):
        child.stdin.write(cmd + "\n")
        child.stdin.flush()
        return answer()

    if answer() != ["pool"]:
        raise SystemExit("prefill did not start")
    rng = np.random.default_rng(0x2545F491)
    regions = a.regions

    def idx(blocks):
        return (np.arange(regions, dtype=np.int64)[:, None] * a.pool + np.asarray(blocks)[None, :]).reshape(-1).astype(np.int32)

    def request(remote, src, dst, tag, t):
        li, ri = idx(dst), idx(src)
        t0 = time.perf_counter()
        h = agent.make_prepped_xfer("READ", local, li, remote, ri, notif_msg=f"req-{tag}".encode())
        t1 = time.perf_counter()
        st = agent.transfer(h)
        t2 = time.perf_counter()
        while st != "DONE":
            if st == "ERR":
                raise SystemExit("transfer failed")
            if time.perf_counter() - t2 > 30:
                raise SystemExit(f"request {tag} not done within 30 s")
            st = agent.check_xfer_state(h)
        t3 = time.perf_counter()
        agent.release_xfer_handle(h)
        t4 = time.perf_counter()
        t.update(make=(t1 - t0) * 1e6, post=(t2 - t1) * 1e6, done=(t3 - t2) * 1e6, release=(t4 - t3) * 1e6)

    start = time.perf_counter()

    def say(what):
        print(f"nixl_handover: {time.perf_counter() - start:8.3f} s {what}", file=sys.stderr, flush=True)

    say("decode ready; prefill's pool filled")
    gen = 0
    for tokens in a.tokens:
        nb = (tokens + a.block_tokens - 1) // a.block_tokens
        nbytes = nb * regions * a.block_bytes
        first = []
        remote = name = None
        for _ in range(max(a.contacts, 1)):
            if name is not None:
                agent.release_dlist_handle(remote)
                agent.remove_remote_agent(name)
            gen += 1
            ready = ask(f"agent {gen}")
            if ready[0] != "ready":
                raise SystemExit(f"prefill answered {ready}")
            name, addr, bases = ready[1], ready[2], [int(b) for b in ready[5:]]
            started = {"agent": float(ready[3]), "register": float(ready[4])}
            src, dst = rng.permutation(a.pool)[:nb], rng.permutation(a.pool)[:nb]
            full = not first or pool.mem == "DRAM"
            pool.clear() if full else pool.clear_words(dst)
            t = dict(started)
            t0 = time.perf_counter()
            if a.metadata == "listener":
                ip, port = addr.rsplit(":", 1)
                agent.fetch_remote_metadata(name, ip, int(port))
                end = time.perf_counter() + 10
                while not agent.check_remote_metadata(name):
                    if time.perf_counter() > end:
                        raise SystemExit(f"no metadata from {name} within 10 s")
            else:
                md = ask("md")
                agent.add_remote_agent(bytes.fromhex(md[1]))
            t1 = time.perf_counter()
            remote = agent.prep_xfer_dlist(name, pool.descs(bases, a.gpu[0] if pool.mem == "VRAM" else 0), pool.mem)
            t2 = time.perf_counter()
            say(f"{tokens} tokens, contact {gen}: metadata and list ready")
            request(remote, src, dst, gen, t)
            say(f"{tokens} tokens, contact {gen}: done")
            t.update(fetch=(t1 - t0) * 1e6, prep=(t2 - t1) * 1e6)
            pool.check(src, dst, full)
            first.append(t)
        report(a, tokens, "first contact", first, nbytes)
        steady = []
        n = max(a.requests, 1)
        for i in range(n):
            src, dst = rng.permutation(a.pool)[:nb], rng.permutation(a.pool)[:nb]
            last = i + 1 == n
            pool.clear() if last else pool.clear_words(dst)
            t = {"fetch": 0.0, "prep": 0.0}
            request(remote, src, dst, i, t)
            pool.check(src, dst, last)
            steady.append(t)
        report(a, tokens, "steady", steady, nbytes)
        say(f"{tokens} tokens: {n} steady requests done")
    child.stdin.write("quit\n")
    child.stdin.flush()
    child.wait()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    args = cli()
    prefill(args) if args.role == "prefill" else decode(args)
