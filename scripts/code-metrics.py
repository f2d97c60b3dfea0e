#!/usr/bin/env python3
"""Layout metrics of the workspace (issue 25's before/after table), measured from the code:

- every import circle per crate (modules of a crate that import each other through
  `use crate::...` / `crate::x::` paths: strongly connected components, as files), and which
  of them leave a folder (their files are not all in one directory): with `--check`, the
  script exits 1 when one does (a `.ci/run` gate). Inline facade modules of `pub use` lines
  and `#[deprecated]` aliases draw no edge: they name items for users, depending on nothing;
- nixl-core's root items (`pub use` names and `pub` items in lib.rs) and public modules;
- `Agent`'s public methods and the files they are in;
- library files over 800 lines; library functions over 80 lines;
- hand-written argument parsers (bench and example programs matching on "--flag" strings);
- test-helper modules (tests/**/mod.rs);
- public options, config, params and layout structs (names ending in Options, Config, Params,
  Limits, Layout, Plan or Shape, or `Capabilities`) with public fields that are not
  `#[non_exhaustive]`: with `--check`, the script exits 1 on one (a field added to such a
  struct must not break its users' code; they build it with its setters).

    python3 scripts/code-metrics.py [ROOT] [--check]
"""
import re
import sys
from pathlib import Path

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
CHECK = "--check" in sys.argv
ROOT = Path(ARGS[0] if ARGS else ".").resolve()
CRATES = ["nixl-core", "nixl-mem", "nixl-backend-ucx", "nixl-backend-libfabric", "nixl-backend-gds", "compat/nixl-sys"]
# Crates whose public shapes are another project's API, kept as that project has them (the
# nixl-sys drop-in: its AgentConfig is built with struct literals by nixl-sys's users).
FOREIGN_API = ["compat/nixl-sys"]


def lib_files(crate):
    return sorted((ROOT / crate / "src").rglob("*.rs"))


def module_of(crate, path):
    rel = path.relative_to(ROOT / crate / "src").with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return "::".join(parts)


def module_aliases(crate, mods):
    """Module names the crate root re-imports from its folders (`use model::{desc, mem};`,
    `pub use exchange::etcd;`), and modules re-exported elsewhere (`pub use crate::a::b;` in
    module m makes `m::b` name `a::b`): alias -> the module's real path."""
    aliases = {}
    lib = ROOT / crate / "src" / "lib.rs"
    text = lib.read_text(errors="replace")
    for mm in re.finditer(r"^\s*(?:pub )?use ([a-z_][a-z0-9_]*)::(\{[^}]*\}|[a-z_][a-z0-9_]*);", text, re.M):
        folder, names = mm.group(1), mm.group(2).strip("{}")
        for n in (x.strip() for x in names.split(",")):
            if n and f"{folder}::{n}" in mods:
                aliases[n] = f"{folder}::{n}"
    for mm in re.finditer(r"^\s*(?:pub )?use ([a-z_][a-z0-9_]*)::([a-z_][a-z0-9_]*) as ([a-z_][a-z0-9_]*);", text, re.M):
        if f"{mm.group(1)}::{mm.group(2)}" in mods:
            aliases[mm.group(3)] = f"{mm.group(1)}::{mm.group(2)}"
    for m, f in mods.items():
        for mm in re.finditer(r"^\s*pub use crate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*);", f.read_text(errors="replace"), re.M):
            target = mm.group(1)
            if target in mods:
                aliases[(m + "::" if m else "") + target.split("::")[-1]] = target
    return aliases


def resolve(path, aliases):
    """`path` (segments after `crate::`) with a leading alias replaced by the real module."""
    for k in range(len(path), 0, -1):
        head = "::".join(path[:k])
        if head in aliases:
            return aliases[head].split("::") + path[k:]
    return path


def strip_facades(text):
    """Drops what only gives users a path and makes a module depend on nothing: inline facade
    modules made of `pub use` lines alone (`pub mod inproc { pub use crate::inproc::{..}; }`)
    and `#[deprecated]` aliases of moved names."""
    text = re.sub(r"pub mod [a-z_][a-z0-9_]* \{(\s*pub use [^;]*;)+\s*\}", "", text)
    text = re.sub(r"#\[deprecated\([^)]*\)\]\s*pub (type|use) [^;]*;", "", text)
    return text


def import_graph(crate):
    files = lib_files(crate)
    mods = {module_of(crate, f): f for f in files}
    aliases = module_aliases(crate, mods)
    edges = {m: set() for m in mods}
    for m, f in mods.items():
        # Code, not comments: a doc link is not an import.
        text = "\n".join(l for l in f.read_text(errors="replace").split("\n") if not l.lstrip().startswith("//"))
        text = strip_facades(text)
        for mm in re.finditer(r"crate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", text):
            path = resolve(mm.group(1).split("::"), aliases)
            for k in range(len(path), 0, -1):
                target = "::".join(path[:k])
                if target in mods and target != m:
                    edges[m].add(target)
                    break
        # `use super::x` from a file module: resolve to the sibling.
        base = m.split("::")[:-1] if m else []
        if f.name == "mod.rs":
            base = m.split("::")[:-1]
        for mm in re.finditer(r"super::([a-z_][a-z0-9_]*)", text):
            target = "::".join(base + [mm.group(1)]) if base else mm.group(1)
            if target in mods and target != m:
                edges[m].add(target)
    return edges


