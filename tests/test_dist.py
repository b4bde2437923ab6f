"""The distributions `make dist` publishes: what the sdist and the wheel hold."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
