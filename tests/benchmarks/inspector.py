"""Figure 9: the inspector on a large tree (`scale.sessions`, 10,000 at full scale).

9a `GET /api/tree` (one object per node) served by uvicorn on 127.0.0.1, median of several
(the server encodes the tree when it starts and again when its poll sees a change), 9b the
first render of the page in headless Chromium (from navigation to the page's `data-ready`,
median of three loads), 9c what building the page's (compact) answer from the file costs
(what a change costs the server)."""

from __future__ import annotations

import random
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from langchain_core.messages import AIMessage, HumanMessage

from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.cli._serve import listen
from stello_graph.inspector._views import tree_view
from stello_graph.inspector.app import create_app
from stello_graph.models import SessionMeta, TopologyNode
from tests.benchmarks._harness import QUICK, Figure, Scale, median

__all__ = ["build_tree_file", "inspector_figures"]

_WORDS = [
    "pricing",
    "onboarding",
    "growth",
    "churn",
    "referral",
    "tiers",
    "search",
    "billing",
    "docs",
    "support",
]


def build_tree_file(path: Path, sessions: int, *, seed: int = 7) -> None:
    """A tree of `sessions` sessions: a dozen branches under the main session, then each new
    session under a random earlier one (deeper ones favoured), two records each, a third of
    them consolidated, one in fifty archived."""
    rng = random.Random(seed)
    with SqliteMainStorage(path) as storage, storage.transaction():
        storage.put_session(SessionMeta(id="main", label="Main Session", role="main"))
        storage.put_node(TopologyNode(id="main"))
        ids = ["main"]
        for n in range(1, sessions):
            parent = "main" if n <= 12 else ids[rng.randrange(len(ids) // 4, len(ids))]
            label = f"{rng.choice(_WORDS).title()} {rng.choice(_WORDS)} #{n}"
            status = "archived" if n % 50 == 0 else "active"
            storage.put_session(SessionMeta(id=f"s{n}", label=label, status=status))
            storage.put_node(TopologyNode(id=f"s{n}", parent_id=parent, label=label))
            storage.append_records(
                f"s{n}", [HumanMessage(f"About {label}?"), AIMessage("Noted.")], user_turn=True
            )
            if n % 3 == 0:
                storage.put_memory(f"s{n}", f"L2 of {label}", through=2)
            ids.append(f"s{n}")


@contextmanager
def _served(db: Path) -> Iterator[str]:
    import uvicorn

    storage = SqliteMainStorage(db)
    app = create_app(storage, label=str(db))
    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", loop="asyncio"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    inspector = app.state.inspector
    try:
        for _ in range(1200):  # up: serving, its first poll done, the tree encoded
            if server.started and len(inspector._tree) == 2:
                break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        inspector.stopping.set()
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        storage.close()


def _get_tree(url: str, repeats: int) -> tuple[list[float], int]:
    times, size = [], 0
    with httpx.Client(timeout=30) as client:
        client.get(url + "api/tree")  # the connection, kept alive
        for _ in range(repeats):
            start = time.perf_counter()
            response = client.get(url + "api/tree")
            times.append(time.perf_counter() - start)
            size = len(response.content)
            assert response.status_code == 200
    return times, size


def _first_render(url: str, loads: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    from tests.browser.conftest import CHROMIUM_ARGS, VIEWPORT

    times = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS
        )
        try:
            for _ in range(loads):
                page = browser.new_page(viewport=VIEWPORT)
                start = time.perf_counter()
                page.goto(url)
                page.wait_for_selector("body[data-ready='1']", timeout=60_000)
                times.append(time.perf_counter() - start)
                page.close()
        finally:
            browser.close()
    return times


def inspector_figures(scale: Scale) -> list[Figure]:
    """Figures 9a-9c."""
    sessions, ms = scale.sessions, 1000
    with tempfile.TemporaryDirectory(prefix="stello-bench-") as tmp:
        db = Path(tmp) / "tree.db"
        build_tree_file(db, sessions)
        with SqliteMainStorage(db) as storage:
            builds = [_timed_build(storage) for _ in range(max(1, scale.repeats // 3))]
        with _served(db) as url:
            gets, size = _get_tree(url, max(5, scale.repeats * 2))
            compact = len(httpx.get(url + "api/tree?compact=1", timeout=30).content)
            render = _render_figure(scale, url, sessions)
    return [
        Figure(key="9a", name=f"inspector: GET /api/tree, {sessions:,} sessions", unit="ms",
               value=median(gets) * ms, target=50,
               detail={"bytes": size, "runs": len(gets), "compact_bytes": compact}),
        render,
        Figure(key="9c", name=f"inspector: build the tree answer, {sessions:,} sessions",
               unit="ms", value=median(builds) * ms,
               detail={"what": "list_session_stats + failures + rows + JSON, from the file"}),
    ]  # fmt: skip


def _timed_build(storage: SqliteMainStorage) -> float:
    import json

    start = time.perf_counter()
    json.dumps(tree_view(storage, compact=True), separators=(",", ":"))
    return time.perf_counter() - start


def _render_figure(scale: Scale, url: str, sessions: int) -> Figure:
    name = f"inspector: first render in Chromium, {sessions:,} sessions"
    figure = Figure(key="9b", name=name, unit="ms", value=None, target=1000)
    if scale is QUICK:
        figure.skipped = "quick scale"
    elif shutil.which("chromium") is None:
        figure.skipped = "no chromium (make browser)"
    else:
        loads = _first_render(url, 3)
        figure.value = median(loads) * 1000
        figure.detail = {"loads_ms": [round(t * 1000) for t in loads]}
    return figure
