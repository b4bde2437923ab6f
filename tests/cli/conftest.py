"""Fixtures of the CLI tests: run `stello-graph` in-process, and a database made by the demo."""

from __future__ import annotations

import io
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import pytest
from langchain_core.language_models import BaseChatModel

from stello_graph.cli import demo, main


@dataclass(frozen=True)
class Run:
    """The outcome of one `stello-graph` run."""

    code: int
    out: str
    err: str


def run_cli(
    *argv: str,
    input: str = "",
    env: Mapping[str, str] | None = None,
    model: BaseChatModel | None = None,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
) -> Run:
    """Run the command in this process, with `input` as stdin and an empty environment."""
    out = stdout or io.StringIO()
    err = io.StringIO()
    code = main(
        list(argv),
        stdin=stdin or io.StringIO(input),
        stdout=out,
        stderr=err,
        env={} if env is None else env,
        model=model,
    )
    return Run(code, out.getvalue() if isinstance(out, io.StringIO) else "", err.getvalue())


RunCli = Callable[..., Run]


@pytest.fixture
def cli() -> RunCli:
    return run_cli


@pytest.fixture(scope="session")
def demo_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database made once by the demo (copy it before changing it: `demo_db`)."""
    db = tmp_path_factory.mktemp("demo") / "demo.db"
    demo.run(io.StringIO(), db)
    return db


@pytest.fixture
def demo_db(demo_template: Path, tmp_path: Path) -> Path:
    """A fresh copy of the demo's database."""
    target = tmp_path / "demo.db"
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{demo_template}{suffix}")
        if source.exists():
            shutil.copy(source, f"{target}{suffix}")
    return target
