"""Background memory under `stello_graph.server.make_graph`: the environment's schedule,
consolidations of turns that arrive through the server's graph, and due work found by the
next worker process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from stello_graph import server
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.errors import InvalidInputError
from stello_graph.schedule import Schedule


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    db = tmp_path / "trees.db"
    monkeypatch.setenv(server.MODEL_ENV, "scripted")
    monkeypatch.setenv(server.DATABASE_ENV, str(db))
    monkeypatch.delenv(server.CONSOLIDATE_ENV, raising=False)
    monkeypatch.delenv(server.INTEGRATE_ENV, raising=False)
    server.close_trees()
    yield db
    server.close_trees()


def _config(thread: str = "t") -> Any:
    return {"configurable": {"tree_id": "alice", "thread_id": thread}}


def _turns(texts: list[str]) -> str:
    """`texts` as turns of the main session; its id."""
    main = server.open_tree("alice").storage.get_main_session()
    assert main is not None
    graph = server.make_graph(_config()).compile(checkpointer=InMemorySaver())
    for text in texts:
        out = graph.invoke(
            {"messages": [HumanMessage(text)]}, _config(), context={"session_id": main.id}
        )
        assert out["session_id"] == main.id
    return main.id


def test_the_default_schedule(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    schedule = server.server_schedule()
    assert schedule == Schedule(
        consolidate_every_n_turns=8, consolidate_on_archive=True,
        integrate_after_consolidate=True, recover_every=60.0,
    )  # fmt: skip
    monkeypatch.setenv(server.INTEGRATE_ENV, "5")
    monkeypatch.setenv(server.CONSOLIDATE_ENV, "0")
    found = server.server_schedule()
    assert found is not None and found.consolidate_every_n_turns is None
    assert found.integrate_every_n_turns == 5
    monkeypatch.setenv(server.INTEGRATE_ENV, "0")
    assert server.server_schedule() is None  # both off: no background memory
    for bad in ("often", "²", "１", "1_0"):  # str.isdigit takes the last three, int() fails
        monkeypatch.setenv(server.CONSOLIDATE_ENV, bad)
        with pytest.raises(InvalidInputError, match="STELLO_CONSOLIDATE_EVERY"):
            server.server_schedule()


def test_turns_through_the_server_graph_are_consolidated_and_integrated(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(server.CONSOLIDATE_ENV, "2")
    main_id = _turns(["one", "two"])
    runtime = server.open_tree("alice")
    assert runtime.scheduler is not None and runtime.scheduler.drain(30)
    server.close_trees()
    with SqliteMainStorage(env, tree_id="alice") as storage:
        # the main session integrates; a child consolidates: fork one and talk to it
        assert storage.get_memory(main_id) is None
    graph = server.make_graph(_config()).compile(checkpointer=InMemorySaver())
    fork = {"op": "fork", "session_id": main_id, "fork": {"label": "ideas"}}
    child = graph.invoke(fork, _config("f"))["forked"]["session_id"]
    for text in ("a", "b"):
        graph.invoke({"session_id": child, "input": text}, _config("c"))
    runtime = server.open_tree("alice")
    assert runtime.scheduler is not None and runtime.scheduler.drain(30)
    server.close_trees()
    with SqliteMainStorage(env, tree_id="alice") as storage:
        assert storage.get_memory(child) is not None  # consolidated in the background
        assert storage.get_memory(main_id) is not None  # and integrated after it


def test_due_work_left_by_a_stopped_worker_is_done_by_the_next(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(server.CONSOLIDATE_ENV, "0")
    monkeypatch.setenv(server.INTEGRATE_ENV, "0")  # a worker without background memory
    graph = server.make_graph(_config()).compile(checkpointer=InMemorySaver())
    main_id = _turns(["hi"])
    fork = {"op": "fork", "session_id": main_id, "fork": {"label": "x"}}
    child = graph.invoke(fork, _config("f"))["forked"]["session_id"]
    for text in ("a", "b", "c"):
        graph.invoke({"session_id": child, "input": text}, _config("c"))
    server.close_trees()

    monkeypatch.setenv(server.CONSOLIDATE_ENV, "3")  # the next worker: it finds them due
    server.make_graph(_config())
    runtime = server.open_tree("alice")
    assert runtime.scheduler is not None and runtime.scheduler.drain(30)
    server.close_trees()  # stops the scheduler's threads too
    assert runtime.scheduler._scanner is not None and not runtime.scheduler._scanner.is_alive()
    with SqliteMainStorage(env, tree_id="alice") as storage:
        assert storage.get_memory(child) is not None
