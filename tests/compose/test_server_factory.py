"""`stello_graph.server.make_graph` / `amake_graph` in process: the environment, trees, the
offline model."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from stello_graph import agent as agent_module
from stello_graph import server
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.errors import InvalidInputError, ModelNotConfiguredError


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    db = tmp_path / "trees.db"
    monkeypatch.setenv(server.MODEL_ENV, "scripted")
    monkeypatch.setenv(server.DATABASE_ENV, str(db))
    monkeypatch.setenv(server.TOOLS_ENV, "tests.server._tools:TOOLS")
    server.close_trees()
    yield db
    server.close_trees()


def tree(name: str, thread: str = "t") -> Any:
    return {"configurable": {"tree_id": name, "thread_id": thread}}


def ask(text: str) -> Any:
    return {"messages": [HumanMessage(text)]}


def test_each_tree_has_its_main_session(env: Path) -> None:
    alice = server.make_graph(tree("alice")).compile(checkpointer=InMemorySaver())
    bob = server.make_graph(tree("bob")).compile(checkpointer=InMemorySaver())
    a = alice.invoke(ask("hi"), tree("alice"))
    b = bob.invoke(ask("hi"), tree("bob"))
    assert a["content"] == "(scripted) You said: hi"
    assert a["session_id"] != b["session_id"]
    assert server.make_graph(tree("alice")) is server.make_graph(tree("alice"))  # kept open
    server.close_trees()
    with SqliteMainStorage(env, tree_id="alice") as storage:
        main = storage.get_main_session()
        # the thread's first run started its own session, a child of the tree's main session
        node = storage.get_node(a["session_id"])
        assert main is not None and node is not None and node.parent_id == main.id
        assert storage.count_records(a["session_id"]) == 2


def test_the_offline_model_calls_tools_and_waits_on_interrupts(env: Path) -> None:
    graph = server.make_graph(tree("tools")).compile(checkpointer=InMemorySaver())
    first = graph.invoke(ask('/call approve {"action": "ship"}'), tree("tools"))
    assert first["__interrupt__"][0].value == {"approve": "ship"}
    out = graph.invoke(Command(resume="fine"), tree("tools"))
    assert out["content"] == "(scripted) approve returned: ship: fine"


def test_bad_call_arguments_are_answered(env: Path) -> None:
    graph = server.make_graph(tree("x")).compile()
    out = graph.invoke(ask("/call approve {not json}"), tree("x"))
    assert "not JSON" in out["content"]


async def test_first_open_inside_an_event_loop_runs_off_the_loop(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened_in: list[str] = []
    real = server._open

    def spy(*args: Any) -> Any:
        opened_in.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(server, "_open", spy)
    graph = server.make_graph(tree("loop")).compile()
    out = await graph.ainvoke(ask("hello"), tree("loop"))
    assert out["content"] == "(scripted) You said: hello"
    assert opened_in and opened_in[0] != threading.current_thread().name
    assert asyncio.get_running_loop().is_running()


async def test_the_async_factory_opens_a_tree_while_the_loop_runs_on(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`amake_graph` (what `langgraph.json` names) awaits the opening: other tasks of the
    server's loop run meanwhile (a transaction of another tree may hold the file's write
    lock the opening waits for); an open tree is handed out without a thread."""
    real, ticks, seen = server._open, [0], list[int]()

    def slow(*args: Any) -> Any:
        for _ in range(200):  # up to 2 s for the loop to tick three times meanwhile
            if ticks[0] >= 3:
                break
            threading.Event().wait(0.01)
        seen.append(ticks[0])
        return real(*args)

    async def ticker() -> None:
        for _ in range(3):
            await asyncio.sleep(0.005)
            ticks[0] += 1

    monkeypatch.setattr(server, "_open", slow)
    tick = asyncio.create_task(ticker())
    async with server.amake_graph(tree("async")) as graph:
        await tick
        assert seen == [3]  # the loop ran on while the tree opened
        out = await graph.compile().ainvoke(ask("hello"), tree("async"))
    assert out["content"] == "(scripted) You said: hello"
    async with server.amake_graph(tree("async")) as again:
        assert again is server.make_graph(tree("async"))
    assert seen == [3]  # opened once


