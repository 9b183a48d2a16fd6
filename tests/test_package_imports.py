"""The top-level packages of headroom import each other without cycles (issue 18: gateway<->server,
models<->lifecycle, autoscaler<->router, and the longer loops through llm, dashboard and sim).

The graph is built from the source with `ast` (every `import headroom.x...` / `from headroom.x... import`,
including function-local and TYPE_CHECKING imports: a cycle there is still a cycle in the design)."""

from __future__ import annotations

import ast
from collections.abc import Mapping, Set
from pathlib import Path

import headroom

ROOT = Path(headroom.__file__).parent


def package_graph(root: Path) -> dict[str, set[str]]:
    """package -> the other top-level packages its modules import."""
    packages = {p.name for p in root.iterdir() if p.is_dir() and any(p.glob("*.py"))}  # sim has no __init__
    graph: dict[str, set[str]] = {p: set() for p in packages}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if len(parts) < 2 or parts[0] not in packages:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            for name in names:
                bits = name.split(".")
                if len(bits) > 1 and bits[0] == "headroom" and bits[1] in packages and bits[1] != parts[0]:
                    graph[parts[0]].add(bits[1])
    return graph


def cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_top_level_packages_import_each_other_without_cycles() -> None:
    graph = package_graph(ROOT)
    assert {"server", "gateway", "llm", "models", "lifecycle", "router", "autoscaler", "sim"} <= graph.keys()
    assert "core" in graph["server"]  # the graph sees imports at all
    assert cycles(graph) == []
