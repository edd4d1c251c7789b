#!/usr/bin/env python3
"""Fails when the modules of a Rust crate import each other in a circle.

Usage: check_circles.py SRC_DIR [SRC_DIR ...]   (e.g. crates/core/src)

A module is a .rs file (mod.rs, lib.rs and main.rs stand for their folder).
Module A depends on module B when A's code names a path into B through
`crate::`, `super::` or `self::`, in a `use` line (groups such as
`use super::{a, b::{c, d}}` included) or inline. Test modules
(`#[cfg(test)]` to the end of a file) are left out: tests may reach
anywhere. Prints each circle and exits 1 if there is one; exits 0 otherwise.
"""

import os
import re
import sys

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE = re.compile(r"\buse\s+((?:crate|super|self)::[^;]*);", re.S)
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def modules(root):
    """Module path (a tuple of names) -> file."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(folder, name)
            parts = tuple(os.path.relpath(path, root)[:-3].split(os.sep))
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            out[parts] = path
    return out


def expand(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    start = tree.find("{")
    if start < 0:
        return [tree]
    depth = 0
    for end in range(start, len(tree)):
        depth += {"{": 1, "}": -1}.get(tree[end], 0)
        if depth == 0:
            break
    head, inner, tail = tree[:start], tree[start + 1:end], tree[end + 1:]
    items, depth, item = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(item)
            item = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        item += ch
    items.append(item)
    return [p for it in items if it for p in expand(head + it + tail)]


def dependencies(mods):
    graph = {m: set() for m in mods}
    for m, path in mods.items():
        with open(path, encoding="utf-8") as f:
            src = f.read()
        src = re.split(r"#\[cfg\(test\)\]", src, maxsplit=1)[0]
        src = COMMENT.sub("", src)
        refs = PATH.findall(src)
        for stmt in USE.findall(src):
            for p in expand(stmt):
                refs += PATH.findall(p.replace("::self", ""))
        for head, tail in refs:
            names = tuple(tail.strip(":").split("::"))
            base = () if head == "crate" else m if head == "self" else m[:-1]
            full = base + names
            # The longest prefix that is a module, other than m itself.
            for n in range(len(full), len(base), -1):
                if full[:n] in mods:
                    if full[:n] != m:
                        graph[m].add(full[:n])
                    break
    return graph


def circles(graph):
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = counter[0]
                counter[0] += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(graph[w]))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return found


def main(roots):
    if not roots:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    bad = 0
    for root in roots:
        mods = modules(root)
        if not mods:
            print(f"{root}: no .rs files", file=sys.stderr)
            return 2
        for comp in circles(dependencies(mods)):
            bad += 1
            names = " <-> ".join("::".join(m) or "(crate root)" for m in comp)
            print(f"{root}: import circle: {names}")
    if bad:
        print("cut each circle: move what both sides need into a module that imports neither")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
