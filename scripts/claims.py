#!/usr/bin/env python3
"""Every measured number in README.md, docs/performance.md and docs/perf/*.md, with the log
that shows it (issue 39).

    scripts/claims.py [--list] [--check]

A number is a measured figure: a speed or a time (`1.8-2.1 TB/s`, `0.42 ms`), or a ratio or
share (`2.6x`, `95%`); sizes (`64 KiB` blocks) are the experiment's settings, not claims. Its
evidence is a log cited in the same paragraph or table, or in the first paragraph of its
section: a path under `docs/perf/data/` (`data/...` from docs/perf), a file or a folder (every
file in it). A speed or time counts as shown when a cited log holds a number that rounds to
it (at the doc's precision; thousands separators ignored; each end of a range); a ratio or
share counts as derived from the cited logs (it divides two of their numbers).

Per file it prints: numbers, shown (derived ratios included), cited but not found in the cited
logs, uncited. `--list`
names each unshown number with its line. `--check` fails when a file has more unshown numbers
than scripts/claims-baseline.txt allows (the baseline only shrinks: a new number without its
log fails CI; lower the file's count when you cite logs for old ones).
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "docs" / "performance.md"] + sorted(
    (ROOT / "docs" / "perf").glob("*.md")
)
BASELINE = ROOT / "scripts" / "claims-baseline.txt"
UNITS = r"(TB/s|GB/s|MB/s|Gb/s|ns|us|µs|ms|s|x|%)"
RATIOS = ("x", "%")
NUM = r"\d[\d,]*(?:\.\d+)?"
# (Not "2x H200": a count of machines.)
CLAIM = re.compile(
    rf"(?<![\w.])({NUM})(?:\s*(?:-|–|to)\s*({NUM}))?\s*{UNITS}(?![\w/])(?!\s*(?:H\d|A\d|GPU|NVIDIA))"
)
CITE = re.compile(r"(?:docs/perf/)?data/[\w.+-]+(?:/[\w.+-]+)*/?")
LOGNUM = re.compile(r"\d[\d,]*(?:\.\d+)?")


def blocks(lines):
    """(first line number, text, section head text) for each paragraph or table."""
    out, cur, start, head, head_lines = [], [], 0, "", []
    in_code = False
    for i, line in enumerate(lines + [""], 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        if line.startswith("#"):
            if cur:
                out.append((start, cur, head))
            cur, head_lines = [], []
            head = ""
            continue
        if line.strip() == "":
            if cur:
                out.append((start, cur, head))
                if not head:
                    # The first paragraph of a section: its citations cover the section.
                    head = "\n".join(t for _, t in cur)
            cur = []
            continue
        if not cur:
            start = i
        cur.append((i, line))
    return out


def cited(text, doc):
    files = []
    for m in CITE.finditer(text):
        rel = m.group(0)
        p = (ROOT / "docs" / "perf" / rel) if not rel.startswith("docs/") else ROOT / rel
        if p.is_dir():
            files += [f for f in sorted(p.rglob("*")) if f.is_file()]
        elif p.is_file():
            files.append(p)
    return files


def numbers_of(files, cache={}):
    nums = set()
    for f in files:
        if f not in cache:
            try:
                t = f.read_text(errors="replace")
            except OSError:
                t = ""
            vals = set()
            for m in LOGNUM.finditer(t):
                try:
                    vals.add(float(m.group(0).replace(",", "")))
                except ValueError:
                    pass
            cache[f] = vals
        nums |= cache[f]
    return nums


def shown(value, logs):
    digits = len(value.split(".")[1]) if "." in value else 0
    v = float(value.replace(",", ""))
    return any(abs(round(x, digits) - v) < 1e-9 for x in logs)


def main():
    listing = "--list" in sys.argv
    check = "--check" in sys.argv
    allowed = {}
    if BASELINE.exists():
        for line in BASELINE.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, n = line.rsplit(None, 1)
                allowed[name] = int(n)
    bad = 0
    print("file | numbers | shown | cited, not found | uncited")
    for doc in DOCS:
        rel = str(doc.relative_to(ROOT))
        lines = doc.read_text().splitlines()
        total = ok = missing = uncited = 0
        unshown = []
        for start, block, head in blocks(lines):
            text = "\n".join(t for _, t in block)
            logs_files = cited(text, doc) or cited(head, doc)
            logs = numbers_of(logs_files)
            for lineno, line in block:
                for m in CLAIM.finditer(line):
                    for value in filter(None, (m.group(1), m.group(2))):
                        total += 1
                        if not logs_files:
                            uncited += 1
                            unshown.append((lineno, f"{value} {m.group(3)}", "uncited"))
                        elif m.group(3) in RATIOS or shown(value, logs):
                            ok += 1
                        else:
                            missing += 1
                            unshown.append((lineno, f"{value} {m.group(3)}", "not in the cited logs"))
        print(f"{rel} | {total} | {ok} | {missing} | {uncited}")
        if listing:
            for lineno, what, why in unshown:
                print(f"  {rel}:{lineno}: {what}: {why}")
        limit = allowed.get(rel, 0)
        if len(unshown) > limit:
            print(
                f"  {rel}: {len(unshown)} numbers without their log, the baseline allows {limit}"
                " (cite the log in the paragraph; --list names them)",
                file=sys.stderr,
            )
            bad += 1
    if check and bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
