"""The other side of `disagg_kv --nixl-peer`: a stock NIXL agent (the nixl-cu13 wheel's Python
API) that plays prefill or decode against a nixl-rs agent, with the same KV pool layout, block
tables, byte pattern and messages as examples/disagg_kv.rs. Metadata goes over NIXL's own side
channel (NIXLCOMM): this agent sends its metadata to the nixl-rs listener and fetches the
nixl-rs agent's from it. Decode verifies every byte.

Normally started by disagg_kv; by hand:
  PYTHONPATH=$NIXL_PYTHONPATH python3 examples/nixl_kv.py --role decode --peer-port 5555 ...
"""
import argparse
import os
import sys
import time

import numpy as np
from nixl_cu13._api import nixl_agent, nixl_agent_config

M64 = (1 << 64) - 1


def kv_bytes(req, layer_ks, nbytes):
    """The bytes disagg_kv's prefill computes for each (layer, k) of a request: one xorshift64
    stream per block, seeded as in kv_bytes() of disagg_kv.rs. Returns (len(layer_ks), nbytes)."""
    seeds = [((((req << 40) ^ (l << 20) ^ k) * 0x9E3779B97F4A7C15) & M64) | 1 for l, k in layer_ks]
    x = np.array(seeds, dtype=np.uint64)
    steps = (nbytes + 7) // 8
    out = np.empty((len(seeds), steps), dtype=np.uint64)
    s13, s7, s17 = np.uint64(13), np.uint64(7), np.uint64(17)
    for i in range(steps):
        x ^= x << s13
        x ^= x >> s7
        x ^= x << s17
        out[:, i] = x
    return out.astype("<u8").view(np.uint8).reshape(len(seeds), steps * 8)[:, :nbytes]


