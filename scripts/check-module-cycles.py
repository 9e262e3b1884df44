#!/usr/bin/env python3
"""Fails when modules of one crate import each other in a cycle.

For every crate under crates/, each source file is a module (`a.rs` and
`a/mod.rs` are `a`, `a/b.rs` is `a::b`). A `use crate::x::y…;` or
`use super::…;` declaration in a file is an import from its module of the
deepest module the path names. A reference between two modules that are not ancestor and
descendant is an edge between the two siblings under their common parent
(a child using its parent's re-exports is not). Any cycle among siblings is
reported. Stdlib only; run from anywhere.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b(crate|super)::\{([^}]*)\}")


def module_of(src: pathlib.Path, file: pathlib.Path) -> tuple:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


USE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]*);", re.M | re.S)


def references(text: str, module: tuple, is_mod_rs: bool) -> list:
    """Absolute module paths the `use` declarations of `text` name."""
    text = re.sub(r"//[^\n]*", "", text)
    text = "\n".join(m.group(1) for m in USE.finditer(text))
    found = []
    for m in GROUP.finditer(text):
        for item in m.group(2).split(","):
            item = item.strip().split(" as ")[0].strip()
            if item:
                found.append((m.group(1), "::" + item))
    for m in PATH.finditer(text):
        found.append((m.group(1), m.group(2)))
    out = []
    for root, rest in found:
        segs = [s for s in rest.split("::") if s]
        if root == "crate":
            base = []
        else:
            # `super` in a.rs or a/mod.rs is the parent of `a`.
            base = list(module[:-1])
            while segs and segs[0] == "super":
                base = base[:-1]
                segs = segs[1:]
        out.append(tuple(base + segs))
    return out


def check_crate(src: pathlib.Path) -> list:
    files = sorted(src.rglob("*.rs"))
    modules = {module_of(src, f): f for f in files}
    edges = {}
    for module, file in modules.items():
        text = file.read_text(encoding="utf-8")
        for path in references(text, module, file.name == "mod.rs"):
            target = max(
                (m for m in modules if path[: len(m)] == m), key=len, default=()
            )
            k = 0
            while k < min(len(module), len(target)) and module[k] == target[k]:
                k += 1
            if k == len(module) or k == len(target):
                continue  # the same module, an ancestor or a descendant
            parent = module[:k]
            edges.setdefault(parent, {}).setdefault(module[k], set()).add(target[k])
    cycles = []
    for parent, graph in edges.items():
        state = {}

        def visit(node, stack):
            state[node] = 1
            stack.append(node)
            for nxt in sorted(graph.get(node, ())):
                if state.get(nxt) == 1:
                    cycles.append("::".join(parent) + ": " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
                elif nxt not in state:
                    visit(nxt, stack)
            stack.pop()
            state[node] = 2

        for node in sorted(graph):
            if node not in state:
                visit(node, [])
    return cycles


def main() -> int:
    bad = []
    crates = sorted(p for p in (ROOT / "crates").iterdir() if (p / "src").is_dir())
    for crate in crates:
        for cycle in check_crate(crate / "src"):
            bad.append(f"{crate.name}: {cycle}")
    if bad:
        print("module import cycles:", *bad, sep="\n  ")
        return 1
    print(f"check-module-cycles: {len(crates)} crates, no module import cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
