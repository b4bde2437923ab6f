"""No async path of the library blocks the event loop (the check LangGraph Server runs).

`blockbuster` makes every blocking call (SQLite statements, file I/O, `time.sleep`, waiting
on a held lock, ...) made on the event loop from stello-graph's code raise `BlockingError`.
The async APIs then run end to end over a SQLite file: storage, sessions, the agent's turns,
streams, forks and memory, and the compiled graph with the agent's checkpointer.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from blockbuster import BlockBuster, blockbuster_ctx
from langchain_core.messages import HumanMessage

from stello_graph import Schedule, StelloAgent
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.models import IntegrationResult, SessionMeta, TopologyNode
from stello_graph.testing import ScriptedChatModel

_LIBRARY = ["stello_graph", "stello_graph.nodes", "stello_graph.checkpoints"]


@pytest.fixture
def blockbuster() -> Iterator[BlockBuster]:
    """Blocking calls on the loop from the library's code raise while the test runs."""
    with blockbuster_ctx(_LIBRARY) as found:
        yield found


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[StelloAgent]:
    """An agent on a SQLite file, opened (a sync constructor) before blocking is checked."""
    made = StelloAgent(
        storage=str(tmp_path / "stello.db"),
        model=ScriptedChatModel(default="ok"),
        consolidate_fn=lambda l2, records: f"{len(records)} records",
        integrate_fn=lambda children, synthesis: IntegrationResult(synthesis="synthesis"),
    )
    yield made
    await made.aclose()


def test_the_checker_catches_a_blocking_call(tmp_path: Path) -> None:
    storage = SqliteMainStorage(tmp_path / "s.db")

    async def blocks() -> None:
        storage.put_session(SessionMeta(id="s1", label="One"))  # sync SQLite on the loop

    from blockbuster import BlockingError

    with blockbuster_ctx(_LIBRARY), pytest.raises(BlockingError):
        asyncio.run(blocks())
    storage.close()


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[SqliteMainStorage]:
    with SqliteMainStorage(tmp_path / "s.db") as opened:
        yield opened


async def test_storage_async_methods(storage: SqliteMainStorage, blockbuster: BlockBuster) -> None:
    await storage.aput_session(SessionMeta(id="main", label="Main", role="main"))
    await storage.aput_session(SessionMeta(id="c1", label="Child"))
    await storage.aput_node(TopologyNode(id="main"))
    async with storage.atransaction():
        await storage.aput_node(TopologyNode(id="c1", parent_id="main", label="Child"))
        await storage.aappend_records("c1", [HumanMessage("hi")], user_turn=True)
        await storage.aput_memory("c1", "l2", through=1)
    assert [n.id for n in await storage.aget_tree()] == ["main", "c1"]
    assert len(await storage.alist_records("c1")) == 1
    assert [c.l2 for c in await storage.aget_all_session_l2s()] == ["l2"]
    lease = await storage.aacquire_lease("c1", "me", 5.0)
    assert lease is not None
    await storage.acheck_lease(lease)
    assert await storage.arelease_lease(lease)
    await storage.aput_global("k", {"v": 1})
    assert await storage.aget_global("k") == {"v": 1}
    await storage.aput_session(SessionMeta(id="c2", label="Copy"))
    assert await storage.acopy_records("c1", "c2", count=1) == 1
    await storage.aput_lineage("c2", "c1", 1)
    assert (await storage.alist_lineage())["c2"].source_id == "c1"
    assert len(await storage.alist_session_digests()) == 3
    cursor = await storage.aappend_event("consolidated", "c1", {"l2": "l2"})
    assert [e.cursor for e in await storage.aevents_after(0)] == [cursor]
    assert await storage.aremove_node("c1") == ["c1"]


