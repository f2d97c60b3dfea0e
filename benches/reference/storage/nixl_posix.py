#!/usr/bin/env python3
"""The same DRAM <-> FILE patterns as nixl-backend-gds's `storage` bench, on the real NIXL POSIX
plugin (NIXL 1.5.1), for a same-run comparison.

Install (once, outside any system Python):
    python3 -m pip install --target /opt/nixl-deps/nixl-ref 'nixl-cu13==1.5.1'
Run:
    PYTHONPATH=/opt/nixl-deps/nixl-ref python3 benches/reference/storage/nixl_posix.py [--dir PATH] [--iters N]

Each pattern: a 1 GiB file, `count` blocks of `block` bytes per request, prepared once per file
window (make_prepped_xfer), one warm-up pass over the windows, then `iters` posts; throughput =
bytes / wall time of transfer + polling to DONE.

Lockstep mode (the comparison docs/perf/storage.md reports): drives nixl-rs's `storage` bench
binary in `--serve` mode and takes turns with it on the same disk, so both see the same disk
state (this VM's disk rate moves by 2x over minutes):
    PYTHONPATH=/opt/nixl-deps/nixl-ref python3 benches/reference/storage/nixl_posix.py --dir /tmp \
        --lockstep /path/to/storage-<hash> [--rounds 8] [--turn 10] [--fio]
Per pattern and op, each round runs `turn` requests on NIXL, on nixl-rs and (O_DIRECT patterns)
on the disk alone (a synchronous O_DIRECT pwrite/pread per block from Python, what `dd` does),
all on the same windows of the same file, in an order rotated every round; with --fio also fio
(libaio, the pattern's block size, iodepth = blocks per request) for one second. The table
gives medians over rounds and the median of the per-round nixl-rs/NIXL ratios.
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
    ap.add_argument("--lockstep", help="nixl-rs storage bench binary to take turns with")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--turn", type=int, default=10)
    ap.add_argument("--windows", type=int, default=31)
    ap.add_argument("--fio", action="store_true")
    ap.add_argument("--rs-args", action="append", default=None,
                    help="extra arguments for the nixl-rs binary; repeat to run several configurations side by side")
    ap.add_argument("--only", default="", help="run only patterns whose name contains this")
    args = ap.parse_args()
    if args.lockstep:
        return lockstep(args)

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


class NixlSide:
    """One pattern on NIXL: file, buffer, prepared requests per op (as in main())."""

    def __init__(self, agent, d, name, direct, block, count, windows, path=None):
        self.agent = agent
        self.owned = path is None
        self.path = path or os.path.join(d, f"nixl-ref-bench-{os.getpid()}-{direct}.bin")
        flags = os.O_RDWR | os.O_CREAT | (os.O_DIRECT if direct else 0)
        self.fd = os.open(self.path, flags, 0o644)
        os.ftruncate(self.fd, FILE_SIZE)
        total = block * count
        self.buf = mmap.mmap(-1, total)
        self.buf.write(os.urandom(total))
        addr = ctypes.addressof(ctypes.c_char.from_buffer(self.buf))
        self.dram_reg = agent.register_memory([(addr, total, 0, "")], "DRAM")
        self.file_reg = agent.register_memory([(0, FILE_SIZE, self.fd, self.path)], "FILE")
        self.local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(addr + i * block, block, 0) for i in range(count)], "DRAM")
        nblocks = FILE_SIZE // block
        self.remote = agent.prep_xfer_dlist("ref", [(i * block, block, self.fd) for i in range(nblocks)], "FILE")
        windows = min(nblocks // count, windows)
        self.reqs = {
            op: [
                agent.make_prepped_xfer(op, self.local, list(range(count)), self.remote, list(range(w * count, (w + 1) * count)))
                for w in range(windows)
            ]
            for op in ("WRITE", "READ")
        }
        self.next = 0

    def _one(self, h):
        st = self.agent.transfer(h)
        while st != "DONE":
            if st == "ERR":
                raise RuntimeError("NIXL transfer failed")
            st = self.agent.check_xfer_state(h)

    def warm(self, op):
        for h in self.reqs[op]:
            self._one(h)
        self.next = 0

    def run(self, op, n):
        reqs = self.reqs[op]
        t = time.perf_counter()
        for i in range(n):
            self._one(reqs[(self.next + i) % len(reqs)])
        el = time.perf_counter() - t
        self.next = (self.next + n) % len(reqs)
        return el

    def close(self):
        for hs in self.reqs.values():
            for h in hs:
                self.agent.release_xfer_handle(h)
        self.agent.release_dlist_handle(self.local)
        self.agent.release_dlist_handle(self.remote)
        self.agent.deregister_memory(self.dram_reg)
        self.agent.deregister_memory(self.file_reg)
        os.close(self.fd)
        if self.owned:
            os.unlink(self.path)


class RsSide:
    """nixl-rs's storage bench in --serve mode."""

    def __init__(self, cmd):
        import subprocess
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        r = self.p.stdout.readline().strip()
        if not r:
            raise RuntimeError(f"nixl-rs bench died on {line!r}")
        return r

    def run(self, op, n):
        return float(self.ask(f"run {op} {n}"))


class DiskSide:
    """What the disk does alone: one synchronous O_DIRECT pwrite/pread per block (dd's way)."""

    def __init__(self, d, block, count, windows, path):
        self.path = path
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
        os.ftruncate(self.fd, FILE_SIZE)
        self.block, self.count = block, count
        self.buf = mmap.mmap(-1, block)
        self.buf.write(os.urandom(block))
        self.windows = min(FILE_SIZE // (block * count), windows)
        self.next = 0

    def _window(self, op, w):
        base = w * self.block * self.count
        for i in range(self.count):
            off = base + i * self.block
            n = os.pwrite(self.fd, self.buf, off) if op == "WRITE" else os.preadv(self.fd, [self.buf], off)
            if n != self.block:
                raise RuntimeError(f"short {op} {n}")

    def warm(self, op):
        for w in range(self.windows):
            self._window(op, w)
        self.next = 0

    def run(self, op, n):
        t = time.perf_counter()
        for i in range(n):
            self._window(op, (self.next + i) % self.windows)
        el = time.perf_counter() - t
        self.next = (self.next + n) % self.windows
        return el

    def close(self):
        os.close(self.fd)


def fio_gbps(path, op, block, depth):
    """fio on the same file as the other sides (1 GiB, already laid out)."""
    import json
    import subprocess
    r = subprocess.run(
        ["fio", "--name=ref", f"--filename={path}", "--size=1G", "--direct=1", "--ioengine=libaio",
         f"--rw={'write' if op == 'WRITE' else 'read'}", f"--bs={block}", f"--iodepth={depth}",
         "--time_based", "--runtime=1", "--output-format=json"],
        capture_output=True, text=True, check=True)
    j = json.loads(r.stdout)["jobs"][0]
    return j["write" if op == "WRITE" else "read"]["bw_bytes"] / 1e9


def lockstep(args):
    import shlex
    import statistics
    agent = nixl_agent("ref", nixl_agent_config(backends=[]))
    agent.create_backend("POSIX")
    configs = args.rs_args or [""]
    rss = [RsSide([args.lockstep, "--serve", "--dir", args.dir, "--iters", str(args.windows - 1)] + shlex.split(c))
           for c in configs]
    names = ["nixl-rs" + (f" [{c}]" if c else "") for c in configs]
    print(f"lockstep: NIXL 1.5.1 POSIX vs {', '.join(names)}; {args.rounds} rounds x {args.turn} requests per side, files in {args.dir}")
    rows = []
    fmt = lambda v: f"{v:6.2f}" if v is not None else "     -"
    for name, direct, block, count in PATTERNS:
        if args.only not in name:
            continue
        # Every side uses the same file: where a file lies on this VM's disk changes its speed
        # by more than the engines differ, so separate files would compare file placement.
        shared = os.path.join(args.dir, f"lockstep-bench-{os.getpid()}.bin")
        nx = NixlSide(agent, args.dir, name, direct, block, count, args.windows, shared)
        for rs in rss:
            rs.ask(f"setup @{shared} {name}")
        disk = DiskSide(args.dir, block, count, args.windows, shared) if direct else None
        total = block * count
        for op in ("WRITE", "READ"):
            nx.warm(op)
            for rs in rss:
                rs.ask(f"warm {op}")
            if disk:
                disk.warm(op)
            sides = [("nixl", nx.run)] + [(f"rs{i}", rs.run) for i, rs in enumerate(rss)] + ([("disk", disk.run)] if disk else [])
            res = {k: [] for k, _ in sides}
            res["fio"] = []
            for r in range(args.rounds):
                k = r % len(sides)
                for key, fn in sides[k:] + sides[:k]:
                    res[key].append(total * args.turn / fn(op, args.turn) / 1e9)
                if direct and args.fio:
                    res["fio"].append(fio_gbps(shared, op, block, count))
            med = {k: (statistics.median(v) if v else None) for k, v in res.items()}
            print(f"{name:<22} {op:<6} NIXL {fmt(med['nixl'])}  disk sync {fmt(med.get('disk'))}  fio {fmt(med.get('fio'))}", flush=True)
            for i, n in enumerate(names):
                ratios = [a / b for a, b in zip(res[f"rs{i}"], res["nixl"])]
                rows.append((name, op, n, med, med[f"rs{i}"], statistics.median(ratios), min(ratios), max(ratios)))
                print(f"    {n:<40} {fmt(med[f'rs{i}'])}  ratio {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
            for key, v in res.items():
                if v:
                    print(f"      {key:<5} " + " ".join(f"{x:.2f}" for x in v))
        for rs in rss:
            rs.ask("teardown")
        nx.close()
        if disk:
            disk.close()
        os.unlink(shared)
    print()
    print("| pattern | op | NIXL 1.5.1 GB/s | nixl-rs | nixl-rs GB/s | nixl-rs / NIXL (median, range) | disk sync O_DIRECT | fio libaio |")
    print("|---|---|---|---|---|---|---|---|")
    for name, op, n, med, mine, rm, rmin, rmax in rows:
        f = lambda v: f"{v:.2f}" if v is not None else ""
        print(f"| {name} | {op} | {f(med['nixl'])} | {n} | {f(mine)} | {rm:.2f} ({rmin:.2f}-{rmax:.2f}) | {f(med.get('disk'))} | {f(med.get('fio'))} |")


if __name__ == "__main__":
    main()
