"""NIXL's side of the paged-block GPU comparison (issue 24): the layout and timing of
nixl-mem's `paged_bench` example, through NIXL's Python API (nixl-cu13 1.5.1, UCX backend,
cuda_ipc between two processes of one host).

The initiator's pool is on --gpu, the target's on --target-gpu; each request moves --blocks
blocks, one block apart on both sides and the remote slots shuffled (NIXL cannot merge them),
WRITE and READ, for each --block-bytes size: GB/s per cell (median of --reps rounds of --iters
posts of one prepared handle, completion busy-polled), every byte verified after each cell
(a READ of the remote slots back, compared on the GPU).

    python3 nixl_paged_gpu.py --gpu 1 --target-gpu 0 [--blocks 2048]
        [--block-bytes 4096,16384,65536,1048576] [--iters 20] [--reps 5] [--json out.jsonl]

Both processes end with os._exit (NIXL's bundled libraries may crash in exit handlers).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def perm(i, n):
    if n & (n - 1) == 0:
        return (i * 2654435761 + 7) & (n - 1)
    return (i + n // 3) % n


def agent_named(name):
    from nixl_cu13._api import nixl_agent, nixl_agent_config
    return nixl_agent(name, nixl_agent_config(enable_prog_thread=True, backends=["UCX"]))


def target(a):
    import torch
    ag = agent_named("nixl-paged-target")
    pool = torch.zeros(a.pool, dtype=torch.uint8, device=f"cuda:{a.target_gpu}")
    ag.register_memory(ag.get_reg_descs([(pool.data_ptr(), pool.numel(), a.target_gpu, "")], "VRAM"))
    md = ag.get_agent_metadata()
    with open(a.md + ".tmp", "wb") as f:
        f.write(md)
    os.rename(a.md + ".tmp", a.md)
    with open(a.md + ".addr", "w") as f:
        f.write(str(pool.data_ptr()))
    end = time.time() + 900
    while time.time() < end and not os.path.exists(a.md + ".done"):
        time.sleep(0.05)
    sys.stdout.flush()
    os._exit(0)


def wait(ag, h):
    while True:
        st = ag.check_xfer_state(h)
        if st == "DONE":
            return
        if st == "ERR":
            raise RuntimeError("transfer failed")


def initiator(a):
    import torch
    d = tempfile.mkdtemp(prefix="nixl-paged-")
    md = os.path.join(d, "target.md")
    child = subprocess.Popen([sys.executable, __file__, "--role", "target", "--md", md,
                              "--target-gpu", str(a.target_gpu), "--pool", str(a.pool)])
    end = time.time() + 120
    while not os.path.exists(md + ".addr") or not os.path.exists(md):
        if time.time() > end or child.poll() is not None:
            raise RuntimeError("the target did not start")
        time.sleep(0.05)
    time.sleep(0.1)
    ag = agent_named("nixl-paged-initiator")
    src = torch.empty(a.pool, dtype=torch.uint8, device=f"cuda:{a.gpu}")
    back = torch.zeros(a.pool, dtype=torch.uint8, device=f"cuda:{a.gpu}")
    for t in (src, back):
        ag.register_memory(ag.get_reg_descs([(t.data_ptr(), t.numel(), a.gpu, "")], "VRAM"))
    with open(md, "rb") as f:
        peer = ag.add_remote_agent(f.read())
    peer = peer.decode() if isinstance(peer, bytes) else peer
    with open(md + ".addr") as f:
        rbase = int(f.read())
    out = open(a.json, "a") if a.json else None
    n = a.blocks
    print(f"nixl_paged_gpu: NIXL initiator GPU {a.gpu} <-> target GPU {a.target_gpu}, "
          f"{n} blocks per request, one block apart, shuffled", flush=True)
    for k, blk in enumerate(a.sizes):
        g = torch.Generator(device=f"cuda:{a.gpu}").manual_seed(k + 1)
        src.copy_(torch.randint(0, 256, (a.pool,), dtype=torch.uint8, device=f"cuda:{a.gpu}", generator=g))
        back.zero_()
        torch.cuda.synchronize(a.gpu)
        for kind, local in (("WRITE", src), ("READ", back)):
            ld = ag.get_xfer_descs([(local.data_ptr() + 2 * i * blk, blk, a.gpu) for i in range(n)], "VRAM")
            rd = ag.get_xfer_descs([(rbase + 2 * perm(i, n) * blk, blk, a.target_gpu) for i in range(n)], "VRAM")
            h = ag.initialize_xfer(kind, ld, rd, peer)
            for _ in range(2):
                ag.transfer(h)
                wait(ag, h)
            rates = []
            for _ in range(a.reps):
                t = time.perf_counter()
                for _ in range(a.iters):
                    ag.transfer(h)
                    wait(ag, h)
                s = time.perf_counter() - t
                rates.append(a.iters * n * blk / s / 1e9)
            rates.sort()
            gbs = rates[len(rates) // 2]
            ag.release_xfer_handle(h)
            note = ""
            if kind == "READ":
                idx = torch.arange(n, device=f"cuda:{a.gpu}") * 2 * blk
                ok = all(torch.equal(back[o:o + blk], src[o:o + blk]) for o in idx.tolist())
                if not ok:
                    raise RuntimeError(f"{blk} B blocks: the bytes read back differ")
                note = ", every byte verified"
            print(f"{kind:5} {blk:>8} B x {n}: {gbs:8.2f} GB/s (rounds {rates[0]:.2f}..{rates[-1]:.2f}){note}", flush=True)
            if out:
                out.write(json.dumps({"impl": "nixl-1.5.1", "op": kind, "gpu": a.gpu,
                                      "target_gpu": a.target_gpu, "block_bytes": blk,
                                      "blocks": n, "gbs": round(gbs, 3)}) + "\n")
                out.flush()
    open(md + ".done", "w").close()
    child.wait(timeout=60)
    sys.stdout.flush()
    os._exit(0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--role", default="initiator")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--target-gpu", type=int, default=1)
    p.add_argument("--blocks", type=int, default=2048)
    p.add_argument("--block-bytes", default="4096,16384,65536,1048576")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--md", default="")
    p.add_argument("--pool", type=int, default=0)
    p.add_argument("--json", default="")
    a = p.parse_args()
    a.sizes = [int(x) for x in a.block_bytes.split(",")]
    if not a.pool:
        a.pool = 2 * a.blocks * max(a.sizes)
    if a.role == "target":
        target(a)
    else:
        initiator(a)


if __name__ == "__main__":
    main()
