#!/usr/bin/env python3
"""Fails when the top-level modules of a workspace crate import each other in a cycle.

For each crate under crates/, every production `.rs` file is read (the `#[cfg(test)]`
module at its end, `tests.rs` and `*_tests.rs` files are cut, and so are comments); a
`crate::<module>` path, or a `super::<module>` path in a file directly under src/, is an
edge from the file's top-level module to <module>. An item of the crate root itself (`crate::Item`, or `super::Item` from a file directly
under src/) is an edge to the module `lib`. The strongly connected components of
that graph with more than one module are printed, and the exit code is 1 if there is
any. The crates themselves can not form a cycle: Cargo refuses one.

Usage: .ci/check-module-cycles.py [repo root]
"""
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
TEST_MOD = re.compile(r"^#\[cfg\(test\)\]\s*\n\s*mod \w+\s*\{", re.M)
LINE_COMMENT = re.compile(r"//.*")
PATH = re.compile(r"\bcrate::([A-Za-z_][A-Za-z0-9_]*)")
SUPER = re.compile(r"\bsuper::([A-Za-z_][A-Za-z0-9_]*)")
# the crate root's own items (beyond module declarations) count as the module `lib`
ROOT_MOD = "lib"


def production_text(path):
    text = open(path, encoding="utf-8").read()
    m = TEST_MOD.search(text)
    if m:
        text = text[: m.start()]
    return LINE_COMMENT.sub("", text)


def graph(src):
    mods = set()
    for name in os.listdir(src):
        if name in ("lib.rs", "main.rs"):
            continue
        if name.endswith(".rs"):
            mods.add(name[:-3])
        elif os.path.isdir(os.path.join(src, name)):
            mods.add(name)
    mods.add(ROOT_MOD)
    edges = {m: set() for m in mods}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs") or f == "tests.rs" or f.endswith("_tests.rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src).split(os.sep)
            top = rel[0][:-3] if len(rel) == 1 else rel[0]
            if top == "main":
                continue
            text = production_text(path)
            targets = set(PATH.findall(text))
            if len(rel) == 1 and top != ROOT_MOD:
                targets |= set(SUPER.findall(text))
            if top == ROOT_MOD:  # the root names its modules without `crate::`
                targets |= {t for t in re.findall(r"\b([a-z_][a-z0-9_]*)::", text) if t in mods}
            for t in targets:
                if t in ("self", "super", "crate"):
                    continue
                t = t if t in mods else ROOT_MOD
                if t != top:
                    edges[top].add(t)
    return edges


def cycles(edges):
    """Tarjan's strongly connected components; those of two or more modules."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
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
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    crates = os.path.join(ROOT, "crates")
    bad = 0
    for crate in sorted(os.listdir(crates)):
        src = os.path.join(crates, crate, "src")
        if not os.path.isdir(src):
            continue
        edges = graph(src)
        for comp in cycles(edges):
            bad += 1
            print(f"crates/{crate}: modules in an import cycle: {', '.join(comp)}")
            for m in comp:
                print(f"  {m} -> {', '.join(sorted(edges[m] & set(comp)))}")
    if bad:
        print("break each cycle by moving the shared item down (ARCHITECTURE.md, Invariants)")
        return 1
    print(f"module cycles: none in {len(os.listdir(crates))} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
