"""Ids composed of a tree id and a session id never collide, and old in-flight work goes on.

Tree `team` with session `x:notes` and tree `team:x` with session `notes` once had one
checkpoint thread (`stello:team:x:notes`), so one tree saw, and destroyed, the other's
interrupted turn; the id of a child forked by a tool call was derived the same way.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.store.memory import InMemoryStore
from langgraph.types import interrupt

from stello_graph import InvalidInputError, StelloAgent, TurnResult
from stello_graph._compiled import allow_replay
from stello_graph._ids import store_label
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.nodes.builtin_tools import _child_ids
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory

TwoTrees = Callable[[str], StelloAgent]


@tool
def approve(what: str) -> str:
    """Ask a human to approve something."""
    return f"{what}: {interrupt({'approve': what})}"


def _model() -> ScriptedChatModel:
    return ScriptedChatModel(
        [ScriptedChatModel.tool_call("approve", {"what": "deploy"}), "Deployed."] * 2
    )


@pytest.fixture(params=["memory", "sqlite"])
def make_tree(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TwoTrees]:
    """Agents of different trees on one checkpointer (the SQLite backend: one file)."""
    made: list[StelloAgent] = []
    saver = InMemorySaver()

    def factory(tree_id: str) -> StelloAgent:
        options: dict[str, Any] = {"model": _model(), "tools": [approve], "tree_id": tree_id}
        if request.param == "memory":
            storage = InMemoryMainStorage(tree_id=tree_id)
            options.update(storage=storage, checkpointer=saver, prune_checkpoints=True)
        else:
            options["storage"] = str(tmp_path / "stello.db")
        agent = StelloAgent(**options)
        made.append(agent)
        return agent

    yield factory
    for agent in made:
        agent.close()


class Driver:
    """Runs an agent's turns through the sync methods or their async twins."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def turn(self, agent: StelloAgent, sid: str, text: str) -> TurnResult:
        if self.mode == "sync":
            return agent.turn(sid, text)
        return await agent.aturn(sid, text)

    async def resume(self, agent: StelloAgent, sid: str, value: Any) -> TurnResult:
        if self.mode == "sync":
            return agent.resume(sid, value)
        return await agent.aresume(sid, value)


@pytest.fixture(params=["sync", "async"])
def drive(request: pytest.FixtureRequest) -> Driver:
    return Driver(str(request.param))


async def test_lookalike_ids_of_two_trees_keep_their_turns(
    make_tree: TwoTrees, drive: Driver
) -> None:
    team, team_x = make_tree("team"), make_tree("team:x")
    notes_a = team.fork(team.main_session_id, "A", id="x:notes").id
    notes_b = team_x.fork(team_x.main_session_id, "B", id="notes").id
    thread = team.config(notes_a)["configurable"]["thread_id"]
    assert thread != team_x.config(notes_b)["configurable"]["thread_id"]
    assert (await drive.turn(team, notes_a, "ship A")).interrupted
    assert (await drive.turn(team_x, notes_b, "ship B")).interrupted  # must not replace A's
    assert (await drive.resume(team, notes_a, "yes")).content == "Deployed."
    assert (await drive.resume(team_x, notes_b, "ok")).content == "Deployed."
    assert team.session(notes_a).messages()[0].content == "ship A"
    assert team_x.session(notes_b).messages()[0].content == "ship B"


def _legacy_thread(agent: StelloAgent, sid: str) -> RunnableConfig:
    """The config of the thread a turn on `sid` had before ids were escaped."""
    return {"configurable": {"thread_id": f"stello:{agent.storage.tree_id}:{sid}"}}


def _interrupt_on(agent: StelloAgent, sid: str, thread: RunnableConfig, text: str) -> None:
    out = agent.graph.invoke({"session_id": sid, "input": text}, thread)
    assert out["__interrupt__"]


async def test_a_turn_left_under_the_old_id_resumes(make_tree: TwoTrees, drive: Driver) -> None:
    agent = make_tree("team")
    sid = agent.fork(agent.main_session_id, "Notes", id="notes").id
    legacy = _legacy_thread(agent, sid)
    _interrupt_on(agent, sid, legacy, "ship it")
    assert (await drive.resume(agent, sid, "yes")).content == "Deployed."
    assert agent.session(sid).messages()[0].content == "ship it"
    assert agent.checkpointer is not None
    assert agent.checkpointer.get_tuple(legacy) is None  # pruned like any finished turn
    # later turns run on the new thread
    assert (await drive.turn(agent, sid, "again")).interrupted
    assert agent.config(sid)["configurable"]["thread_id"] != legacy["configurable"]["thread_id"]


