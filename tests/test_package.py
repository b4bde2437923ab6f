"""Public-surface checks: the import boundary, `__all__`, the extras' messages (the
distributions themselves: `tests/test_dist.py`)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import stello_graph

ROOT = Path(__file__).resolve().parents[1]
CORE_MODULES = [
    "stello_graph",
    "stello_graph.errors",
    "stello_graph.models",
    "stello_graph.storage",
    "stello_graph.session",
    "stello_graph.main_session",
    "stello_graph.memory",
    "stello_graph.compression",
    "stello_graph.profiles",
    "stello_graph.skills",
    "stello_graph.testing",
    "stello_graph.checkpoints",
    "stello_graph.checkpoints.backend",
]


_IMPORT_EACH = """
import importlib, json, sys
found = {}
for name in sys.argv[1:]:
    importlib.import_module(name)
    found[name] = sorted(m for m in sys.modules if m.split(".")[0] == "langgraph")
print(json.dumps(found))
"""


def test_core_does_not_load_langgraph() -> None:
    """One fresh interpreter imports the core modules one after the other; LangGraph, once
    loaded, stays in `sys.modules`, so the first module listing it is the one that loads it."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, *CORE_MODULES],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    found: dict[str, list[str]] = json.loads(done.stdout)
    assert list(found) == CORE_MODULES
    assert {name: loaded for name, loaded in found.items() if loaded} == {}


def test_the_boundary_check_sees_langgraph() -> None:
    """The same check flags a module that does load LangGraph (it is not vacuous)."""
    code = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, "stello_graph.errors", "stello_graph.graph"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    found = json.loads(code.stdout)
    assert found["stello_graph.errors"] == []
    assert "langgraph" in found["stello_graph.graph"]


def test_the_inspector_without_its_extra_says_how_to_install_it() -> None:
    """`import stello_graph.inspector` with no Starlette: a message naming the extra (what
    `stello-graph inspect` says too), not a bare `ModuleNotFoundError: starlette`."""
    code = "import sys; sys.modules['starlette'] = None; import stello_graph.inspector"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "ModuleNotFoundError: stello_graph.inspector needs its extra: "
        'pip install "stello-graph[inspector]" (starlette is missing).'
    )


def test_all_matches_exports() -> None:
    exported = set(stello_graph.__all__)
    assert len(exported) == len(stello_graph.__all__), "duplicates in __all__"
    for name in exported:
        assert getattr(stello_graph, name) is not None, name
    public = {
        name
        for name in dir(stello_graph)
        if not name.startswith("_")
        and not isinstance(getattr(stello_graph, name), types.ModuleType)
    }
    assert public - {"annotations", "importlib", "TYPE_CHECKING", "Any"} == exported - {
        "__version__"
    }


def test_type_checkers_see_every_exported_name() -> None:
    """The `TYPE_CHECKING` imports (what mypy and IDEs read) name the lazy table's names."""
    import ast

    tree = ast.parse(Path(stello_graph.__file__).read_text(encoding="utf-8"))
    guarded = next(n for n in tree.body if isinstance(n, ast.If))
    seen: set[str] = set()
    for node in guarded.body:
        assert isinstance(node, ast.ImportFrom)
        for alias in node.names:
            seen.add(alias.asname or alias.name)
    assert seen == set(stello_graph._LAZY)


def test_unknown_attribute() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = stello_graph.no_such_name


def test_subpackages_are_symlinks() -> None:
    for name in ("nodes", "checkpoints"):
        link = ROOT / "stello_graph" / name
        assert link.is_symlink()
        assert link.readlink() == Path("..") / name
