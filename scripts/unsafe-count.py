#!/usr/bin/env python3
"""Counts `unsafe` in Rust code (comments and strings left out) per file of the given crates,
and says which lie outside `sys`/`ffi` modules.

    scripts/unsafe-count.py nixl-mem nixl-backend-gds [--outside-sys-only] [--check]

A use is one `unsafe` keyword: a block, `unsafe fn`, `unsafe impl`, `unsafe trait` or
`unsafe extern`. With --check it exits 1 when any use lies outside a `sys`/`ffi` module other
than a memory contract: an `unsafe trait` declaration, or an `unsafe impl` of nixl-core's
`MemoryRegion`, nixl-mem's `HostMemory` or its sys layer's `RawSpan` (which every `HostMemory`
is) beside the type whose invariants it states (these are promises about a type, not unsafe
code), or a documented exception: a file that opens with a comment saying
"Exception to the crate's `deny(unsafe_code)`: <why>" and `#![allow(unsafe_code)]` (listed
as EXC). --check also fails a crate whose lib.rs does not deny `unsafe_code`, so that a new
`unsafe` anywhere else does not compile.
"""
import re
import sys
from pathlib import Path

KINDS = ("block", "fn", "impl", "trait", "extern")
CONTRACTS = ("MemoryRegion", "HostMemory", "RawSpan")


def strip(text):
    # Remove comments and string/char literals, keeping newlines.
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            seg = text[i : (n if j < 0 else j + 2)]
            out.append("\n" * seg.count("\n"))
            i = n if j < 0 else j + 2
        elif c == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            seg = text[i : (n if j < 0 else j + len(end))]
            out.append("\n" * seg.count("\n"))
            i = n if j < 0 else j + len(end)
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append("\n" * text[i : j + 1].count("\n"))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:]):
            i += len(re.match(r"'(\\.|[^\\'])'", text[i:]).group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def classify(code):
    counts = dict.fromkeys(KINDS, 0)
    contracts = 0
    for m in re.finditer(r"\bunsafe\b\s*(\{|fn\b|impl\b|trait\b|extern\b)?", code):
        k = m.group(1)
        kind = {"{": "block", "fn": "fn", "impl": "impl", "trait": "trait", "extern": "extern"}.get(
            (k or "").strip(), "block"
        )
        counts[kind] += 1
        if kind == "impl":
            t = re.match(r"impl\s*(<[^>]*>)?\s*([\w:]+)", code[m.start(1):])
            if t and t.group(2).split("::")[-1] in CONTRACTS:
                contracts += 1
    return counts, contracts


def documented_exception(text):
    head = "\n".join(text.splitlines()[:40])
    return (
        "Exception to the crate's `deny(unsafe_code)`:" in head
        and "#![allow(unsafe_code)]" in head
    )


def in_sys(path):
    return any(p in ("sys", "ffi") or p in ("sys.rs", "ffi.rs") for p in path.parts)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    outside_only = "--outside-sys-only" in sys.argv
    check = "--check" in sys.argv
    bad = 0
    total_in = total_out = 0
    for crate in args:
        root = Path(crate, "src", "lib.rs")
        if check and "#![deny(unsafe_code)]" not in root.read_text():
            print(f"{root}: the crate does not deny unsafe_code", file=sys.stderr)
            bad += 1
        for f in sorted(Path(crate, "src").rglob("*.rs")):
            text = f.read_text()
            c, contracts = classify(strip(text))
            n = sum(c.values())
            if n == 0:
                continue
            inside = in_sys(f.relative_to(Path(crate) / "src"))
            excepted = not inside and documented_exception(text)
            if inside:
                total_in += n
            else:
                total_out += n
                if not excepted:
                    bad += n - c["trait"] - contracts
            if outside_only and inside:
                continue
            detail = " ".join(f"{k}={v}" for k, v in c.items() if v)
            label = "sys " if inside else ("EXC " if excepted else "OUT ")
            print(f"{label} {n:4d}  {f}  ({detail})")
    print(f"total: {total_in} in sys/ffi modules, {total_out} outside")
    if check and bad:
        print(f"{bad} unsafe uses outside sys/ffi modules", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
