"""`STELLO_MAX_OPEN_TREES`: a server process keeps a bounded number of trees open.

Every tree id a client sent used to stay open for the life of the process (two file
descriptors and a scheduler thread each, so tree 510 failed under the usual limit of 1,024
open files). Now opening a tree closes the least recently used ones no run uses; a closed
tree reopens on its next run with nothing lost, and a tree a run uses is never closed.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from stello_graph import server
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.errors import InvalidInputError
from stello_graph.nodes.deps import StelloRuntime

ENTERED, RELEASE = threading.Event(), threading.Event()


@tool
def hold() -> str:
    """Wait until the test lets the run go on."""
    ENTERED.set()
    if not RELEASE.wait(30):
        raise TimeoutError("the test never released the run")
    return "released"


TOOLS = [hold]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    db = tmp_path / "trees.db"
    monkeypatch.setenv(server.MODEL_ENV, "scripted")
    monkeypatch.setenv(server.DATABASE_ENV, str(db))
    monkeypatch.setenv(server.TOOLS_ENV, f"{__name__}:TOOLS")
    monkeypatch.setenv(server.MAX_OPEN_TREES_ENV, "2")
    ENTERED.clear()
    RELEASE.clear()
    server.close_trees()
    yield db
    RELEASE.set()
    server.close_trees()


def tree(name: str) -> Any:
    return {"configurable": {"tree_id": name, "thread_id": name}}


def ask(text: str) -> Any:
    return {"messages": [HumanMessage(text)]}


def turn(name: str, text: str = "hi") -> str:
    graph = server.make_graph(tree(name)).compile(checkpointer=InMemorySaver())
    content: str = graph.invoke(ask(text), tree(name))["content"]
    return content


def open_ids() -> set[str]:
    return {tree_id for _, tree_id in server._trees}


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_open_trees_stay_bounded(env: Path) -> None:
    for name in ("t0", "t1"):
        turn(name)
    files, threads = open_files(), threading.active_count()
    for n in range(2, 14):
        assert turn(f"t{n}") == "(scripted) You said: hi"
        assert open_ids() == {f"t{n - 1}", f"t{n}"}  # the two most recently used
    assert open_files() <= files + 2  # not two more per tree
    assert threading.active_count() <= threads  # nor a scheduler thread per tree


def test_a_closed_tree_reopens_with_nothing_lost(env: Path) -> None:
    graph = server.make_graph(tree("alice")).compile(checkpointer=InMemorySaver())
    first = graph.invoke(ask("one"), tree("alice"))
    fork = {"op": "fork", "session_id": first["session_id"], "fork": {"label": "Notes"}}
    child = graph.invoke(fork, tree("alice"))["forked"]["session_id"]
    graph.invoke({"session_id": child, "input": "a note"}, tree("alice"))
    for name in ("bob", "carol", "dave"):
        turn(name)
    assert "alice" not in open_ids()
    assert turn("alice", "two") == "(scripted) You said: two"
    with SqliteMainStorage(env, tree_id="alice") as storage:
        # each thread's first message started its session: "one", then "two"
        labels = [m.label for m in storage.list_sessions()]
        assert labels == ["Main Session", "one", "Notes", "two"]
        assert storage.get_turn_count(first["session_id"]) == 1
        assert storage.count_records(first["session_id"]) == 2
        assert storage.count_records(child) == 2


def test_a_tree_with_a_run_in_flight_is_not_closed(env: Path) -> None:
    graph = server.make_graph(tree("busy")).compile(checkpointer=InMemorySaver())
    out: dict[str, Any] = {}
    call = ask("/call hold")
    run = threading.Thread(target=lambda: out.update(graph.invoke(call, tree("busy"))))
    run.start()
    assert ENTERED.wait(30)
    for name in ("a", "b", "c", "d"):
        turn(name)
        assert "busy" in open_ids()  # its run is in flight
    assert open_ids() == {"busy", "d"}
    RELEASE.set()
    run.join(30)
    assert out["content"] == "(scripted) hold returned: released"
    turn("e")
    assert "busy" not in open_ids()  # idle now, and the least recently used
    assert len(open_ids()) == 2


async def test_a_tree_the_server_holds_for_a_run_is_not_closed(env: Path) -> None:
    async with server.amake_graph(tree("held")) as graph:
        for name in ("a", "b", "c"):
            async with server.amake_graph(tree(name)):
                pass
            assert "held" in open_ids()  # the server has not started its run yet
        out = await graph.compile(checkpointer=InMemorySaver()).ainvoke(ask("hi"), tree("held"))
        assert out["content"] == "(scripted) You said: hi"
    async with server.amake_graph(tree("d")):
        pass
    assert "held" not in open_ids()


async def test_the_limit_is_exceeded_while_every_tree_is_in_use(env: Path) -> None:
    async with (
        server.amake_graph(tree("a")),
        server.amake_graph(tree("b")),
        server.amake_graph(tree("c")),
    ):
        assert open_ids() == {"a", "b", "c"}
    async with server.amake_graph(tree("d")):
        assert open_ids() == {"c", "d"}


async def test_trees_are_closed_off_the_event_loop(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed_in: list[str] = []
    real = StelloRuntime.close

    def spy(runtime: StelloRuntime, **options: Any) -> None:
        closed_in.append(threading.current_thread().name)
        real(runtime, **options)

    monkeypatch.setattr(StelloRuntime, "close", spy)
    for name in ("a", "b", "c", "d"):
        async with server.amake_graph(tree(name)) as graph:
            await graph.compile().ainvoke(ask("hi"), tree(name))
    assert len(closed_in) == 2
    assert threading.current_thread().name not in closed_in
    assert asyncio.get_running_loop().is_running()


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "²"])
def test_the_limit_is_checked(env: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(server.MAX_OPEN_TREES_ENV, value)
    with pytest.raises(InvalidInputError, match="STELLO_MAX_OPEN_TREES must be a positive"):
        server.make_graph(tree("a"))
    assert not env.exists()