def tables(o, req):
    b, k = o.blocks, o.blocks_per_request
    src = [(req * k + i) % b for i in range(k)]
    stride = (b // 2 + 1) | 1
    seen = [False] * b
    dst = []
    for i in range(k):
        d = ((req * 31 + i) * stride + req) % b
        while seen[d]:
            d = (d + 1) % b
        seen[d] = True
        dst.append(d)
    return src, dst


def indices(o, blocks):
    return [layer * o.blocks + b for layer in range(o.layers) for b in blocks]


class Node:
    def __init__(self, o, name):
        self.o = o
        cfg = nixl_agent_config(enable_prog_thread=True, enable_listen_thread=True,
                                listen_port=o.listen_port, backends=["UCX"])
        self.agent = nixl_agent(name, cfg)
        self.pool = np.zeros(o.layers * o.blocks * o.block_bytes, dtype=np.uint8)
        self.base = self.pool.ctypes.data
        self.agent.register_memory(
            self.agent.get_reg_descs([(self.base, self.pool.size, 0, "")], "DRAM"))
        self.queue = []

    def blocks(self, base):
        s = self.o.block_bytes
        return [(base + i * s, s, 0) for i in range(self.o.layers * self.o.blocks)]

    def block(self, layer, b):
        off = (layer * self.o.blocks + b) * self.o.block_bytes
        return self.pool[off: off + self.o.block_bytes]

    def next_msg(self, peer):
        end = time.time() + self.o.timeout
        while not self.queue:
            if time.time() > end:
                raise TimeoutError(f"no message from {peer}")
            self.queue.extend(self.agent.get_new_notifs().get(peer, []))
            if not self.queue:
                time.sleep(0.0002)
        return self.queue.pop(0).decode()

    def wait(self, h):
        end = time.time() + self.o.timeout
        while True:
            st = self.agent.check_xfer_state(h)
            if st == "DONE":
                return
            if st != "PROC" or time.time() > end:
                raise RuntimeError(f"transfer ended in {st}")


def exchange(n, peer):
    a = n.agent
    a.send_local_metadata("127.0.0.1", n.o.peer_port)
    end = time.time() + n.o.timeout
    while not a.check_remote_metadata(peer):
        if time.time() > end:
            raise TimeoutError(f"no metadata of {peer}")
        a.fetch_remote_metadata(peer, "127.0.0.1", n.o.peer_port)
        time.sleep(0.2)


def fill(n, req, src):
    o = n.o
    lk = [(layer, k) for layer in range(o.layers) for k in range(len(src))]
    data = kv_bytes(req, lk, o.block_bytes)
    for row, (layer, k) in enumerate(lk):
        n.block(layer, src[k])[:] = data[row]


def verify(n, req, dst):
    o = n.o
    lk = [(layer, k) for layer in range(o.layers) for k in range(len(dst))]
    want = kv_bytes(req, lk, o.block_bytes)
    for row, (layer, k) in enumerate(lk):
        if not np.array_equal(n.block(layer, dst[k]), want[row]):
            return f"layer {layer} block {dst[k]} differs"
    return None


def prefill(o):
    n = Node(o, "prefill")
    a = n.agent
    exchange(n, "decode")
    msg = n.next_msg("decode")
    decode_pool = int(msg.removeprefix("ready:"))
    per_req = o.layers * o.blocks_per_request * o.block_bytes
    lists = None
    if o.op == "write":
        lists = (a.prep_xfer_dlist("NIXL_INIT_AGENT", n.blocks(n.base), "DRAM"),
                 a.prep_xfer_dlist("decode", n.blocks(decode_pool), "DRAM"))
    else:
        a.send_notif("decode", f"pool:{n.base}".encode())
    lat = []
    for req in range(o.requests):
        src, dst = tables(o, req)
        fill(n, req, src)
        t = time.time()
        if lists:
            h = a.make_prepped_xfer("WRITE", lists[0], indices(o, src), lists[1], indices(o, dst),
                                    f"req:{req}".encode())
            a.transfer(h)
            n.wait(h)
            a.release_xfer_handle(h)
        else:
            a.send_notif("decode", f"req:{req}".encode())
        reply = n.next_msg("decode")
        if reply != f"ok:{req}":
            raise RuntimeError(f"decode reported: {reply}")
        lat.append(time.time() - t)
    a.send_notif("decode", b"done")
    total = sum(lat)
    print(f"prefill (NIXL): {o.requests} requests x {per_req >> 10} KiB verified by decode, "
          f"{per_req * len(lat) / max(total, 1e-9) / 1e9:.2f} GB/s incl. verification")


def decode(o):
    n = Node(o, "decode")
    a = n.agent
    exchange(n, "prefill")
    a.send_notif("prefill", f"ready:{n.base}".encode())
    lists = None
    verified = 0
    while True:
        msg = n.next_msg("prefill")
        if msg == "done":
            break
        if msg.startswith("pool:"):
            lists = (a.prep_xfer_dlist("NIXL_INIT_AGENT", n.blocks(n.base), "DRAM"),
                     a.prep_xfer_dlist("prefill", n.blocks(int(msg[5:])), "DRAM"))
            continue
        req = int(msg.removeprefix("req:"))
        src, dst = tables(o, req)
        if o.op == "read":
            h = a.make_prepped_xfer("READ", lists[0], indices(o, dst), lists[1], indices(o, src))
            a.transfer(h)
            n.wait(h)
            a.release_xfer_handle(h)
        bad = verify(n, req, dst)
        a.send_notif("prefill", (f"bad:{req}: {bad}" if bad else f"ok:{req}").encode())
        if bad:
            raise RuntimeError(f"request {req}: {bad}")
        verified += 1
    if verified != o.requests:
        raise RuntimeError(f"verified {verified} of {o.requests} requests")
    per_req = o.layers * o.blocks_per_request * o.block_bytes
    print(f"decode (NIXL): verified every byte of {verified} requests ({per_req >> 20} MiB each)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--role", choices=["prefill", "decode"], required=True)
    p.add_argument("--peer-port", type=int, required=True)
    p.add_argument("--listen-port", type=int, required=True)
    p.add_argument("--op", choices=["read", "write"], default="write")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--blocks", type=int, default=128)
    p.add_argument("--block-bytes", type=int, default=64 << 10)
    p.add_argument("--blocks-per-request", type=int, default=16)
    p.add_argument("--timeout", type=float, default=60)
    o = p.parse_args()
    code = 0
    try:
        (prefill if o.role == "prefill" else decode)(o)
    except Exception as e:
        print(f"nixl_kv.py ({o.role}) failed: {type(e).__name__}: {e}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # NIXL's bundled libraries may crash in exit handlers


if __name__ == "__main__":
    main()
