"""Every example of the README and of the documentation site runs, and prints what it shows.

The conventions are in `tests/_docs.py`. Examples marked for PostgreSQL or LangGraph Server
run in those suites; the rest run here, offline, with scripted models.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._docs import NEEDS, PAGES, ROOT, Example, all_examples, examples, same_output

EXAMPLES = all_examples()
OFFLINE = [example for example in EXAMPLES if example.needs is None]
README = ROOT / "README.md"


def _run(example: Example) -> None:
    namespace: dict[str, object] = {"__name__": "__docs__"}
    try:
        exec(example.compile(), namespace)
    finally:  # an example may leave its agent or storage open; close the file here
        for value in list(namespace.values()):
            close = getattr(value, "close", None)
            if type(value).__name__ in {"StelloAgent", "SqliteMainStorage"} and callable(close):
                close()


@pytest.mark.parametrize("example", OFFLINE, ids=[example.name for example in OFFLINE])
def test_examples_run(
    example: Example,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    _run(example)
    printed = capsys.readouterr().out
    assert printed.strip(), "an example prints what it shows"
    if example.output is not None:
        assert same_output(printed, example.output), f"printed:\n{printed}"
    _run(example)  # a reader runs it again, on the files the first run left
    assert capsys.readouterr().out.strip()


def test_every_mark_names_a_suite() -> None:
    assert {example.needs for example in EXAMPLES} <= {None, *NEEDS}


def test_the_readme_opens_with_a_short_example_and_its_output() -> None:
    """The first screen: a LangGraph graph with stello in it, short, with what it prints."""
    first = examples(README)[0]
    assert len([line for line in first.code.splitlines() if line.strip()]) <= 20
    assert "from langgraph" in first.code and first.needs is None
    assert first.output is not None
    head = README.read_text(encoding="utf-8").splitlines()[: first.line]
    assert any(line.startswith("![") for line in head), "a picture before the example"
    assert not any("L2" in line or "L3" in line for line in head), "no jargon before it"


def test_the_readme_stays_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    """Links to files of the repository point at files that exist (`mkdocs build --strict`
    checks the site's own links too, but not the README's)."""
    text = page.read_text(encoding="utf-8")
    targets = [t for t in _LINK.findall(text) if "://" not in t and not t.startswith("mailto:")]
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert not missing


@pytest.mark.slow
def test_examples_pass_mypy_strict_outside_the_clone(tmp_path: Path) -> None:
    """What a user's type checker sees after `make install` (an editable install in compat
    mode: a path entry, not an import hook): run from a directory outside the clone, mypy
    finds `stello_graph` and its `py.typed`, and every example passes `--strict`."""
    files = []
    for index, example in enumerate(EXAMPLES):
        path = tmp_path / f"example_{index}.py"
        path.write_text(f"# {example.name}\n{example.code}", encoding="utf-8")
        files.append(path.name)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), *files],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    hint = "\n(`Cannot find implementation` means an import-hook editable install: `make install`)"
    assert done.returncode == 0, done.stdout + done.stderr + hint