def test_the_environment_is_checked(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(server.MODEL_ENV)
    with pytest.raises(ModelNotConfiguredError, match=server.MODEL_ENV):
        server.make_graph(tree("a"))
    monkeypatch.setenv(server.MODEL_ENV, "scripted")
    monkeypatch.setenv(server.TOOLS_ENV, "no_colon_here")
    with pytest.raises(InvalidInputError, match="module:attribute"):
        server.make_graph(tree("a"))
    monkeypatch.setenv(server.TOOLS_ENV, "")
    with pytest.raises(InvalidInputError, match="tree_id"):
        server.make_graph(tree(""))


@pytest.mark.parametrize(
    ("tree_id", "message"),
    [
        ("alice\x00", "control character '\\x00'"),
        ("a\tb", "control character '\\t'"),
        ("t" * 257, "has 257 characters; the limit is 256"),
    ],
    ids=["NUL", "tab", "too long"],
)
def test_a_bad_tree_id_is_refused(env: Path, tree_id: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match="tree_id") as caught:
        server.make_graph(tree(tree_id))
    assert message in str(caught.value)
    assert not env.exists()  # refused before the database was opened


def test_a_long_tree_id_within_the_limit_is_served(env: Path) -> None:
    name = "t" * 256
    graph = server.make_graph(tree(name)).compile()
    assert graph.invoke(ask("hi"), tree(name))["content"] == "(scripted) You said: hi"


def test_a_model_name_means_chat_openai(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(server.MODEL_ENV, "gpt-test")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    server.make_graph(tree("openai"))
    model = server.open_tree("openai").model
    assert type(model).__name__ == "ChatOpenAI"
    assert getattr(model, "model_name", None) == "gpt-test"


@pytest.mark.parametrize(
    ("name", "base_url", "built", "model_name"),
    [
        ("anthropic:claude-sonnet-4-5", None, "ChatAnthropic", "claude-sonnet-4-5"),
        ("openai:gpt-4o-mini", "http://127.0.0.1:9/v1", "ChatOpenAI", "gpt-4o-mini"),
        ("gpt-4o-mini", None, "ChatOpenAI", "gpt-4o-mini"),
        ("ft:gpt-4o-mini:acme::x1", None, "ChatOpenAI", "ft:gpt-4o-mini:acme::x1"),
        ("llama3.2:1b", "http://127.0.0.1:9/v1", "ChatOpenAI", "llama3.2:1b"),
        ("mistral:7b", "http://127.0.0.1:9/v1", "ChatOpenAI", "mistral:7b"),
    ],
    ids=["anthropic", "openai", "bare", "fine-tune", "server tag", "server tag, no provider"],
)
def test_provider_model_names_go_through_init_chat_model(
    env: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    base_url: str | None,
    built: str,
    model_name: str,
) -> None:
    monkeypatch.setenv(server.MODEL_ENV, name)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    if base_url is None:
        monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    else:
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
    server.make_graph(tree("named"))
    model = server.open_tree("named").model
    assert type(model).__name__ == built
    assert (getattr(model, "model_name", None) or getattr(model, "model", None)) == model_name


def test_a_model_name_that_cannot_be_built_fails_at_start(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv(server.MODEL_ENV, "anthropc:claude-sonnet-4-5")  # a typo
    with pytest.raises(InvalidInputError, match="'anthropc' is no provider") as caught:
        server.make_graph(tree("a"))
    assert "STELLO_MODEL='anthropc:claude-sonnet-4-5'" in str(caught.value)
    monkeypatch.setitem(sys.modules, "langchain_upstage", None)  # not installed
    monkeypatch.setenv(server.MODEL_ENV, "upstage:solar-pro")
    with pytest.raises(ModelNotConfiguredError, match="pip install langchain-upstage"):
        server.make_graph(tree("a"))
    assert not env.exists()  # refused before the database was opened


def test_postgres_dsns_go_to_the_storage_factory(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, str]] = []

    def factory(uri: str, tree_id: str) -> SqliteMainStorage:
        seen.append((uri, tree_id))
        return SqliteMainStorage(":memory:", tree_id=tree_id)

    monkeypatch.setattr(agent_module, "_open_storage", factory)
    monkeypatch.setenv(server.DATABASE_ENV, "postgresql://stello@127.0.0.1/stello")
    server.close_trees()
    server.make_graph(tree("pg"))
    assert seen == [("postgresql://stello@127.0.0.1/stello", "pg")]
