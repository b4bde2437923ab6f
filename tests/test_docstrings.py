"""Every example in a public module's docstrings runs (offline, with scripted models)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

MODULES = [
    "stello_graph.session",
    "stello_graph.main_session",
    "stello_graph.memory",
    "stello_graph.graph",
    "stello_graph.agent",
    "stello_graph.middleware",
    "stello_graph.profiles",
    "stello_graph.skills",
    "stello_graph.testing._scripted",
    "stello_graph.export",
    "stello_graph.lineage",
    "stello_graph.digest",
    "stello_graph._topology_slot",
    "stello_graph.checkpoints._shell",
    "stello_graph.checkpoints.sqlite",
    "stello_graph.checkpoints._sqlite_rows",
    "stello_graph.checkpoints._flows",
    "stello_graph.lease",
    "stello_graph.compression",
    "stello_graph.config",
    "stello_graph.events",
    "stello_graph.starmap",
    "stello_graph.server",
    "stello_graph._claims",
    "stello_graph._flow",
    "stello_graph._ids",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    results = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert results.attempted > 0, f"{name} has no example"
    assert results.failed == 0
