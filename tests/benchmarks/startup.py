"""Figure 8: import and start-up, as whole processes (`python -c ...`), median of `repeats`.

The floor is the interpreter alone; the baseline imports what the plain LangGraph agent
needs. Provider SDKs must stay unimported until a provider model is used.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.benchmarks._harness import Figure, Scale, median

__all__ = ["PROVIDER_SDKS", "startup_figures"]

ROOT = Path(__file__).resolve().parents[2]
PROVIDER_SDKS = ("openai", "anthropic", "langchain_openai", "langchain_anthropic", "tiktoken")

_OPEN = """
import sys
from stello_graph import StelloAgent
from stello_graph.testing import ScriptedChatModel
StelloAgent(model=ScriptedChatModel(default="ok"), storage=sys.argv[1]).close()
"""
_BASELINE = """
import langgraph.checkpoint.sqlite, langgraph.graph, langgraph.prebuilt
"""
_SDKS = f"""
import json, sys, stello_graph
print(json.dumps([m for m in {PROVIDER_SDKS!r} if m in sys.modules]))
"""


def _process(code: str, *args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], check=True, cwd=ROOT)
    return time.perf_counter() - start


def startup_figures(scale: Scale) -> list[Figure]:
    """Figures 8a-8c."""
    floor: list[float] = []
    imports: list[float] = []
    baseline: list[float] = []
    opens: list[float] = []
    with tempfile.TemporaryDirectory(prefix="stello-bench-") as tmp:
        for n in range(scale.processes):  # interleaved, so drift hits all four alike
            floor.append(_process("pass"))
            imports.append(_process("import stello_graph"))
            baseline.append(_process(_BASELINE))
            opens.append(_process(_OPEN, str(Path(tmp) / f"empty-{n}.db")))
    done = subprocess.run(
        [sys.executable, "-c", _SDKS], check=True, cwd=ROOT, capture_output=True, text=True
    )
    loaded: list[str] = json.loads(done.stdout)
    sdks = Figure(
        key="8c",
        name="provider SDKs imported by `import stello_graph`",
        unit="modules",
        value=len(loaded),
        target=0,
        detail={"loaded": loaded},
    )
    if not scale.processes:
        return [sdks]
    ms, python = 1000, median(floor) * 1000
    return [
        Figure(key="8a", name="`import stello_graph` (process)", unit="ms",
               value=median(imports) * ms, stello=median(imports) * ms,
               baseline=median(baseline) * ms,
               detail={"python_alone_ms": python, "baseline": "import langgraph graph, "
                       "prebuilt and checkpoint.sqlite"}),
        Figure(key="8b", name="open an agent on an empty SQLite file (process)", unit="ms",
               value=median(opens) * ms, detail={"python_alone_ms": python}),
        sdks,
    ]  # fmt: skip