def sccs(edges):
    """Every strongly connected component of more than one module."""
    return [sorted(c) for c in _components(edges) if len(c) > 1]


def folder_of(crate, module):
    """The directory (relative to src) of the file holding `module`."""
    f = import_files(crate)[module]
    return str(f.parent.relative_to(ROOT / crate / "src"))


_FILES = {}


def import_files(crate):
    if crate not in _FILES:
        _FILES[crate] = {module_of(crate, f): f for f in lib_files(crate)}
    return _FILES[crate]


def _components(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    for v in edges:
        if v not in index:
            strong(v)
    return out


def largest_scc(edges):
    best = max(_components(edges), key=len, default=[])
    return len(best) if len(best) > 1 else 0, sorted(best)


def long_functions(files, limit=80):
    n = []
    for f in files:
        lines = f.read_text(errors="replace").split("\n")
        i = 0
        in_test = False
        while i < len(lines):
            line = lines[i]
            if re.match(r"\s*#\[cfg\(test\)\]", line):
                in_test = True
            m = re.match(r"(\s*)(pub(\([^)]*\))? )?(const )?(async )?(unsafe )?(extern \"C\" )?fn [A-Za-z_]", line)
            if m and not in_test:
                depth, start, j, opened = 0, i, i, False
                while j < len(lines):
                    depth += lines[j].count("{") - lines[j].count("}")
                    if "{" in lines[j]:
                        opened = True
                    if opened and depth <= 0:
                        break
                    if not opened and lines[j].rstrip().endswith(";"):
                        break
                    j += 1
                if opened and j - start + 1 > limit:
                    n.append((f.relative_to(ROOT), start + 1, j - start + 1))
                i = j + 1
                continue
            i += 1
    return n


def main():
    print("== largest import circle per crate (modules)")
    for c in CRATES:
        size, comp = largest_scc(import_graph(c))
        print(f"  {c}: {size}" + (f" ({', '.join(comp)})" if size else ""))
    print("== every import circle (modules; the folders their files are in)")
    leaving = []
    for c in CRATES:
        for comp in sccs(import_graph(c)):
            folders = sorted({folder_of(c, m) for m in comp})
            crosses = len(folders) > 1
            where = ", ".join(f or "src/" for f in folders)
            print(f"  {c}: {len(comp)} ({', '.join(comp)}) in {where}" + ("  <- LEAVES A FOLDER" if crosses else ""))
            if crosses:
                leaving.append(f"{c}: {', '.join(comp)}")
    print(f"== import circles that leave a folder: {len(leaving)}")
    main.leaving = leaving
    lib = (ROOT / "nixl-core/src/lib.rs").read_text()
    pub_mods = re.findall(r"^pub mod (\w+)", lib, re.M)
    uses = re.findall(r"^pub use [^;]*;", lib, re.M | re.S)
    names = set()
    for u in uses:
        body = u[len("pub use "):-1]
        if "{" in body:
            inner = body[body.index("{") + 1: body.rindex("}")]
            names |= {x.strip().split(" as ")[-1] for x in inner.split(",") if x.strip()}
        else:
            names.add(body.split("::")[-1].split(" as ")[-1])
    items = re.findall(r"^pub (?:fn|struct|enum|const|static|type|trait) (\w+)", lib, re.M)
    # Modules re-exported from a folder (`pub use exchange::etcd;`) are public modules, not items.
    core_mods = {module_of("nixl-core", f).split("::")[-1] for f in lib_files("nixl-core") if f.name == "mod.rs"}
    reexported = sorted(n for n in names if n in core_mods)
    pub_mods = sorted(set(pub_mods) | set(reexported))
    names -= set(reexported)
    # `pub use moved::*`: the names that moved off the root, kept one release as #[deprecated]
    # aliases; not part of the root's API, counted apart.
    deprecated = len(re.findall(r"#\[deprecated", lib))
    names -= {"*"}
    print(f"== nixl-core root: {len(names) + len(items)} items (+{deprecated} #[deprecated] aliases), {len(pub_mods)} public modules ({', '.join(pub_mods)})")
    methods, old, files = 0, 0, set()
    for f in lib_files("nixl-core"):
        text = f.read_text(errors="replace")
        for block in re.finditer(r"^impl Agent \{(.*?)^\}", text, re.M | re.S):
            k = len(re.findall(r"^    pub fn ", block.group(1), re.M))
            dep = len(re.findall(r"^    #\[deprecated[^\n]*\n(?:^    (?:#|///)[^\n]*\n)*^    pub fn ", block.group(1), re.M))
            if k:
                methods += k - dep
                old += dep
                files.add(f.relative_to(ROOT))
    print(f"== Agent: {methods} public methods (+{old} #[deprecated] aliases) in {len(files)} files")
    big = []
    for c in CRATES + ["."]:
        src = ROOT / c / "src"
        for f in sorted(src.rglob("*.rs")):
            if "bindings" in f.name:
                continue
            n = len(f.read_text(errors="replace").split("\n"))
            if n > 800:
                big.append((f.relative_to(ROOT), n))
    print(f"== library files over 800 lines: {len(big)}")
    for f, n in big:
        print(f"  {f}: {n}")
    allf = [f for c in CRATES for f in lib_files(c) if "bindings" not in f.name] + sorted((ROOT / "src").rglob("*.rs"))
    longs = long_functions(allf)
    print(f"== library functions over 80 lines: {len(longs)}")
    for f, line, n in longs:
        print(f"  {f}:{line}: {n}")
    # A program (a bench, bin or example and the folder of modules beside it) that reads
    # std::env::args or matches "--flag" strings without clap parses its arguments by hand.
    parsers, with_clap = [], []
    for d in ["benches", "examples"] + [f"{c}/{k}" for c in CRATES for k in ("examples", "benches")]:
        root = ROOT / d
        if not root.exists():
            continue
        programs = [f for f in sorted(root.glob("*.rs"))] + [f for f in sorted(root.glob("*/main.rs"))]
        for f in programs:
            folder = f.parent / f.stem if f.name != "main.rs" else f.parent
            texts = [f.read_text(errors="replace")] + [m.read_text(errors="replace") for m in
                                                      (sorted(folder.rglob("*.rs")) if folder.is_dir() and f.name != "main.rs" else
                                                       [x for x in sorted(folder.rglob("*.rs")) if x != f] if f.name == "main.rs" else [])]
            t = "\n".join(texts)
            reads = "std::env::args" in t or re.search(r'"--[a-z][a-z-]*"\s*=>', t)
            if "clap::" in t:
                with_clap.append(f.relative_to(ROOT))
            elif reads:
                parsers.append(f.relative_to(ROOT))
    print(f"== argument parsers: clap in {len(with_clap)} programs; hand-written: {len(parsers)}")
    for p in parsers:
        print(f"  {p}")
    helpers = sorted(p.relative_to(ROOT) for p in ROOT.glob("**/tests/**/mod.rs") if "target" not in p.parts)
    kit = ROOT / "nixl-core/testkit/src/lib.rs"
    print(f"== test-helper modules: {len(helpers) + kit.exists()} (the test kit nixl-core/testkit"
          f"{' and' if helpers else ''}{' ' + str(len(helpers)) + ' tests/**/mod.rs' if helpers else ''})")
    for h in helpers:
        print(f"  {h}")
    exhaustive = exhaustive_structs()
    print(f"== public options/config/params/layout structs with public fields, not #[non_exhaustive]: {len(exhaustive)}")
    for e in exhaustive:
        print(f"  {e}")
    main.exhaustive = exhaustive


SEMVER_NAMES = re.compile(r"(Options|Config|Params|Limits|Layout|Plan|Shape|Capabilities)$")


def exhaustive_structs():
    """`pub struct` items named as options, config, params or layouts, with a `pub` field,
    whose attributes do not include `#[non_exhaustive]`."""
    found = []
    for c in CRATES:
        if c in FOREIGN_API:
            continue
        for f in lib_files(c):
            if "bindings" in f.name:
                continue
            text = f.read_text(errors="replace")
            for m in re.finditer(r"((?:^[ \t]*#\[[^\n]*\n|^[ \t]*///[^\n]*\n)*)^pub struct (\w+)(?:<[^>{]*>)? \{(.*?)^\}", text, re.M | re.S):
                attrs, name, body = m.group(1), m.group(2), m.group(3)
                if not SEMVER_NAMES.search(name):
                    continue
                if not re.search(r"^\s*pub \w+:", body, re.M):
                    continue
                if "#[non_exhaustive]" not in attrs:
                    line = text.count("\n", 0, m.start(2)) + 1
                    found.append(f"{f.relative_to(ROOT)}:{line}: {name}")
    return found


if __name__ == "__main__":
    main()
    if CHECK and main.leaving:
        print("import circles leave their folder:", *main.leaving, sep="\n  ", file=sys.stderr)
        sys.exit(1)
    if CHECK and main.exhaustive:
        print("options/config/params/layout structs without #[non_exhaustive]:", *main.exhaustive, sep="\n  ", file=sys.stderr)
        sys.exit(1)
