"""Figure 8: import and start-up, as whole processes (`python -c ...`), median of `repeats`.

The floor is the interpreter alone; the baseline imports what the plain LangGraph agent
needs. Provider SDKs must stay unimported until a provider model is used. 8d-8f run the
command line (`python -m stello_graph.cli`) on a 300-session file; 8g is a whole process that
opens an agent on an empty file and runs one turn, against one that compiles a plain
`StateGraph(MessagesState)` on `SqliteSaver` and runs one step (the same scripted model on
both sides), interleaved.
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
_FIRST_TURN = """
import sys
from stello_graph import StelloAgent
from stello_graph.testing import ScriptedChatModel
agent = StelloAgent(model=ScriptedChatModel(default="ok"), storage=sys.argv[1])
agent.turn(agent.main_session_id, "hello")
agent.close()
"""
_PLAIN_FIRST_TURN = """
import sqlite3, sys
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from stello_graph.testing import ScriptedChatModel
model = ScriptedChatModel(default="ok")
graph = StateGraph(MessagesState)
graph.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
graph.add_edge(START, "model")
conn = sqlite3.connect(sys.argv[1], check_same_thread=False)
conn.execute("PRAGMA journal_mode = WAL")
conn.execute("PRAGMA synchronous = NORMAL")
app = graph.compile(checkpointer=SqliteSaver(conn))
app.invoke({"messages": [("user", "hello")]}, {"configurable": {"thread_id": "t"}})
conn.close()
"""
_SDKS = f"""
import json, sys, stello_graph
print(json.dumps([m for m in {PROVIDER_SDKS!r} if m in sys.modules]))
"""


def _process(code: str, *args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], check=True, cwd=ROOT)
    return time.perf_counter() - start


def _command(*args: str) -> float:
    """Seconds of one `stello-graph ARGS` process (its output discarded)."""
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "stello_graph.cli", *args]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _cli_figures(scale: Scale, tmp: Path) -> list[Figure]:
    """8d-8g."""
    from tests.benchmarks._big_tree import build_big_tree

    db = tmp / "tree-300.db"
    build_big_tree(db, 300, 50)
    runs: dict[str, list[float]] = {k: [] for k in ("version", "tree", "export", "turn", "plain")}
    for n in range(scale.processes):
        runs["version"].append(_command("--version"))
        runs["tree"].append(_command("tree", "--db", str(db)))
        runs["export"].append(_command("export", "--db", str(db)))
        first, second = (_FIRST_TURN, "turn"), (_PLAIN_FIRST_TURN, "plain")
        for code, key in (first, second) if n % 2 == 0 else (second, first):
            runs[key].append(_process(code, str(tmp / f"{key}-{n}.db")))
    ms = {key: median(values) * 1000 for key, values in runs.items()}
    return [
        Figure(key="8d", name="`stello-graph --version` (process)", unit="ms", target=300,
               value=ms["version"]),
        Figure(key="8e", name="`stello-graph tree`, 300 sessions (process)", unit="ms",
               target=300, value=ms["tree"]),
        Figure(key="8f", name="`stello-graph export`, 300 sessions (process)", unit="ms",
               target=300, value=ms["export"]),
        Figure(key="8g", name="cold first turn vs plain LangGraph (process)", unit="x",
               target=1.0, value=ms["turn"] / ms["plain"], stello=ms["turn"],
               baseline=ms["plain"]),
    ]  # fmt: skip


def startup_figures(scale: Scale) -> list[Figure]:
    """Figures 8a-8g."""
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
    with tempfile.TemporaryDirectory(prefix="stello-bench-") as tmp:
        cli = _cli_figures(scale, Path(tmp))
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
        *cli,
    ]  # fmt: skip
