"""Removing a session removes its checkpoint threads and store entries too: no text left, no
turn taken over.

A removed session's in-flight (or, without pruning, finished) turns stayed in the
checkpointer, and a new session given the same id took over the old interrupted turn.
"""

from __future__ import annotations

import pytest
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.store.memory import InMemoryStore
from langgraph.types import interrupt

from stello_graph import IntegrationResult, InvalidInputError, StelloAgent
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory


@tool
def approve(what: str) -> str:
    """Ask a human to approve something."""
    return f"{what}: {interrupt({'approve': what})}"


def _threads(agent: StelloAgent) -> set[str]:
    assert agent.checkpointer is not None
    return {c.config["configurable"]["thread_id"] for c in agent.checkpointer.list(None)}


def _legacy(agent: StelloAgent, sid: str) -> RunnableConfig:
    """The thread a turn on `sid` had before thread ids were escaped."""
    return {"configurable": {"thread_id": f"stello:{agent.storage.tree_id}:{sid}"}}


async def _remove(agent: StelloAgent, sid: str, mode: str, *, cascade: bool) -> list[str]:
    if mode == "sync":
        return agent.remove(sid, cascade=cascade)
    return await agent.aremove(sid, cascade=cascade)


def _model() -> ScriptedChatModel:
    asks = ScriptedChatModel.tool_call("approve", {"what": "the secret plan"})
    return ScriptedChatModel(respond=lambda msgs: asks if msgs[-1].type == "human" else "Done.")


def _agent(make_agent: AgentFactory, model: ScriptedChatModel | None = None) -> StelloAgent:
    return make_agent(model=model or _model(), tools=[approve], prune_checkpoints=False)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("cascade", [False, True])
async def test_removed_sessions_leave_no_thread(
    make_agent: AgentFactory, mode: str, cascade: bool
) -> None:
    agent = _agent(make_agent)
    parent = agent.fork(agent.main_session_id, "Parent").id
    child = agent.fork(parent, "Child").id
    assert agent.turn(child, "child secret").interrupted
    assert agent.turn(parent, "parent secret").interrupted
    assert agent.resume(parent, "yes").content == "Done."  # a finished turn, not pruned
    out = agent.graph.invoke({"session_id": parent, "input": "old secret"}, _legacy(agent, parent))
    assert out["__interrupt__"]  # a turn left under the old thread id
    before = _threads(agent)
    gone = await _remove(agent, parent if cascade else child, mode, cascade=cascade)
    removed_threads = {agent.config(s)["configurable"]["thread_id"] for s in gone} | {
        _legacy(agent, s)["configurable"]["thread_id"] for s in gone
    }
    assert removed_threads & before  # there was something to remove
    assert not removed_threads & _threads(agent)
    if not cascade:  # the parent stays, and so do its threads
        assert agent.config(parent)["configurable"]["thread_id"] in _threads(agent)
        assert _legacy(agent, parent)["configurable"]["thread_id"] in _threads(agent)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_new_session_with_a_removed_id_starts_clean(
    make_agent: AgentFactory, mode: str
) -> None:
    model = _model()
    agent = _agent(make_agent, model)
    child = agent.fork(agent.main_session_id, "Child", id="reused").id
    assert agent.turn(child, "the secret plan").interrupted
    await _remove(agent, child, mode, cascade=False)
    agent.fork(agent.main_session_id, "Again", id="reused")
    with pytest.raises(InvalidInputError, match="no turn in flight"):
        agent.resume("reused", "yes")
    assert agent.session("reused").messages() == []
    assert model.call_count == 1  # nothing of the old turn was sent to the model again


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_removed_sessions_leave_nothing_in_the_store(
    make_agent: AgentFactory, mode: str
) -> None:
    store = InMemoryStore()
    agent = make_agent(
        model=ScriptedChatModel(default="ok"),
        store=store,
        consolidate_fn=lambda l2, records: "the summary",
        integrate_fn=lambda children, current: IntegrationResult(
            synthesis="s", insights={c.session_id: "the insight" for c in children}
        ),
    )
    parent = agent.fork(agent.main_session_id, "Parent").id
    child = agent.fork(parent, "Child").id
    for sid in (parent, child):
        agent.turn(sid, "hello")
        agent.consolidate(sid)
    agent.integrate("tree")  # L2, insights, and the parent's subtree summary are published
    published = {(ns[-1], key) for ns, key in _store_keys(store)}
    assert {("l2", child), ("insights", child), ("subtree", parent)} <= published
    await _remove(agent, parent, mode, cascade=True)
    left = {key for _, key in _store_keys(store)}
    assert not left & {parent, child}
    assert agent.main_session_id in left  # the rest of the tree keeps its entries


def _store_keys(store: InMemoryStore) -> list[tuple[tuple[str, ...], str]]:
    return [
        (ns, item.key)
        for ns in store.list_namespaces(prefix=("stello",))
        for item in store.search(ns, limit=1000)
    ]
