"""No import circles among the package's modules.

Every module's `import` statements are read with `ast` (those inside functions too: a function-level
import is a circle deferred, not removed), relative imports resolved, and `from X import name` taken as
an import of the module `X.name` when there is one, else of `X`.  The circles are the strongly
connected components of that graph (Tarjan's depth-first search); each is reported with its modules
and one closed path through them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "broker_filter"


def module_of(path: Path) -> tuple[str, bool]:
    parts = ("broker_filter",) + path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def imports_of(module: str, is_package: bool, source: str, modules: set[str]) -> set[str]:
    """The modules of `modules` that `module` (given as source text) imports, anywhere in it."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                origin = f"{base}.{node.module}" if node.module else base
            else:
                origin = node.module or ""
            # `from X import name`: the submodule X.name if there is one, else X itself
            candidates = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin for a in node.names]
        else:
            continue
        for target in candidates:
            while target and target not in modules:  # `import a.b.c` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle of `graph` (module -> modules it imports) as one closed path through all
    the modules of a strongly connected component: [a, b, ..., a]; sorted, deterministic."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan; the package is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(_closed_path(graph, c) for c in components)


def _closed_path(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A closed walk from the component's first module through each of its modules (shortest hops)."""
    start = min(component)
    path = [start]
    for goal in sorted(component - {start}) + [start]:
        if goal != start and goal in path:
            continue
        path += _shortest(graph, component, path[-1], goal)
    return path


def _shortest(graph: dict[str, set[str]], component: set[str], source: str, goal: str) -> list[str]:
    """The modules after `source` on a shortest import path to `goal` inside `component`."""
    came: dict[str, str] = {}
    frontier = [source]
    while goal not in came:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w not in came:
                    came[w] = v
                    following.append(w)
        frontier = following
    hops = [goal]
    while came[hops[-1]] != source:
        hops.append(came[hops[-1]])
    return hops[::-1]


def package_graph() -> dict[str, set[str]]:
    sources = {module_of(p): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))}
    modules = {m for m, _ in sources}
    return {m: imports_of(m, pkg, text, modules) for (m, pkg), text in sources.items()}


def test_no_import_circles() -> None:
    assert circles(package_graph()) == []


def test_the_graph_sees_every_kind_of_import() -> None:
    modules = {"p", "p.a", "p.b", "p.c", "p.sub", "p.sub.d"}
    source = (
        "import p.a\n"
        "from . import b\n"
        "from .sub.d import thing\n"
        "from p import helper\n"
        "import os\n"
        "def f():\n    from .c import g\n"
    )
    assert imports_of("p.x", False, source, modules) == {"p.a", "p.b", "p.sub.d", "p", "p.c"}
    assert imports_of("p.sub", True, "from . import d\nfrom .. import a\n", modules) == {"p.sub.d", "p.a"}


@pytest.mark.parametrize(
    "graph, expected",
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b", "a"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d", "a"}}, [["a", "b", "c", "a"], ["d", "e", "d"]]),
        ({"m": {"s"}, "s": {"m", "t"}, "t": {"m"}}, [["m", "s", "t", "m"]]),
    ],
)
def test_circles_are_found_and_named(graph, expected) -> None:
    assert circles(graph) == expected
