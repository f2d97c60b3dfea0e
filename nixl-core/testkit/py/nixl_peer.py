"""A stock NIXL agent driven over stdin/stdout, for nixl-rs interop tests.

One JSON command per line on stdin; one answer per command on stdout, on a line starting with
'@@ ' (NIXL and UCX log to stdout too). Byte strings travel as hex. The process ends with
os._exit (NIXL's bundled libraries may crash in exit handlers).
"""
import hashlib
import json
import os
import sys
import time

import numpy as np
from nixl_cu13._api import nixl_agent, nixl_agent_config

agent = None
bufs = {}  # addr -> numpy array (kept alive while registered)
vbufs = {}  # addr -> torch CUDA tensor (VRAM; only where torch and a GPU exist)


def pattern(n, seed):
    return ((np.arange(n, dtype=np.uint64) * 31 + seed) % 251).astype(np.uint8)


def find(addr, n):
    for a, t in vbufs.items():
        if a <= addr and addr + n <= a + t.numel():
            return t[addr - a: addr - a + n]
    for a, b in bufs.items():
        if a <= addr and addr + n <= a + b.size:
            return b[addr - a: addr - a + n]
    raise KeyError(f"no buffer holds {addr:#x}+{n}")


def wait_xfer(h, deadline, spin=False):
    while True:
        st = agent.check_xfer_state(h)
        if st != "PROC":
            return st
        if time.time() > deadline:
            return "TIMEOUT"
        if not spin:
            time.sleep(0.0005)


def handle(c):
    global agent
    op = c["op"]
    if op == "version":
        from importlib.metadata import version
        return {"version": version("nixl-cu13")}
    if op == "init":
        # Shared memory transports cannot detect a dead peer: NIXL then needs its UCX
        # backend without peer error handling (the backend parameter below).
        no_peer_errors = "tcp" not in os.environ.get("UCX_TLS", "tcp")
        cfg = nixl_agent_config(enable_prog_thread=True,
                                enable_listen_thread=c.get("listen", False),
                                listen_port=c.get("port", 0),
                                backends=[] if no_peer_errors else ["UCX"])
        agent = nixl_agent(c["name"], cfg)
        if no_peer_errors:
            agent.create_backend("UCX", {"ucx_error_handling_mode": "none"})
        return {}
    if op == "alloc" and c.get("vram"):
        import torch
        host = pattern(c["len"], c["seed"]) if "seed" in c else np.zeros(c["len"], np.uint8)
        t = torch.from_numpy(host).to("cuda:0")
        addr = t.data_ptr()
        vbufs[addr] = t
        agent.register_memory(agent.get_reg_descs([(addr, t.numel(), 0, "")], "VRAM"))
        return {"addr": addr}
    if op == "alloc":
        b = pattern(c["len"], c.get("seed", 0)) if "seed" in c else np.zeros(c["len"], np.uint8)
        addr = b.ctypes.data
        bufs[addr] = b
        agent.register_memory(agent.get_reg_descs([(addr, b.size, 0, "")], "DRAM"))
        return {"addr": addr}
    if op == "fill":
        v = find(c["addr"], c["len"])
        if isinstance(v, np.ndarray):
            v[:] = pattern(c["len"], c["seed"])
        else:
            import torch
            v.copy_(torch.from_numpy(pattern(c["len"], c["seed"])))
        return {}
    if op == "read":
        v = find(c["addr"], c["len"])
        if not isinstance(v, np.ndarray):
            v = v.cpu().numpy()
        return {"hex": v.tobytes().hex()}
    if op == "sha":
        v = find(c["addr"], c["len"])
        if not isinstance(v, np.ndarray):
            v = v.cpu().numpy()
        return {"sha": hashlib.sha256(v.tobytes()).hexdigest()}
    if op == "md":
        return {"md": agent.get_agent_metadata().hex()}
    if op == "load":
        name = agent.add_remote_agent(bytes.fromhex(c["md"]))
        return {"name": name.decode() if isinstance(name, bytes) else name}
    if op == "remove":
        agent.remove_remote_agent(c["name"])
        return {}
    if op == "bench":
        # One request posted `iters` times back to back (each to completion): seconds taken.
        mem = c.get("mem", "DRAM")
        local = agent.get_xfer_descs([(c["laddr"], c["len"], 0)], mem)
        remote = agent.get_xfer_descs([(c["raddr"], c["len"], 0)], mem)
        h = agent.initialize_xfer(c["kind"], local, remote, c["remote"])
        for _ in range(c.get("warmup", 2)):
            agent.transfer(h)
            if wait_xfer(h, time.time() + 60, spin=True) != "DONE":
                return {"state": "ERR"}
        t = time.perf_counter()
        for _ in range(c["iters"]):
            agent.transfer(h)
            if wait_xfer(h, time.time() + 60, spin=True) != "DONE":
                return {"state": "ERR"}
        secs = time.perf_counter() - t
        agent.release_xfer_handle(h)
        return {"state": "DONE", "secs": secs}
    if op == "xfer":
        mem = c.get("mem", "DRAM")
        local = agent.get_xfer_descs([(c["laddr"], c["len"], 0)], mem)
        remote = agent.get_xfer_descs([(c["raddr"], c["len"], 0)], mem)
        h = agent.initialize_xfer(c["kind"], local, remote, c["remote"],
                                  bytes.fromhex(c.get("notif", "")))
        st = agent.transfer(h)
        if st == "ERR":
            return {"state": "ERR"}
        st = wait_xfer(h, time.time() + c.get("timeout", 20))
        agent.release_xfer_handle(h)
        return {"state": st}
    if op == "notifs":
        deadline = time.time() + c.get("wait", 10)
        got = {}
        while True:
            for k, v in agent.get_new_notifs().items():
                got.setdefault(k, []).extend(m.hex() for m in v)
            if sum(len(v) for v in got.values()) >= c.get("count", 1) or time.time() > deadline:
                return {"notifs": got}
            time.sleep(0.001)
    if op == "gen_notif":
        agent.send_notif(c["remote"], bytes.fromhex(c["msg"]))
        return {}
    if op == "send_md":
        agent.send_local_metadata(c.get("ip", ""), c.get("port", 0))
        return {}
    if op == "fetch_md":
        agent.fetch_remote_metadata(c["name"], c.get("ip", ""), c.get("port", 0))
        return {}
    if op == "check_md":
        deadline = time.time() + c.get("wait", 10)
        while True:
            ok = agent.check_remote_metadata(c["name"])
            if ok == c.get("want", True) or time.time() > deadline:
                return {"loaded": ok}
            time.sleep(0.01)
    if op == "invalidate_local":
        agent.invalidate_local_metadata(c.get("ip", ""), c.get("port", 0))
        return {}
    if op == "exit":
        sys.stdout.flush()
        os._exit(0)
    raise ValueError(f"unknown op {op}")


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            out = {"ok": True, **handle(json.loads(line))}
        except Exception as e:  # the test reads the error and fails with it
            out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        sys.stdout.write("@@ " + json.dumps(out) + "\n")
        sys.stdout.flush()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
