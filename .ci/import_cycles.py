"""Fail on an import cycle between modules of raygpu/ (CI lint; docs/architecture.md "Layers").

Every import counts: top level, inside a function (a lazy import is still a dependency) and under
``TYPE_CHECKING`` (a type is part of a module's contract). A package's ``__init__`` is a module like any
other. Prints each cycle as one strongly connected component (Tarjan, iterative) and exits 1 if there is one.
"""

from __future__ import annotations

import os
import sys

import grimp


def cycles(graph: "grimp.ImportGraph", package: str) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself)."""
    mods = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    edges = {m: sorted(n for n in graph.find_modules_directly_imported_by(m) if n in mods or n == package)
             for m in mods}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in mods:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1 or node in edges[node]:
                    found.append(sorted(comp))
    return found


def main(argv: list[str] | None = None) -> int:
    package = (argv or sys.argv[1:] or ["raygpu"])[0]
    # The package is read from the working directory, as lint-imports reads it: `python .ci/import_cycles.py`
    # puts .ci/ first on the path, so an editable install elsewhere (another checkout) would be read instead.
    sys.path.insert(0, os.getcwd())
    graph = grimp.build_graph(package, include_external_packages=False)
    found = cycles(graph, package)
    for comp in found:
        print(f"import cycle among {len(comp)} modules: {', '.join(comp)}")
        for m in comp:
            for n in sorted(graph.find_modules_directly_imported_by(m)):
                if n in comp:
                    print(f"  {m} -> {n}")
    if not found:
        print(f"no import cycle between modules of {package}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
