"""Fixtures of the browser tests: the inspector served on 127.0.0.1 and a real headless
Chromium (Debian's `chromium`, driven by Playwright; no browser is downloaded).

Without `chromium` on the PATH the tests are skipped locally (`make browser` installs it);
in CI (`CI=true`) they fail instead, so CI cannot pass without them.
"""

from __future__ import annotations

import contextlib
import http.server
import io
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import ViewportSize

from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.cli import demo
from stello_graph.cli._serve import listen
from stello_graph.storage import MainStorage

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "inspector"
"""Where the tests save their screenshots."""
REBOUND = "rebound.example"
"""A name the browser resolves to 127.0.0.1, as a DNS-rebinding site's name would."""
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1",
]  # fmt: skip
VIEWPORT: ViewportSize = {"width": 1280, "height": 780}


def chromium_path() -> str:
    """Debian's chromium, or a skip (a failure in CI) saying how to get it."""
    found = shutil.which("chromium")
    if found is None:
        reason = "no `chromium` on PATH: `make browser` installs it (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests must run in CI: {reason}")
        pytest.skip(reason)
    return found


@dataclass
class Server:
    """A running inspector: `url` its root, `page_url` the URL the command prints (with the
    token of a `write=True` app), `seen` each request it answered (method, path, status)."""

    url: str
    storage: MainStorage
    db: Path
    page_url: str = ""
    seen: list[tuple[str, str, int]] = field(default_factory=list)


class _Recorder:
    """An ASGI app that notes each request its `app` answers: (method, path, status)."""

    def __init__(self, app: Any, seen: list[tuple[str, str, int]]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def noting(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.seen.append((scope["method"], scope["path"], message["status"]))
            await send(message)

        await self.app(scope, receive, noting if scope["type"] == "http" else send)


@contextlib.contextmanager
def serve(storage: MainStorage, db: Path, **options: Any) -> Iterator[Server]:
    """Serve the inspector over `storage` in a thread, on a free port; stop it after."""
    import uvicorn

    from stello_graph.inspector import create_app

    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    app = create_app(storage, label=db.name, poll_interval=0.25, port=port, **options)
    url = f"http://127.0.0.1:{port}/"
    token = app.state.inspector.token
    running = Server(url, storage, db, f"{url}?token={token}" if options.get("write") else url)
    recorder = _Recorder(app, running.seen)
    config = uvicorn.Config(recorder, log_level="warning", loop="asyncio", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    try:
        yield running
    finally:
        app.state.inspector.stopping.set()
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


@contextlib.contextmanager
def other_site(html: str) -> Iterator[str]:
    """`html` served at every path of another origin (another port of 127.0.0.1), as a
    site the user visits would serve it; yields its URL."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{site.server_address[1]}/"
    finally:
        site.shutdown()
        site.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("browser") / "stello-demo.db"
    demo.run(io.StringIO(), db)
    return db


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    opened = browser.new_page(viewport=VIEWPORT)
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    opened.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield opened
    opened.close()
    assert errors == [], f"the page logged errors: {errors}"


Shot = Callable[[Any, str], Path]


@pytest.fixture
def shot() -> Shot:
    def save(page: Any, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        page.screenshot(path=str(path))
        return path

    return save


@pytest.fixture
def server(demo_file: Path, tmp_path: Path) -> Iterator[Server]:
    """The inspector, read-only, over a fresh copy of the demo's database."""
    db = tmp_path / "stello-demo.db"
    shutil.copy(demo_file, db)
    with SqliteMainStorage(db) as storage, serve(storage, db) as running:
        yield running


@pytest.fixture
def write_server(demo_file: Path, tmp_path: Path) -> Iterator[Server]:
    """The inspector with `write=True` over a fresh copy of the demo's database."""
    db = tmp_path / "stello-demo.db"
    shutil.copy(demo_file, db)
    with SqliteMainStorage(db) as storage, serve(storage, db, write=True) as running:
        yield running


@pytest.fixture(scope="module")
def large_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2,000-session tree (the benchmark's shape)."""
    from tests.benchmarks.inspector import build_tree_file

    db = tmp_path_factory.mktemp("large") / "large.db"
    build_tree_file(db, 2000)
    return db


@pytest.fixture
def large_server(large_file: Path) -> Iterator[Server]:
    with SqliteMainStorage(large_file) as storage, serve(storage, large_file) as running:
        yield running
