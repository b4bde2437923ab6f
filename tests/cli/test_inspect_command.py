"""`stello-graph inspect`: a real server on 127.0.0.1 (a subprocess), and its bad input."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stello_graph.agent import StelloAgent
from stello_graph.cli import _offline
from tests.cli.conftest import RunCli

ROOT = Path(__file__).resolve().parents[2]


class Served:
    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process = process
        self.url = url


@contextlib.contextmanager
def _inspect(demo_db: Path, *options: str) -> Iterator[Served]:
    """`stello-graph inspect` on the demo database, on a free port; stopped by the test."""
    process = subprocess.Popen(
        [sys.executable, "-m", "stello_graph.cli", "inspect", "--db", str(demo_db),
         "--port", "0", "--no-browser", *options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    assert process.stdout is not None
    lines = [process.stdout.readline() for _ in range(2)]
    url = next((line.strip() for line in lines if line.startswith("http://")), "")
    try:
        assert url.startswith("http://127.0.0.1:"), lines
        yield Served(process, url)
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


@pytest.fixture
def served(demo_db: Path) -> Iterator[Served]:
    with _inspect(demo_db) as running:
        assert running.url.endswith("/")  # read-only: no token to give
        yield running


def _stop(served: Served) -> tuple[int, str]:
    served.process.send_signal(signal.SIGTERM)
    out, _ = served.process.communicate(timeout=15)
    return served.process.returncode, out


def test_serves_the_page_and_the_api_then_stops_on_sigterm(served: Served) -> None:
    page = httpx.get(served.url, timeout=10)
    assert page.status_code == 200 and "stello-graph inspector" in page.text
    tree = httpx.get(served.url + "api/tree", timeout=10).json()
    assert tree["count"] == 4
    assert httpx.post(served.url + "api/integrate", json={}, timeout=10).status_code == 403
    code, out = _stop(served)
    assert code == 0 and "stopped." in out


def test_events_of_another_process_stream_live_and_sigterm_ends_the_stream(
    served: Served, demo_db: Path
) -> None:
    seen: list[dict[str, object]] = []
    ended = threading.Event()

    def follow() -> None:
        with httpx.stream("GET", served.url + "api/events", timeout=30) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:]))
        ended.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    httpx.get(served.url + "api/tree", timeout=10)
    with StelloAgent(
        model=_offline.echo_model(), storage=demo_db, consolidate_fn=_offline.summarise
    ) as other:  # another writer of the same file
        branch = other.fork(other.main_session_id, "Live branch").id
        other.turn(branch, "hello")
    pause = threading.Event()
    for _ in range(100):  # the server polls the file twice a second
        if any(e["type"] == "session_added" and e["session_id"] == branch for e in seen):
            break
        pause.wait(0.1)
    assert any(e["type"] == "session_added" and e["label"] == "Live branch" for e in seen), seen
    code, _ = _stop(served)
    assert code == 0
    assert ended.wait(10), "the event stream did not end when the server stopped"


def test_a_port_in_use_is_a_clear_error(cli: RunCli, demo_db: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        run = cli("inspect", "--db", str(demo_db), "--port", str(port), "--no-browser")
    assert run.code == 2
    assert f"port {port} on 127.0.0.1 is in use" in run.err and "--port 0" in run.err


def test_a_file_that_is_not_stellos_is_refused(cli: RunCli, tmp_path: Path) -> None:
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    run = cli("inspect", "--db", str(other), "--no-browser")
    assert run.code == 2 and "is not a SQLite database" in run.err
    missing = cli("inspect", "--db", str(tmp_path / "none.db"), "--no-browser")
    assert missing.code == 2 and "no such file" in missing.err
    assert not (tmp_path / "none.db").exists()


def test_an_unknown_tree_and_a_bad_port(cli: RunCli, demo_db: Path) -> None:
    run = cli("inspect", "--db", str(demo_db), "--tree", "bob", "--no-browser")
    assert run.code == 2 and "has no tree 'bob'" in run.err
    bad = cli("inspect", "--db", str(demo_db), "--port", "70000", "--no-browser")
    assert bad.code == 2 and "--port must be in [0, 65535], got 70000" in bad.err


def test_a_postgresql_server_that_is_not_there(cli: RunCli) -> None:
    run = cli("inspect", "--db", "postgresql://user:secret@127.0.0.1:1/app", "--no-browser")
    assert run.code == 2 and "Cannot connect to PostgreSQL at" in run.err
    assert "secret" not in run.err


def test_without_the_extra_it_says_how_to_install_it(
    cli: RunCli, demo_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    run = cli("inspect", "--db", str(demo_db), "--no-browser")
    assert run.code == 2 and 'pip install "stello-graph[inspector]"' in run.err


def test_other_commands_do_not_load_the_web_stack() -> None:
    code = (
        "import sys, stello_graph.cli._main as m; m.build_parser();"
        "print([n for n in ('starlette', 'uvicorn') if n in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.strip() == "[]"


def test_writes_use_the_offline_model_unless_one_is_named(demo_db: Path) -> None:
    import argparse

    from stello_graph.checkpoints import SqliteMainStorage
    from stello_graph.cli._serve import _agent_factory

    args = argparse.Namespace(model=None, base_url=None, write=True)
    with SqliteMainStorage(demo_db) as storage:
        agent = _agent_factory(args, {}, None)(storage)
        with agent:
            pricing = next(n for n in agent.children(agent.main_session_id) if n.label == "Pricing")
            l2 = agent.consolidate(pricing.id)  # the offline summariser extends the L2
            assert (
                l2 == "Yes: a free tier capped at 3 projects. Discussed: What should we do next?."
            )
            assert agent.storage is storage
        assert storage.get_memory_through(pricing.id) == 4  # the storage stays open


def test_with_write_the_printed_url_holds_the_token_writes_need(demo_db: Path) -> None:
    with _inspect(demo_db, "--write") as served:
        base, _, query = served.url.partition("?")
        assert base.endswith("/") and query.startswith("token=")
        token = query.removeprefix("token=")
        assert httpx.get(served.url, timeout=10).status_code == 200
        assert httpx.get(base + "api/tree", timeout=10).json()["count"] == 4  # reads: no token
        origin = base.rstrip("/")
        page = {"Origin": origin, "X-Stello-Token": token}
        done = httpx.post(base + "api/integrate", json={}, headers=page, timeout=10)
        assert done.status_code == 200 and done.json()["synthesis"]
        for headers in ({"Origin": origin}, {**page, "X-Stello-Token": "guess"},
                        {**page, "Origin": "http://evil.example"}):  # fmt: skip
            refused = httpx.post(base + "api/integrate", json={}, headers=headers, timeout=10)
            assert refused.status_code == 403, headers
        port = base.split(":")[2].rstrip("/")
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1:1"):
            rebound = httpx.get(base + "api/tree", headers={"Host": host}, timeout=10)
            assert rebound.status_code == 421, host
        for host in (f"localhost:{port}", f"[::1]:{port}"):
            assert httpx.get(base + "api/tree", headers={"Host": host}, timeout=10).is_success
        _stop(served)


def test_a_host_off_loopback_warns_and_with_write_needs_the_token_on_reads(
    cli: RunCli, demo_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--host 192.0.2.7` (an address of no machine): the command warns that the tree is
    readable from the network, and with `--write` its reads need the token. The server is
    bound to 127.0.0.1 instead and asked in process (these tests use loopback only)."""
    from starlette.testclient import TestClient

    from stello_graph.cli import _serve

    port = 0
    out = io.StringIO()
    asked: dict[str, int] = {}
    listen = _serve.listen

    def loopback(host: str, _: int) -> socket.socket:
        nonlocal port
        sock = listen("127.0.0.1", 0)
        port = sock.getsockname()[1]
        return sock

    class Server:  # asks the app it was given, instead of serving it
        def __init__(self, config: Any) -> None:
            self.app = config.app

        def run(self, sockets: list[socket.socket]) -> None:
            token = (out.getvalue().partition("?token=")[2].split() or [""])[0]
            with TestClient(self.app, base_url=f"http://192.0.2.7:{port}") as client:
                asked["bare"] = client.get("/api/tree").status_code
                asked["token"] = client.get(f"/api/tree?token={token}").status_code
                asked["page"] = client.get("/").status_code

    monkeypatch.setattr(_serve, "listen", loopback)
    monkeypatch.setattr(_serve, "_make_server", lambda config, stopping: Server(config))
    args = ["inspect", "--db", str(demo_db), "--host", "192.0.2.7", "--port", "0", "--no-browser"]
    run = cli(*args, "--write", stdout=out)
    assert run.code == 0, run.err
    assert "warning: --host 192.0.2.7 is not a loopback address" in run.err
    assert "can read the tree with the token of the URL below" in run.err
    assert f"http://192.0.2.7:{port}/?token=" in out.getvalue()
    assert asked == {"bare": 403, "token": 200, "page": 200}

    out = io.StringIO()  # read-only: reads stay open, as the warning says
    read_only = cli(*args, stdout=out)
    assert read_only.code == 0 and "can read the tree." in read_only.err
    assert "?token=" not in out.getvalue() and asked["bare"] == 200