async def test_another_trees_old_turn_is_left_alone(make_tree: TwoTrees, drive: Driver) -> None:
    team, team_x = make_tree("team"), make_tree("team:x")
    notes_a = team.fork(team.main_session_id, "A", id="x:notes").id
    notes_b = team_x.fork(team_x.main_session_id, "B", id="notes").id
    legacy = _legacy_thread(team_x, notes_b)
    assert legacy == _legacy_thread(team, notes_a)  # the old ids collide
    _interrupt_on(team_x, notes_b, legacy, "ship B")
    with pytest.raises(InvalidInputError, match="no turn in flight"):
        await drive.resume(team, notes_a, "yes")  # not its turn
    assert (await drive.turn(team, notes_a, "ship A")).interrupted
    assert (await drive.resume(team_x, notes_b, "ok")).content == "Deployed."
    assert team_x.session(notes_b).messages()[0].content == "ship B"
    assert team.session(notes_a).messages() == []  # A's turn still waits


def _in_turn(messages: list[BaseMessage]) -> list[BaseMessage]:
    last = max(i for i, m in enumerate(messages) if m.type == "human")
    return messages[last:]


def _fork_once(messages: list[BaseMessage]) -> Any:
    if any(m.type == "tool" for m in _in_turn(messages)):
        return "Branched."
    return ScriptedChatModel.tool_call("create_session", {"label": "Deep dive"}, id="c1")


def _before_tools(agent: StelloAgent, sid: str) -> RunnableConfig:
    history = agent.graph.get_state_history(agent.config(sid))
    return next(s.config for s in history if s.next == ("tools",))


def test_a_forking_tool_call_gets_an_id_of_its_own_tree() -> None:
    # one turn id and tool call id on the lookalike sessions of two trees: two children
    human = HumanMessage("branch", id="same-turn")
    ids = {
        _child_ids(
            tree_id, {"state": {"session_id": sid, "pending": [human]}, "tool_call_id": "c1"}
        )[0]
        for tree_id, sid in (("team", "x:notes"), ("team:x", "notes"))
    }
    assert len(ids) == 2


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_fork_made_under_the_old_child_id_is_not_made_twice(
    make_agent: AgentFactory, mode: str
) -> None:
    # every step on disk (kept, the default "exit" keeps a turn's last checkpoint only)
    agent = make_agent(
        model=ScriptedChatModel(respond=_fork_once), prune_checkpoints=False, durability="sync"
    )
    parent = agent.fork(agent.main_session_id, "Parent").id
    agent.turn(parent, "let's branch")
    before_tools = _before_tools(agent, parent)
    first = agent.graph.get_state(before_tools).values["pending"][0]
    # the child as an earlier version named it, when this tool call first ran
    agent.remove(agent.storage.get_children(parent)[0].id)
    key = f"stello:{agent.storage.tree_id}:{parent}:{first.id}:c1"
    old_id = str(uuid.uuid5(uuid.NAMESPACE_URL, key))
    agent.fork(parent, "Deep dive", id=old_id)
    # the tool round runs again, after the upgrade (a replay, on purpose)
    if mode == "sync":
        agent.graph.invoke(None, allow_replay(before_tools))
    else:
        await agent.graph.ainvoke(None, allow_replay(before_tools))
    assert [c.id for c in agent.storage.get_children(parent)] == [old_id]


@pytest.mark.parametrize("tree_id", ["acme.com", "team:x", "100%"])
def test_any_tree_id_publishes_to_the_store(tree_id: str) -> None:
    # a LangGraph store refuses namespace labels holding a `.`: the tree id is escaped
    store = InMemoryStore()
    with StelloAgent(
        model=ScriptedChatModel(default="ok"),
        storage=InMemoryMainStorage(tree_id=tree_id),
        store=store,
        consolidate_fn=lambda l2, records: "the summary",
    ) as agent:
        child = agent.fork(agent.main_session_id, "Notes").id
        agent.turn(child, "hello")
        assert agent.consolidate(child) == "the summary"
    (label,) = {ns[1] for ns in store.list_namespaces(prefix=("stello",))}
    assert "." not in label
    item = store.get(("stello", label, "l2"), child)
    assert item is not None and item.value["l2"] == "the summary"


def test_store_labels_of_distinct_tree_ids_differ() -> None:
    ids = ["a.b", "a%2Eb", "a%b", "a", "default"]
    assert len({store_label(i) for i in ids}) == len(ids)
    assert store_label("default") == "default"  # plain ids keep their namespace
