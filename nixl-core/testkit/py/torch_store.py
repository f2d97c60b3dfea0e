"""PyTorch's c10d TCPStore, hosted or joined, driven over stdin/stdout for nixl-rs tests.

    torch_store.py serve            hosts a store on 127.0.0.1 (a port picked by the kernel)
    torch_store.py join HOST PORT   a torch client of a store someone else hosts

The first answer is '@@ {"port": N, "torch": VERSION}'. Then one JSON command per line on
stdin, one answer per command on stdout on a line starting with '@@ ' (byte strings as hex):
set {key, hex}; get {key} -> {hex | null} (a CHECK first: torch's own get waits for the key);
check {keys}; delete {key}; add {key, n}; num_keys; exit. Keys are as torch users write them.
"""
import json
import os
import sys
from datetime import timedelta

import torch.distributed as dist


def main():
    if sys.argv[1] == "serve":
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=10))
    else:
        store = dist.TCPStore(sys.argv[2], int(sys.argv[3]), is_master=False,
                              timeout=timedelta(seconds=10))
    import torch
    say({"ok": True, "port": store.port, "torch": torch.__version__})
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            say({"ok": True, **handle(store, json.loads(line))})
        except Exception as e:  # the test reads the error and fails with it
            say({"ok": False, "error": f"{type(e).__name__}: {e}"})
    os._exit(0)


def say(obj):
    sys.stdout.write("@@ " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def handle(store, c):
    op = c["op"]
    if op == "set":
        store.set(c["key"], bytes.fromhex(c["hex"]))
        return {}
    if op == "get":
        if not store.check([c["key"]]):
            return {"hex": None}
        return {"hex": store.get(c["key"]).hex()}
    if op == "check":
        return {"ready": store.check(c["keys"])}
    if op == "delete":
        return {"deleted": store.delete_key(c["key"])}
    if op == "add":
        return {"value": store.add(c["key"], c["n"])}
    if op == "num_keys":
        return {"n": store.num_keys()}
    if op == "exit":
        sys.stdout.flush()
        os._exit(0)
    raise ValueError(f"unknown op {op}")


if __name__ == "__main__":
    main()
