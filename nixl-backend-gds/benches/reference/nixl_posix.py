#!/usr/bin/env python3
"""The same DRAM <-> FILE patterns as nixl-backend-gds's `storage` bench, on the real NIXL POSIX
plugin (NIXL 1.5.1), for a same-run comparison.

Install (once, outside any system Python):
    python3 -m pip install --target /opt/nixl-deps/nixl-ref 'nixl-cu13==1.5.1'
Run:
    PYTHONPATH=/opt/nixl-deps/nixl-ref python3 benches/reference/nixl_posix.py [--dir PATH] [--iters N]

Each pattern: a 1 GiB file, `count` blocks of `block` bytes per request, prepared once per file
window (make_prepped_xfer), one warm-up pass over the windows, then `iters` posts; throughput =
bytes / wall time of transfer + polling to DONE.
"""
import argparse
import ctypes
import mmap
import os
import time

try:
    from nixl_cu13._api import nixl_agent, nixl_agent_config
except ImportError:  # the meta package name
    from nixl._api import nixl_agent, nixl_agent_config

FILE_SIZE = 1 << 30
PATTERNS = [
    ("O_DIRECT 16 MiB x1", True, 16 << 20, 1),
    ("O_DIRECT 1 MiB x32", True, 1 << 20, 32),
    ("page cache 1 MiB x1", False, 1 << 20, 1),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--iters", type=int, default=40)
    args = ap.parse_args()

    agent = nixl_agent("ref", nixl_agent_config(backends=[]))
    agent.create_backend("POSIX")
    print(f"NIXL POSIX plugin, {args.iters} iterations per point, files in {args.dir}")
    print(f"{'pattern':<22} {'op':<6} {'GB/s':>10}")
    for name, direct, block, count in PATTERNS:
        path = os.path.join(args.dir, f"nixl-ref-bench-{os.getpid()}-{direct}.bin")
        flags = os.O_RDWR | os.O_CREAT | (os.O_DIRECT if direct else 0)
        fd = os.open(path, flags, 0o644)
        os.ftruncate(fd, FILE_SIZE)
        total = block * count
        buf = mmap.mmap(-1, total)  # page-aligned anonymous memory
        buf.write(os.urandom(total))
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        dram_reg = agent.register_memory([(addr, total, 0, "")], "DRAM")
        file_reg = agent.register_memory([(0, FILE_SIZE, fd, path)], "FILE")
        local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(addr + i * block, block, 0) for i in range(count)], "DRAM")
        nblocks = FILE_SIZE // block
        remote = agent.prep_xfer_dlist("ref", [(i * block, block, fd) for i in range(nblocks)], "FILE")
        windows = min(nblocks // count, args.iters + 1)
        for op in ("WRITE", "READ"):
            reqs = [
                agent.make_prepped_xfer(op, local, list(range(count)), remote, list(range(w * count, (w + 1) * count)))
                for w in range(windows)
            ]

            def run(h):
                st = agent.transfer(h)
                while st != "DONE":
                    if st == "ERR":
                        raise RuntimeError(f"{name} {op} failed")
                    st = agent.check_xfer_state(h)

            for h in reqs:
                run(h)
            t = time.perf_counter()
            for i in range(args.iters):
                run(reqs[i % len(reqs)])
            el = time.perf_counter() - t
            print(f"{name:<22} {op:<6} {total * args.iters / el / 1e9:>10.2f}", flush=True)
            for h in reqs:
                agent.release_xfer_handle(h)
        agent.release_dlist_handle(local)
        agent.release_dlist_handle(remote)
        agent.deregister_memory(dram_reg)
        agent.deregister_memory(file_reg)
        os.close(fd)
        os.unlink(path)


if __name__ == "__main__":
    main()
