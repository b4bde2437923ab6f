"""No import cycles among the modules of `stello_graph` (its `nodes` and `checkpoints` too).

The graph is built from the `import` statements of every module's source (at any depth,
type-checking-only ones left out, since they never run): a module imports another when it
names it, or imports a name from it. `from package import submodule` imports the submodule.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import stello_graph

ROOT = Path(stello_graph.__file__).parent


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder, _, files in os.walk(ROOT, followlinks=True):  # nodes/, checkpoints/: symlinks
        for file in files:
            if file.endswith(".py"):
                path = Path(folder) / file
                parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                found[".".join(parts)] = path
    return found


def _imports(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [node]
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
        return []
    return [found for child in ast.iter_child_nodes(node) for found in _imports(child)]


def _targets(statement: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    if isinstance(statement, ast.Import):
        return {alias.name for alias in statement.names}
    assert statement.level == 0, "the package imports absolutely"
    base = statement.module or ""
    subs = {f"{base}.{alias.name}" for alias in statement.names} & set(modules)
    names_from_base = any(f"{base}.{alias.name}" not in modules for alias in statement.names)
    return subs | ({base} if names_from_base else set())


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for statement in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            targets |= _targets(statement, modules)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_covers_every_layer() -> None:
    graph = import_graph()
    for name in (
        "stello_graph.agent",
        "stello_graph.nodes.turn",
        "stello_graph.checkpoints.sqlite",
    ):
        assert name in graph
    assert "stello_graph.nodes.deps" in graph["stello_graph.agent"]  # through the symlink
    assert "stello_graph.checkpoints._schema" in graph["stello_graph.checkpoints.sqlite"]


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []
