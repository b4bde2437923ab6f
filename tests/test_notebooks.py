"""Every notebook in `notebooks/` runs, offline, top to bottom, in a fresh kernel.

Each one is copied into an empty directory and executed there by nbclient, in a `python3`
kernel running this interpreter (so it sees this checkout of stello-graph, whatever kernels the
machine has installed). A failure names the notebook, the cell's source and the error. A
notebook must also show a star map, print no warnings, and leave its directory as it found it.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
CELL_TIMEOUT = 60  # seconds; every cell runs offline against scripted models
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def kernel_specs(tmp_path_factory: pytest.TempPathFactory) -> KernelSpecManager:
    """Kernel specs holding one `python3` kernel: this interpreter, with ipykernel."""
    kernels = tmp_path_factory.mktemp("kernels")
    spec = kernels / "python3"
    spec.mkdir()
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "Python 3", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel), encoding="utf-8")
    return KernelSpecManager(kernel_dirs=[str(kernels)], ensure_native_kernel=False)


def _read(path: Path) -> Any:
    return nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]


def _outputs(nb: Any) -> Iterator[tuple[Any, Any]]:
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            yield cell, output


def _failure(name: str, nb: Any, exc: Exception) -> str:
    """The failing cell's source and its error, without terminal colours."""
    for cell, output in _outputs(nb):
        if output.output_type == "error":
            trace = _ANSI.sub("", "\n".join(output.traceback))
            return f"{name}: this cell failed:\n{cell.source}\n\n{trace}"
    return f"{name}: {type(exc).__name__}: {_ANSI.sub('', str(exc))}"


def test_notebooks_are_numbered_in_order() -> None:
    assert NOTEBOOKS, "no notebooks found"
    assert [p.name[:3] for p in NOTEBOOKS] == [f"{i:02d}_" for i in range(1, len(NOTEBOOKS) + 1)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_clean(path: Path) -> None:
    nb = _read(path)
    nbformat.validate(nb)
    assert nb.nbformat == 4
    assert nb.metadata.kernelspec.name == "python3"
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code, "a notebook without code"
    for cell in code:
        assert cell.outputs == [] and cell.execution_count is None, (
            f"{path.name} is stored with outputs: clear them before committing"
        )
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")


@pytest.mark.slow  # a kernel start and the imports: a few seconds each
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path: Path, tmp_path: Path, kernel_specs: KernelSpecManager) -> None:
    shutil.copy(path, tmp_path / path.name)
    nb = _read(tmp_path / path.name)
    manager = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=kernel_specs)
    client = NotebookClient(
        nb,
        km=manager,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        shutdown_kernel="immediate",  # the notebook is done: no need to wait for a clean exit
        resources={"metadata": {"path": str(tmp_path)}},
    )
    failure = None
    try:
        client.execute(cleanup_kc=True)  # shut the kernel down: the manager is ours
    except (CellExecutionError, CellTimeoutError) as exc:
        failure = _failure(path.name, nb, exc)
    if failure is not None:  # outside the handler: no chained, coloured traceback
        pytest.fail(failure, pytrace=False)
    outputs = [output for _, output in _outputs(nb)]
    assert any("image/svg+xml" in output.get("data", {}) for output in outputs), (
        f"{path.name} shows no star map"
    )
    warnings = [o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"]
    assert warnings == [], f"{path.name} wrote to stderr: {warnings}"
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != path.name)
    assert left == [], f"{path.name} left files behind: {left}"