async def test_agent_async_api(agent: StelloAgent, blockbuster: BlockBuster) -> None:
    main = agent.main_session_id
    node = await agent.afork(main, "Branch")
    result = await agent.aturn(node.id, "hello")
    assert result.content == "ok"
    inherited = await agent.afork(node.id, "Inherits", context="inherit", at_turn=1)
    assert len(await (await agent.asession(inherited.id)).amessages()) == 2
    chunks = [chunk.content async for chunk, _ in agent.astream(node.id, "again")]
    assert "".join(chunks) == "ok"
    assert await agent.aconsolidate(node.id) == "4 records"
    integrated = await agent.aintegrate()
    assert integrated.synthesis == "synthesis"
    session = await agent.asession(node.id)
    assert (await session.asend("direct")).content == "ok"
    streamed = [chunk async for chunk in session.astream("streamed")]
    assert "".join(streamed) == "ok"
    assert await agent.afailures() == []
    await agent.adrain(5)


async def test_the_graph_with_the_agents_checkpointer(
    agent: StelloAgent, blockbuster: BlockBuster
) -> None:
    node = await agent.afork(agent.main_session_id, "Graph")
    out = await agent.graph.ainvoke(
        {"session_id": node.id, "input": "through the graph"},
        agent.config(node.id),
    )
    assert out["content"] == "ok"
    seen = [
        item
        async for item in agent.graph.astream(
            {"session_id": node.id, "input": "streamed"},
            agent.config(node.id),
            stream_mode=["messages", "custom", "updates"],
        )
    ]
    assert seen


async def test_background_memory_and_closing(tmp_path: Path, blockbuster: BlockBuster) -> None:
    blockbuster.deactivate()  # the constructor is sync
    agent = StelloAgent(
        storage=str(tmp_path / "bg.db"),
        model=ScriptedChatModel(default="ok"),
        consolidate_fn=lambda l2, records: f"{len(records)} records",
        integrate_fn=lambda children, synthesis: IntegrationResult(synthesis="s"),
        schedule=Schedule(consolidate_every_n_turns=1, integrate_after_consolidate=True),
    )
    blockbuster.activate()
    first = await agent.afork(agent.main_session_id, "First")
    second = await agent.afork(agent.main_session_id, "Second")
    await agent.aturn(first.id, "one")
    await agent.aturn(second.id, "two")
    assert await agent.adrain(10)
    assert await agent.afailures() == []
    await agent.amove(second.id, first.id)
    assert [n.id for n in await agent.achildren(first.id)] == [second.id]
    await agent.aarchive(second.id)
    assert await agent.aremove(first.id, cascade=True) == [first.id, second.id]
    await agent.aclose()


async def test_tool_rounds_and_a_model_fork(tmp_path: Path, blockbuster: BlockBuster) -> None:
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    model = ScriptedChatModel(
        [
            ScriptedChatModel.tool_call("add", {"a": 2, "b": 3}),
            ScriptedChatModel.tool_call("create_session", {"label": "Deep", "context": "inherit"}),
            "done",
        ]
    )
    blockbuster.deactivate()  # the constructor is sync
    agent = StelloAgent(storage=str(tmp_path / "tools.db"), model=model, tools=[add])
    blockbuster.activate()
    parent = await agent.afork(agent.main_session_id, "Parent")
    assert (await agent.aturn(parent.id, "add, then branch")).content == "done"
    (child,) = await agent.achildren(parent.id)
    assert child.label == "Deep"
    await agent.aclose()


