"""The LangGraph store: the run's own store, async stores through their async methods,
consumed insights and failures after the memory was written."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.store.base import Op, Result
from langgraph.store.base.batch import AsyncBatchedBaseStore
from langgraph.store.memory import InMemoryStore

from stello_graph import MainSession, Schedule, StelloAgent, build_stello_graph
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.models import IntegrationResult
from stello_graph.nodes._store import settled
from stello_graph.testing import ScriptedChatModel

L2 = ("stello", "default", "l2")
INSIGHTS = ("stello", "default", "insights")


def summary(l2: str | None, records: list[Any]) -> str:
    return f"{len(records)} records"


def insights(children: list[Any], current: str | None) -> IntegrationResult:
    return IntegrationResult(synthesis="s", insights={c.session_id: "look" for c in children})


class AsyncOnlyStore(AsyncBatchedBaseStore):
    """A store whose sync methods refuse calls from its loop, as `AsyncPostgresStore`'s do."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = InMemoryStore()

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await self.inner.abatch(ops)


class BrokenStore(InMemoryStore):
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        raise ConnectionError("the store is down")

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        raise ConnectionError("the store is down")


def tree() -> tuple[InMemoryMainStorage, str, str]:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage)
    graph = build_stello_graph(None, storage).compile()
    child = graph.invoke({"op": "fork", "session_id": main.id, "fork": {"label": "A"}})
    return storage, main.id, child["forked"]["session_id"]


def test_the_store_the_graph_is_compiled_with() -> None:
    storage, _, child = tree()
    store = InMemoryStore()
    builder = build_stello_graph(ScriptedChatModel(default="ok"), storage, consolidate_fn=summary)
    graph = builder.compile(store=store)
    graph.invoke({"session_id": child, "input": "hi"})
    assert graph.invoke({"op": "consolidate", "session_id": child})["l2"] == "2 records"
    item = store.get(L2, child)
    assert item is not None and item.value["l2"] == "2 records"


def test_background_jobs_use_the_store_of_the_run_that_queued_them() -> None:
    storage, _, child = tree()
    store = InMemoryStore()
    builder = build_stello_graph(
        ScriptedChatModel(default="ok"), storage, consolidate_fn=summary,
        schedule=Schedule(consolidate_every_n_turns=1, integrate_after_consolidate=False),
    )  # fmt: skip
    graph = builder.compile(store=store)
    graph.invoke({"session_id": child, "input": "hi"})
    for _ in range(500):  # bounded: the job runs in a worker thread
        if store.get(L2, child) is not None:
            break
        time.sleep(0.01)
    item = store.get(L2, child)
    assert item is not None and item.value["l2"] == "2 records"


async def test_an_async_store_through_its_async_methods() -> None:
    storage, _, child = tree()
    store = AsyncOnlyStore()
    builder = build_stello_graph(
        ScriptedChatModel(default="ok"), storage, consolidate_fn=summary, integrate_fn=insights
    )
    graph = builder.compile(store=store)
    await graph.ainvoke({"session_id": child, "input": "hi"})
    await graph.ainvoke({"op": "consolidate", "session_id": child})
    await graph.ainvoke({"op": "integrate"})
    assert (await store.aget(L2, child)) is not None
    found = await store.aget(INSIGHTS, child)
    assert found is not None and found.value == {"insight": "look"}
    # the next turn shows the insight and consumes it: its store entry goes too
    again: Any = {"messages": [HumanMessage("again")]}
    await graph.ainvoke(again, {"configurable": {"session_id": child}})
    await settled()
    assert (await store.aget(INSIGHTS, child)) is None
    assert storage.get_insight(child) is None


def test_a_consumed_insight_leaves_the_store_but_a_newer_one_stays() -> None:
    store = InMemoryStore()
    with StelloAgent(
        model=ScriptedChatModel(default="ok"), storage=InMemoryMainStorage(), store=store,
        consolidate_fn=summary, integrate_fn=insights,
    ) as agent:  # fmt: skip
        child = agent.fork(agent.main_session_id, "A").id
        agent.turn(child, "hi")
        agent.consolidate(child)
        agent.integrate()
        assert store.get(INSIGHTS, child) is not None
        agent.turn(child, "and now?")
        assert store.get(INSIGHTS, child) is None
        store.put(INSIGHTS, child, {"insight": "newer"})
        agent.turn(child, "once more")  # no insight shown: the newer entry is not its
        assert store.get(INSIGHTS, child) is not None


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_store_failing_after_the_l2_is_a_background_failure(mode: str) -> None:
    with StelloAgent(
        model=ScriptedChatModel(default="ok"), storage=InMemoryMainStorage(),
        store=BrokenStore(), consolidate_fn=summary,
    ) as agent:  # fmt: skip
        child = agent.fork(agent.main_session_id, "A").id
        agent.turn(child, "hi")
        l2 = agent.consolidate(child) if mode == "sync" else await agent.aconsolidate(child)
        assert l2 == "2 records" and agent.storage.get_memory(child) == "2 records"
        [failure] = agent.failures(child)
        assert failure.kind == "store" and failure.error_type == "ConnectionError"
        assert "the store is down" in failure.message
