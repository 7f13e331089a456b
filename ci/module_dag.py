#!/usr/bin/env python3
"""The modules under src/session import one another without a cycle.

  python3 ci/module_dag.py        # fails, naming the cycle, if there is one
  python3 ci/module_dag.py -v     # and prints every module's imports

A module depends on another when its code names it: a `use` item, or a path such as
`super::teams::Team` in code. Comments, doc links and string literals do not count, and
neither do `#[cfg(test)]` modules (a test may reach anywhere). Method calls do not show, as in
`cargo modules dependencies`, which agrees with this script on this tree (`--acyclic`); this
script needs no install, so CI runs it in the lint stage.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PREFIX = "crate::session"


def module_of(path):
    """`src/session/teams.rs` -> `crate::session::teams`."""
    rel = path.relative_to(SRC).with_suffix("")
    return "crate::" + "::".join(rel.parts) if rel.parts != ("lib",) else "crate"


def strip(src):
    """The code of `src`: no comments, no string contents, no `#[cfg(test)]` modules."""
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    src = re.sub(r'"(?:\\.|[^"\\])*"', '""', src)
    test_mod = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s*)?mod\s+\w+\s*\{")
    out, at = [], 0
    while match := test_mod.search(src, at):
        out.append(src[at : match.start()])
        depth, at = 1, match.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(src[at], 0)
            at += 1
    out.append(src[at:])
    return "".join(out)


def expand(use):
    """The paths of one `use` tree, braces expanded: `a::{b, c::d}` -> `a::b`, `a::c::d`."""
    brace = use.find("{")
    if brace < 0:
        return [use]
    head, body = use[:brace], use[brace + 1 : use.rfind("}")]
    parts, depth, part = [], 0, ""
    for char in body:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(part)
            part = ""
        else:
            part += char
    parts.append(part)
    return [path for part in parts if part for path in expand(head + part)]


def resolve(module, segments, names):
    """The longest module of `names` that `segments` (a path written in `module`) leads into."""
    if segments[0] == "crate":
        base, segments = "crate", segments[1:]
    elif segments[0] == "self":
        base, segments = module, segments[1:]
    elif segments[0] == "super":
        base = module
        while segments and segments[0] == "super":
            base, segments = base.rsplit("::", 1)[0], segments[1:]
    else:
        base = module  # a child module, or a name already in scope (its `use` counts)
    best = base if base != module else None
    for segment in segments:
        base = f"{base}::{segment}"
        if base not in names:
            break
        best = base
    return best


def graph():
    files = sorted(SRC.rglob("*.rs"))
    names = {module_of(path) for path in files}
    edges = {}
    for path in files:
        module = module_of(path)
        if not module.startswith(PREFIX):
            continue
        code = strip(path.read_text())
        paths = []
        for use in re.findall(r"\buse\s+([^;]+);", code):
            for item in expand(re.sub(r"\s+", "", use)):
                paths.append(item.split(" as ")[0].split("::"))
        # Paths in the rest of the code (`super::teams::Team`, `crate::session::demux::Inbox`).
        body = re.sub(r"\buse\s+[^;]+;", "", code)
        path = r"\b((?:(?:super|crate|self)::)*[a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)::"
        for match in re.finditer(path, body):
            paths.append(match.group(1).split("::") + ["_"])
        deps = set()
        for segments in paths:
            target = resolve(module, [s for s in segments if s], names)
            if target and target != module and target.startswith(PREFIX):
                deps.add(target)
        edges[module] = deps
    return edges


def cycles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for next_node in edges.get(node, ()):
            if next_node not in edges:
                continue
            if next_node not in index:
                visit(next_node)
                low[node] = min(low[node], low[next_node])
            elif next_node in on_stack:
                low[node] = min(low[node], index[next_node])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def main():
    edges = graph()
    short = lambda name: name.replace(PREFIX, "session")
    if "-v" in sys.argv:
        for module in sorted(edges):
            print(short(module), "->", " ".join(sorted(map(short, edges[module]))))
    found = cycles(edges)
    for component in found:
        print("import cycle:", " ".join(map(short, component)), file=sys.stderr)
    if found:
        sys.exit(1)
    print(f"{len(edges)} modules under src/session, no import cycle")


if __name__ == "__main__":
    main()