class _LoopStrictLock:
    """A lock that records every blocking wait for it on an event loop, contended or not.

    blockbuster sees a wait only when the lock happens to be taken; a saver's lock is held by
    writers that may themselves wait for a database lock a task of the loop holds, so any
    wait for it on the loop can stall the loop (until the database's busy timeout)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.waits: list[str] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if blocking and timeout != 0 and _on_loop():
            self.waits.append("".join(traceback.format_stack(limit=6)))
        return bool(self.inner.acquire(blocking, timeout))

    def release(self) -> None:
        self.inner.release()

    def locked(self) -> bool:
        return bool(self.inner.locked())

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def test_no_async_path_waits_for_the_savers_lock_on_the_loop(
    tmp_path: Path, blockbuster: BlockBuster
) -> None:
    blockbuster.deactivate()  # the constructor is sync
    agent = StelloAgent(
        storage=str(tmp_path / "strict.db"),
        model=ScriptedChatModel(default="ok"),
        consolidate_fn=lambda l2, records: f"{len(records)} records",
        schedule=Schedule(consolidate_on_switch=True),
    )
    blockbuster.activate()
    saver: Any = agent.checkpointer
    strict = saver.lock = _LoopStrictLock(saver.lock)
    one = await agent.afork(agent.main_session_id, "One")
    two = await agent.afork(agent.main_session_id, "Two")
    for sid in (one.id, two.id, one.id):  # each switch consolidates the session left
        assert (await agent.aturn(sid, "hello")).content == "ok"
    assert "".join([c.content async for c, _ in agent.astream(two.id, "again")]) == "ok"
    await agent.afork(two.id, "Inherits", context="inherit", at_turn=1)
    assert await agent.adrain(10)
    assert await agent.afailures() == []
    assert strict.waits == [], strict.waits[0]
    await agent.aclose()


async def test_a_fresh_agent_resumes_at_the_tools_and_archives_without_blocking(
    tmp_path: Path, blockbuster: BlockBuster
) -> None:
    """A session the agent has not cached yet is read through the async storage API: a
    turn resumed at its tools (in a new process) and an archive."""
    from langchain_core.tools import tool
    from langgraph.types import interrupt

    @tool
    def ask(question: str) -> str:
        """Ask the user."""
        return str(interrupt(question))

    db = tmp_path / "fresh.db"
    model = ScriptedChatModel([ScriptedChatModel.tool_call("ask", {"question": "which?"}), "ok"])
    blockbuster.deactivate()  # the constructor is sync
    first = StelloAgent(storage=str(db), model=model, tools=[ask])
    blockbuster.activate()
    asks = await first.afork(first.main_session_id, "Asks")
    other = await first.afork(first.main_session_id, "Other")
    assert (await first.aturn(asks.id, "go")).interrupted
    await first.aclose()
    blockbuster.deactivate()
    second = StelloAgent(storage=str(db), model=model, tools=[ask])  # nothing cached
    blockbuster.activate()
    assert (await second.aresume(asks.id, "this one")).content == "ok"
    assert (await second.aarchive(other.id)).status == "archived"
    await second.aclose()


async def test_a_sync_only_store_is_written_off_the_loop(
    tmp_path: Path, blockbuster: BlockBuster
) -> None:
    """A `SqliteStore` has no async API: the insights a tree integration pushes and the one
    a turn consumes are mirrored through its sync API in a worker thread."""
    import sqlite3

    from langgraph.store.sqlite import SqliteStore

    blockbuster.deactivate()  # the constructors are sync
    conn = sqlite3.connect(tmp_path / "store.db", check_same_thread=False, isolation_level=None)
    store = SqliteStore(conn)
    store.setup()
    pushed: dict[str, str] = {}

    def integrate(children: Any, synthesis: Any) -> IntegrationResult:
        pushed.update({child.session_id: "look here" for child in children})
        return IntegrationResult(synthesis="s", insights=dict(pushed))

    agent = StelloAgent(
        storage=str(tmp_path / "s.db"),
        model=ScriptedChatModel(default="ok"),
        consolidate_fn=lambda l2, records: f"{len(records)} records",
        integrate_fn=integrate,
        store=store,
    )
    blockbuster.activate()
    node = await agent.afork(agent.main_session_id, "Child")
    await agent.aturn(node.id, "hi")
    await agent.aconsolidate(node.id)
    await agent.aintegrate(mode="tree")
    blockbuster.deactivate()
    insights = ("stello", "default", "insights")
    assert pushed == {node.id: "look here"}
    assert store.get(insights, node.id) is not None
    blockbuster.activate()
    await agent.aturn(node.id, "again")  # shows the insight, which is consumed
    blockbuster.deactivate()
    assert store.get(insights, node.id) is None
    assert agent.failures() == []
    agent.close()
    conn.close()
