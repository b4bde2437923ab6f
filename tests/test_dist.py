"""The distributions `make dist` publishes: what the sdist and the wheel hold, and the wheel
installed alone in a new environment, used from outside the clone as a reader would use it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._docs import ROOT, examples, same_output
from tests._postgres import POSTGRES

STATIC_FILES = sorted(p.name for p in (ROOT / "stello_graph/inspector/static").iterdir())
"""The inspector's page: shipped as it is (no build step)."""


@dataclass(frozen=True)
class Dists:
    sdist: Path
    wheel: Path
    log: str
    """What the build printed."""


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """The sdist, and the wheel built from it, as `make dist` builds them (here with this
    environment's setuptools instead of an isolated one, and so without a download)."""
    out = tmp_path_factory.mktemp("dist")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (sdist,) = out.glob("stello_graph-*.tar.gz")
    (wheel,) = out.glob("stello_graph-*.whl")
    return Dists(sdist, wheel, done.stdout + done.stderr)


@pytest.mark.slow
def test_the_build_warns_of_nothing(dists: Dists) -> None:
    """setuptools' deprecations (a license as a table, ...) fail `make dist`: none here."""
    assert [line for line in dists.log.splitlines() if "warn" in line.lower()] == []


@pytest.mark.slow
def test_the_sdist_holds_the_package_and_its_license_not_the_tests(dists: Dists) -> None:
    with tarfile.open(dists.sdist) as sdist:
        members = sdist.getmembers()
    top = members[0].name.split("/")[0]
    files = {m.name.removeprefix(f"{top}/") for m in members if m.isfile()}
    assert not [m.name for m in members if m.issym() or m.islnk()]  # links became folders
    assert {"LICENSE", "README.md", "pyproject.toml", "PKG-INFO"} <= files
    assert not [name for name in files if name.startswith("tests/")]
    for required in (
        "stello_graph/py.typed",
        "stello_graph/nodes/__init__.py",
        "stello_graph/checkpoints/sqlite.py",
        *(f"stello_graph/inspector/static/{name}" for name in STATIC_FILES),
    ):
        assert required in files, required


@pytest.mark.slow
def test_the_wheel_holds_only_stello_graph_and_its_license(dists: Dists) -> None:
    archive = zipfile.ZipFile(dists.wheel)
    names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"stello_graph"}
    for required in (
        "stello_graph/py.typed",
        "stello_graph/nodes/__init__.py",
        "stello_graph/checkpoints/__init__.py",
        "stello_graph/checkpoints/sqlite.py",
        "stello_graph/inspector/app.py",
        *(f"stello_graph/inspector/static/{name}" for name in STATIC_FILES),
    ):
        assert required in names, required
    (info,) = {t for t in tops if t.endswith(".dist-info")}
    metadata = archive.read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert archive.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()


def _new_environment(where: Path, wheel: Path) -> Path:
    """A virtual environment holding the wheel and its runtime dependencies only (from the
    package index, through uv and its cache where this environment has uv)."""
    without_pip = ["--without-pip"] if _uv().exists() else []
    subprocess.run([sys.executable, "-m", "venv", *without_pip, str(where)], check=True)
    _install(where, str(wheel))
    return where / "bin"


def _uv() -> Path:
    return Path(sys.executable).with_name("uv")


def _install(where: Path, *requirements: str) -> None:
    """Install `requirements` into the environment at `where`."""
    python = str(where / "bin/python")
    if _uv().exists():
        install = [str(_uv()), "pip", "install", "--quiet", "--python", python]
    else:
        install = [python, "-m", "pip", "install", "--quiet"]
    subprocess.run([*install, *requirements], check=True, capture_output=True)


@pytest.mark.slow
def test_the_wheel_alone_runs_the_readme_example_and_the_command(
    dists: Dists, tmp_path: Path
) -> None:
    """What a user gets from `pip install stello-graph`: the first README example and the
    `stello-graph` command, run in a directory outside the clone; then, with the `postgres`
    extra installed too, `demo`, `tree` and `export` on a PostgreSQL database."""
    bin_ = _new_environment(tmp_path / "env", dists.wheel)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)

    found = run(str(bin_ / "python"), "-c", "import stello_graph; print(stello_graph.__file__)")
    assert Path(found.stdout.strip()).is_relative_to(tmp_path / "env"), found.stderr
    first = examples(ROOT / "README.md")[0]
    assert first.output is not None
    (work / "example.py").write_text(first.code, encoding="utf-8")
    done = run(str(bin_ / "python"), "example.py")
    assert done.returncode == 0, done.stderr
    assert same_output(done.stdout, first.output), done.stdout

    _demo_tree_export(run, bin_)  # `demo` on its default file

    extra = run(str(bin_ / "python"), "-c", "import stello_graph.inspector")
    assert 'pip install "stello-graph[inspector]"' in extra.stderr
    if POSTGRES.wanted:  # the same commands on PostgreSQL, with the extra they need
        _install(tmp_path / "env", f"{dists.wheel}[postgres]")
        _demo_tree_export(run, bin_, "--db", POSTGRES.dsn_for(tmp_path), "--tree", "wheel")
    shutil.rmtree(tmp_path / "env")  # a few hundred MB: not kept until pytest's cleanup


def _demo_tree_export(
    run: Callable[..., subprocess.CompletedProcess[str]], bin_: Path, *options: str
) -> None:
    """`demo` fills the tree `options` name (default: the file `stello-demo.db`); `tree` and
    `export` print it."""
    command = str(bin_ / "stello-graph")
    demo = run(command, "demo", *options)
    options = options or ("--db", "stello-demo.db")
    assert demo.returncode == 0, demo.stderr
    assert "I opened three branches: Pricing, Onboarding, Growth" in demo.stdout
    tree = run(command, "tree", *options)
    assert tree.returncode == 0, tree.stderr
    assert [line.split()[-2] for line in tree.stdout.splitlines()[1:4]] == [
        "Pricing",
        "Onboarding",
        "Growth",
    ]
    export = run(command, "export", *options)
    assert export.returncode == 0, export.stderr
    labels = [s["label"] for s in json.loads(export.stdout)["sessions"]]
    assert labels[1:] == ["Pricing", "Onboarding", "Growth"]
