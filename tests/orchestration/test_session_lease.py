"""The session lease: turns on one session are serialised wherever they come from.

Threads running the compiled graph directly, two agents on one file, tools acting on their
own session, holders that died or lost their lease (see `stello_graph.lease`).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt

from stello_graph import (
    InvalidInputError,
    LeaseLostError,
    MainSession,
    ModelCallError,
    SessionArchivedError,
    SessionBusyError,
    SessionNotFoundError,
    StelloAgent,
    build_stello_graph,
)
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.lease import Handback, SessionLeases
from stello_graph.models import Lease, SessionMeta
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel
from tests.conftest import BACKENDS, open_storage
from tests.orchestration.conftest import AgentFactory

INSIGHT = "INSIGHT-41"


def _reporting(
    latency: float = 0.05, hook: Callable[[list[BaseMessage]], None] | None = None
) -> ScriptedChatModel:
    """A model whose reply says how much history it saw and whether the insight was shown."""

    def respond(prompt: list[BaseMessage]) -> str:
        if hook is not None:
            hook(prompt)
        system = prompt[0].text if isinstance(prompt[0], SystemMessage) else ""
        history = [m for m in prompt[:-1] if not isinstance(m, SystemMessage)]
        return f"saw={len(history)} insight={INSIGHT in system}"

    return ScriptedChatModel(respond=respond, latency=latency)


def _replies(storage: MainStorage, sid: str) -> list[str]:
    return [m.text for m in storage.list_records(sid, role="ai")]


def _check_serialised(storage: MainStorage, sid: str, turns: int) -> None:
    """Every turn saw every turn committed before it, and the insight reached one turn."""
    replies = _replies(storage, sid)
    assert [r.split()[0] for r in replies] == [f"saw={2 * k}" for k in range(turns)], replies
    assert sum(r.endswith("insight=True") for r in replies) == 1, replies
    assert storage.get_insight(sid) is None
    assert storage.get_lease(sid) is None


@pytest.fixture(params=BACKENDS)
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MainStorage]:
    with open_storage(request.param, tmp_path) as made:
        yield made


# -- the storage primitives -----------------------------------------------------------------
def test_lease_primitives(storage: MainStorage) -> None:
    storage.put_session(SessionMeta(id="s", label="S"))
    first = storage.acquire_lease("s", "a", 30)
    assert first is not None and first.token == 1 and first.owner == "a"
    assert storage.acquire_lease("s", "b", 30) is None  # held by another
    again = storage.acquire_lease("s", "a", 30)
    assert again is not None and again.token == 1  # the owner renews, keeping its token
    assert storage.renew_lease(first, 30) is not None
    storage.check_lease(first)
    assert storage.release_lease(first) and storage.get_lease("s") is None
    taken = storage.acquire_lease("s", "b", 30)
    assert taken is not None and taken.token == 2  # a new owner gets a new token
    with pytest.raises(LeaseLostError):
        storage.check_lease(first)
    assert storage.renew_lease(first, 30) is None
    assert not storage.release_lease(first)  # a lost lease frees nothing
    stolen = storage.acquire_lease("s", "c", 30, replace="b")
    assert stolen is not None and stolen.token == 3
    assert storage.get_lease("s") == stolen
    with pytest.raises(SessionNotFoundError):
        storage.acquire_lease("missing", "a", 30)


async def test_hold_with_prefetch_reads_an_active_session_with_its_lease(
    storage: MainStorage,
) -> None:
    storage.put_session(SessionMeta(id="s1", label="One"))
    storage.put_insight("s1", INSIGHT)
    leases = SessionLeases(storage)
    back = Handback()
    with leases.hold("s1", handback=back, prefetch=True) as lease:
        assert storage.get_lease("s1") == lease
        assert back.prefetched == storage.read_session("s1")
    async with leases.ahold("s1", handback=back, prefetch=True):
        assert back.take_prefetched().insight == INSIGHT
    assert storage.get_lease("s1") is None
    storage.put_session(SessionMeta(id="s1", label="One", status="archived"))
    with (
        pytest.raises(SessionArchivedError, match="refuses a turn"),
        leases.hold("s1", handback=back, prefetch=True),
    ):
        pass
    with pytest.raises(SessionNotFoundError):
        async with leases.ahold("missing", handback=back, prefetch=True):
            pass
    assert storage.get_lease("s1") is None and back.prefetched is None
    with pytest.raises(InvalidInputError, match="handback"), leases.hold("s1", prefetch=True):
        pass


def test_an_expired_lease_is_free(storage: MainStorage) -> None:
    storage.put_session(SessionMeta(id="s", label="S"))
    assert storage.acquire_lease("s", "a", 0.05) is not None
    time.sleep(0.1)
    taken = storage.acquire_lease("s", "b", 30)
    assert taken is not None and taken.token == 2


async def test_lease_primitives_async(storage: MainStorage) -> None:
    await storage.aput_session(SessionMeta(id="s", label="S"))
    lease = await storage.aacquire_lease("s", "a", 30)
    assert lease is not None
    assert await storage.aacquire_lease("s", "b", 30) is None
    assert await storage.arenew_lease(lease, 30) is not None
    await storage.acheck_lease(lease)
    assert await storage.aget_lease("s") is not None
    assert await storage.arelease_lease(lease)
    assert await storage.aget_lease("s") is None


# -- an asker that gives up frees its place -------------------------------------------------
# The first asker refused keeps the next-to-hold place for a moment (so a holder turning again
# at once cannot starve it); one that stops asking must not keep the others out meanwhile.
def test_a_never_held_lease_frees_only_its_owners_place(storage: MainStorage) -> None:
    storage.put_session(SessionMeta(id="s", label="S"))
    held = storage.acquire_lease("s", "a", 30)
    assert held is not None
    assert storage.acquire_lease("s", "b", 30) is None  # b keeps the place
    assert not storage.release_lease(Lease("s", "c", 0, 0.0))  # c has no place to free
    storage.release_lease(held)
    assert storage.acquire_lease("s", "c", 30) is None  # b's place keeps c out
    assert not storage.release_lease(Lease("s", "b", 0, 0.0))  # no lease freed...
    assert storage.get_lease("s") is None
    taken = storage.acquire_lease("s", "c", 30)  # ...but the place is
    assert taken is not None and taken.token == 2
    assert not storage.release_lease(Lease("s", "c", 0, 0.0))  # a held lease is kept
    assert storage.get_lease("s") == taken


def test_a_waiter_that_gives_up_frees_its_place(storage: MainStorage) -> None:
    storage.put_session(SessionMeta(id="s", label="S"))
    holder = SessionLeases(storage, ttl=30)
    lease = holder.acquire("s")
    with pytest.raises(SessionBusyError):
        SessionLeases(storage, ttl=30, wait=0.05).acquire("s")
    holder.release(lease)
    taken = storage.acquire_lease("s", "other", 30)  # at once, not when the place lapses
    assert taken is not None


async def test_an_async_waiter_that_gives_up_frees_its_place(storage: MainStorage) -> None:
    await storage.aput_session(SessionMeta(id="s", label="S"))
    holder = SessionLeases(storage, ttl=30)
    lease = await holder.aacquire("s")
    with pytest.raises(SessionBusyError):
        await SessionLeases(storage, ttl=30, wait=0.05).aacquire("s")
    await holder.arelease(lease)
    assert await storage.aacquire_lease("s", "other", 30) is not None


async def test_a_cancelled_waiter_frees_its_place(storage: MainStorage) -> None:
    from stello_graph import lease as lease_module

    await storage.aput_session(SessionMeta(id="s", label="S"))
    holder = SessionLeases(storage, ttl=30)
    lease = await holder.aacquire("s")
    waiter = asyncio.create_task(SessionLeases(storage, ttl=30).aacquire("s"))
    await asyncio.sleep(0.05)  # it asked, was refused and waits
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.gather(*lease_module._pending_frees())  # the place is freed in the background
    await holder.arelease(lease)
    assert await storage.aacquire_lease("s", "other", 30) is not None


async def test_an_owner_that_asks_again_after_a_cancelled_wait_stays_live(
    storage: MainStorage,
) -> None:
    """A turn's node cancelled while it waits, then resumed at once, asks again with the
    owner of its state: freeing the cancelled ask's place in the background must not mark
    that owner as gone, or another asker of this process would take its lease over."""
    from stello_graph import lease as lease_module
    from stello_graph.lease import new_owner, owner_is_dead

    await storage.aput_session(SessionMeta(id="s", label="S"))
    leases = SessionLeases(storage, ttl=30)
    holder = await leases.aacquire("s")
    owner = new_owner()
    waiter = asyncio.create_task(leases.aacquire("s", owner=owner))
    await asyncio.sleep(0.05)  # it asked, was refused and waits
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    again = asyncio.create_task(leases.aacquire("s", owner=owner))
    await asyncio.sleep(0.05)
    await leases.arelease(holder)
    mine = await again
    await asyncio.gather(*lease_module._pending_frees())
    assert not owner_is_dead(owner)
    with pytest.raises(SessionBusyError):
        await SessionLeases(storage, ttl=30, wait=0.2).aacquire("s")
    await leases.arelease(mine)


def test_an_interrupted_waiter_frees_its_place(
    storage: MainStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while waiting (here: raised by the wait) frees the place like a timeout."""
    from stello_graph import lease as lease_module

    storage.put_session(SessionMeta(id="s", label="S"))
    holder = SessionLeases(storage, ttl=30)
    lease = holder.acquire("s")

    class _Interrupting:
        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

        def wait(self, timeout: float) -> None:
            raise KeyboardInterrupt

    monkeypatch.setattr(lease_module, "_released", _Interrupting())
    with pytest.raises(KeyboardInterrupt):
        SessionLeases(storage, ttl=30).acquire("s")
    monkeypatch.undo()
    holder.release(lease)
    assert storage.acquire_lease("s", "other", 30) is not None


def test_the_lease_goes_with_its_session(storage: MainStorage) -> None:
    main = MainSession.create(storage)
    storage.put_session(SessionMeta(id="s", label="S"))
    from stello_graph.models import TopologyNode

    storage.put_node(TopologyNode(id="s", parent_id=main.id, label="S"))
    assert storage.acquire_lease("s", "a", 30) is not None
    storage.remove_node("s")
    storage.put_session(SessionMeta(id="s", label="S again"))
    fresh = storage.acquire_lease("s", "b", 30)
    assert fresh is not None  # nothing of the removed session's lease was left


# -- turns through the compiled graph, from several threads or tasks -------------------------
def _graph_setup(storage: MainStorage, model: ScriptedChatModel) -> tuple[Any, str]:
    main = MainSession.create(storage)
    graph = build_stello_graph(model, storage, builtin_tools=()).compile(
        checkpointer=InMemorySaver()
    )
    storage.put_insight(main.id, INSIGHT)
    return graph, main.id


def test_graph_runs_from_four_threads_are_serialised(storage: MainStorage) -> None:
    MainSession.create(storage)
    graph = build_stello_graph(_reporting(), storage, builtin_tools=()).compile(
        checkpointer=InMemorySaver()
    )
    child = "child"
    storage.put_session(SessionMeta(id=child, label="Child"))
    storage.put_insight(child, INSIGHT)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            config: RunnableConfig = {"configurable": {"thread_id": f"caller-{n}"}}
            graph.invoke({"session_id": child, "input": f"hello {n}"}, config)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    _check_serialised(storage, child, 4)


async def test_graph_runs_from_four_tasks_are_serialised(storage: MainStorage) -> None:
    MainSession.create(storage)
    graph = build_stello_graph(_reporting(), storage, builtin_tools=()).compile(
        checkpointer=InMemorySaver()
    )
    storage.put_session(SessionMeta(id="child", label="Child"))
    storage.put_insight("child", INSIGHT)

    async def run(n: int) -> None:
        config: RunnableConfig = {"configurable": {"thread_id": f"caller-{n}"}}
        await graph.ainvoke({"session_id": "child", "input": f"hello {n}"}, config)

    await asyncio.wait_for(asyncio.gather(*(run(n) for n in range(4))), 60)
    _check_serialised(storage, "child", 4)


def test_two_agents_on_one_file_are_serialised(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    with StelloAgent(model=_reporting(), storage=db, builtin_tools=()) as first:
        sid = first.fork(first.main_session_id, "Shared").id
        first.storage.put_insight(sid, INSIGHT)
        with StelloAgent(model=_reporting(), storage=db, builtin_tools=()) as second:
            errors: list[BaseException] = []

            def run(agent: StelloAgent, n: int) -> None:
                try:
                    for k in range(3):
                        agent.turn(sid, f"{n}-{k}")
                except BaseException as exc:
                    errors.append(exc)

            threads = [
                threading.Thread(target=run, args=(a, n)) for n, a in enumerate([first, second])
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert not errors, errors
        _check_serialised(first.storage, sid, 6)


# -- a holder that died, or lost its lease -----------------------------------------------------
def _turn_soon(agent: StelloAgent, sid: str) -> threading.Event:
    """Run a turn in a thread; the event is set when it returns."""
    done = threading.Event()

    def run() -> None:
        agent.turn(sid, "hi")
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_lease_of_a_dead_local_process_is_taken_over_at_once(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"), builtin_tools=(), lease_ttl=3600)
    sid = agent.fork(agent.main_session_id, "B").id
    owner = f"{socket.gethostname()}/{_dead_pid()}/crashed"
    assert agent.storage.acquire_lease(sid, owner, 3600) is not None
    done = _turn_soon(agent, sid)
    assert done.wait(30), "the turn waited for a holder that no longer exists"
    assert agent.storage.count_records(sid) == 2


def test_a_live_holder_is_waited_for_until_its_lease_expires(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"), builtin_tools=())
    sid = agent.fork(agent.main_session_id, "B").id
    assert agent.storage.acquire_lease(sid, "elsewhere/1/other", 1.0) is not None
    done = _turn_soon(agent, sid)
    assert not done.wait(0.3)
    assert agent.storage.count_records(sid) == 0  # nothing ran while the other held it
    assert done.wait(30)
    assert agent.storage.count_records(sid) == 2


def test_a_turn_that_lost_its_lease_commits_nothing(make_agent: AgentFactory) -> None:
    box: dict[str, Any] = {}

    def steal(prompt: list[BaseMessage]) -> None:
        storage: MainStorage = box["storage"]
        current = storage.get_lease(box["sid"])
        assert current is not None
        box["thief"] = storage.acquire_lease(box["sid"], "thief/1/x", 30, replace=current.owner)

    agent = make_agent(model=_reporting(latency=0, hook=steal), builtin_tools=())
    sid = agent.fork(agent.main_session_id, "B").id
    box.update(storage=agent.storage, sid=sid)
    with pytest.raises(LeaseLostError):
        agent.turn(sid, "hi")
    assert agent.storage.count_records(sid) == 0
    thief: Lease = box["thief"]
    assert agent.storage.get_lease(sid) == thief  # the loser released nothing of the thief's
    agent.storage.release_lease(thief)


def test_a_failed_turn_releases_the_lease(storage: MainStorage) -> None:
    graph, sid = _graph_setup(storage, ScriptedChatModel([RuntimeError("down")], default="ok"))
    config: RunnableConfig = {"configurable": {"thread_id": "t"}}
    with pytest.raises(ModelCallError):
        graph.invoke({"session_id": sid, "input": "hi"}, config)
    assert storage.get_lease(sid) is None
    other: RunnableConfig = {"configurable": {"thread_id": "other"}}
    assert graph.invoke({"session_id": sid, "input": "again"}, other)["content"] == "ok"


def test_an_interrupted_turn_releases_the_lease_and_resumes(storage: MainStorage) -> None:
    @tool
    def approve(action: str) -> str:
        """Ask a human to approve an action."""
        return str(interrupt({"action": action}))

    model = ScriptedChatModel(
        [ScriptedChatModel.tool_call("approve", {"action": "x"})], default="ok"
    )
    main = MainSession.create(storage)
    graph = build_stello_graph(model, storage, tools=[approve], builtin_tools=()).compile(
        checkpointer=InMemorySaver()
    )
    config: RunnableConfig = {"configurable": {"thread_id": "waiting"}}
    out = graph.invoke({"session_id": main.id, "input": "do x"}, config)
    assert out.get("__interrupt__")
    assert storage.get_lease(main.id) is None  # nobody waits for a human's answer
    other: RunnableConfig = {"configurable": {"thread_id": "other"}}
    assert graph.invoke({"session_id": main.id, "input": "meanwhile"}, other)["content"] == "ok"
    resumed = graph.invoke(Command(resume="yes"), config)
    assert resumed["content"] == "ok"
    assert storage.get_lease(main.id) is None
    assert storage.get_turn_count(main.id) == 2


# -- tools acting on their own session: a typed error at once, never a hang ------------------
def _turn_in_thread(agent: StelloAgent, sid: str) -> str:
    box: dict[str, Any] = {}
    worker = threading.Thread(
        target=lambda: box.setdefault("content", agent.turn(sid, "go").content), daemon=True
    )
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the turn hung"
    return str(box["content"])


def _acting_agent(
    make_agent: AgentFactory, act: Callable[[StelloAgent, str], Any]
) -> tuple[StelloAgent, str, ScriptedChatModel]:
    box: dict[str, Any] = {}

    @tool
    def act_on_session(note: str) -> str:
        """Act on the session this turn runs on."""
        return str(act(box["agent"], box["sid"]))

    model = ScriptedChatModel(
        [ScriptedChatModel.tool_call("act_on_session", {"note": "now"})], default="done"
    )
    agent = make_agent(model=model, tools=[act_on_session], builtin_tools=())
    sid = agent.fork(agent.main_session_id, "B").id
    box.update(agent=agent, sid=sid)
    return agent, sid, model


def _tool_result(agent: StelloAgent, sid: str) -> str:
    return [m.text for m in agent.storage.list_records(sid, role="tool")][-1]


def test_a_tool_archiving_its_own_session_fails_at_once(make_agent: AgentFactory) -> None:
    agent, sid, _ = _acting_agent(make_agent, lambda a, s: a.archive(s))
    assert _turn_in_thread(agent, sid) == "done"
    assert "SessionBusyError" in _tool_result(agent, sid)
    assert agent.storage.get_session(sid).status == "active"  # type: ignore[union-attr]
    agent.archive(sid)  # after the turn it works
    assert agent.storage.get_session(sid).status == "archived"  # type: ignore[union-attr]


def test_a_tool_asking_its_own_session_fails_at_once(make_agent: AgentFactory) -> None:
    agent, sid, _ = _acting_agent(make_agent, lambda a, s: a.as_tool(s).invoke({"question": "hi"}))
    assert _turn_in_thread(agent, sid) == "done"
    assert "SessionBusyError" in _tool_result(agent, sid)
    assert agent.storage.get_turn_count(sid) == 1


def test_a_tool_forking_its_own_session_works(make_agent: AgentFactory) -> None:
    agent, sid, _ = _acting_agent(make_agent, lambda a, s: a.fork(s, "Kid").id)
    assert _turn_in_thread(agent, sid) == "done"
    kids = agent.children(sid)
    assert [k.label for k in kids] == ["Kid"] and _tool_result(agent, sid) == kids[0].id


def test_sessions_asking_each_other_fail_at_once(make_agent: AgentFactory) -> None:
    box: dict[str, Any] = {}

    def respond(prompt: list[BaseMessage]) -> Any:
        last = prompt[-1]
        if isinstance(last, HumanMessage):  # A asks B; B, asked, asks A back
            name = "ask_b" if '"A"' in prompt[0].text else "ask_a"
            return ScriptedChatModel.tool_call(name, {"question": "what?"})
        return f"answered after: {last.text[:80]}"

    agent = make_agent(model=ScriptedChatModel(respond=respond), builtin_tools=())

    @tool
    def ask_a(question: str) -> str:
        """Ask session A."""
        return str(box["agent"].as_tool(box["a"]).invoke({"question": question}))

    b = agent.fork(agent.main_session_id, "B", tools=[ask_a]).id
    a = agent.fork(agent.main_session_id, "A", tools=[agent.as_tool(b)]).id
    box.update(agent=agent, a=a)
    content = _turn_in_thread(agent, a)
    assert content.startswith("answered after")
    assert agent.storage.get_lease(a) is None and agent.storage.get_lease(b) is None
    inner = [m.text for m in agent.storage.list_records(b, role="tool")]
    assert inner and "SessionBusyError" in inner[0]


def test_a_turn_inside_hold_fails_at_once(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"), builtin_tools=())
    sid = agent.fork(agent.main_session_id, "B").id
    with agent.hold(sid) as lease:
        assert agent.storage.get_lease(sid) == lease
        with pytest.raises(SessionBusyError):
            agent.turn(sid, "hi")
        with pytest.raises(SessionBusyError):
            agent.archive(sid)
    assert agent.storage.get_lease(sid) is None
    assert agent.turn(sid, "hi").content == "ok"


async def test_an_async_tool_archiving_its_own_session_fails_at_once(
    make_agent: AgentFactory,
) -> None:
    box: dict[str, Any] = {}

    @tool
    async def archive_me(note: str) -> str:
        """Archive the session this turn runs on."""
        return str(await box["agent"].aarchive(box["sid"]))

    model = ScriptedChatModel(
        [ScriptedChatModel.tool_call("archive_me", {"note": "now"})], default="done"
    )
    agent = make_agent(model=model, tools=[archive_me], builtin_tools=())
    sid = agent.fork(agent.main_session_id, "B").id
    box.update(agent=agent, sid=sid)
    result = await asyncio.wait_for(agent.aturn(sid, "go"), 30)
    assert result.content == "done"
    assert "SessionBusyError" in _tool_result(agent, sid)


def test_the_owner_of_a_lease_names_this_process(make_agent: AgentFactory) -> None:
    seen: list[Lease | None] = []
    agent = make_agent(model=ScriptedChatModel(default="ok"), builtin_tools=())
    sid = agent.fork(agent.main_session_id, "B").id
    with agent.hold(sid):
        seen.append(agent.storage.get_lease(sid))
    lease = seen[0]
    assert lease is not None
    host, pid, _ = lease.owner.split("/")
    assert host == socket.gethostname() and int(pid) == os.getpid()


def test_a_run_paused_between_nodes_parks_its_lease(storage: MainStorage) -> None:
    from stello_graph.nodes._lease import PARKED_LEASE

    @tool
    def noop() -> str:
        """Do nothing."""
        return "done"

    main = MainSession.create(storage)
    model = ScriptedChatModel([ScriptedChatModel.tool_call("noop", {}), "ok"])
    graph = build_stello_graph(model, storage, tools=[noop], builtin_tools=()).compile(
        checkpointer=InMemorySaver()
    )
    sid = main.id
    config: RunnableConfig = {"configurable": {"thread_id": "paused"}}
    graph.invoke({"session_id": sid, "input": "hi"}, config, interrupt_before=["tools"])
    lease = storage.get_lease(sid)
    assert lease is not None  # still the turn's, for the moment it takes to reach its tools
    assert lease.expires_at - time.time() <= PARKED_LEASE  # not a whole lease_ttl
    out = graph.invoke(None, config)  # continuing takes it again and commits
    assert out["content"] == "ok" and storage.get_lease(sid) is None
    assert storage.count_records(sid) == 4


def _slow_lease_writes(storage: SqliteMainStorage, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make the storage's worker pause for 0.3 s after writing a lease it takes, so its
    async caller can be cancelled while the worker is still on it. Returns the event set
    when the worker starts its pause."""
    writing = threading.Event()
    write = storage.op_set_fields

    def slow(session_id: str, values: dict[str, Any]) -> Any:
        done = write(session_id, values)
        if values.get("lease_owner") is not None and not writing.is_set():
            writing.set()
            time.sleep(0.3)
        return done

    monkeypatch.setattr(storage, "op_set_fields", slow)
    return writing


@pytest.mark.parametrize("prefetch", [True, False], ids=["turn", "lease-only"])
async def test_a_take_cancelled_while_the_storage_runs_frees_what_it_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefetch: bool
) -> None:
    """On SQLite the lease is taken in the storage's worker thread, which cannot be stopped:
    a caller cancelled meanwhile still gets its cancellation, and the lease the worker took
    is freed (not held by a gone owner until the ttl lapses)."""
    storage = SqliteMainStorage(tmp_path / "lease.db")
    storage.put_session(SessionMeta(id="s", label="S"))
    leases = SessionLeases(storage, ttl=60)
    writing = _slow_lease_writes(storage, monkeypatch)
    into = Handback() if prefetch else None
    task = asyncio.create_task(leases.aacquire("s", into=into))
    assert await asyncio.to_thread(writing.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):  # freed in the background, at once
        if storage.get_lease("s") is None:
            break
        await asyncio.sleep(0.01)
    assert storage.get_lease("s") is None
    lease = await leases.aacquire("s")  # free for anyone
    await leases.arelease(lease)
    storage.close()


async def test_an_owner_asking_again_keeps_what_it_takes_after_a_cancelled_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take cancelled while the worker took the lease frees it in the background; the same
    owner asking again at once (a turn's node resumed) would renew that lease, keeping its
    token, and a free arriving after the renewal would release it. The ask waits for its
    owner's pending frees, whatever order the storage runs its calls in (here the free is
    made slower than the ask, as a connection pool may)."""
    from stello_graph.lease import new_owner

    storage = SqliteMainStorage(tmp_path / "lease.db")
    storage.put_session(SessionMeta(id="s", label="S"))
    leases = SessionLeases(storage, ttl=60)
    writing = _slow_lease_writes(storage, monkeypatch)
    release = storage.arelease_lease

    async def slow_release(lease: Lease) -> bool:
        await asyncio.sleep(0.3)
        return await release(lease)

    monkeypatch.setattr(storage, "arelease_lease", slow_release)
    owner = new_owner()
    task = asyncio.create_task(leases.aacquire("s", owner=owner))
    assert await asyncio.to_thread(writing.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    mine = await leases.aacquire("s", owner=owner)  # at once, the same owner
    from stello_graph import lease as lease_module

    await asyncio.gather(*lease_module._pending_frees())
    assert storage.get_lease("s") == mine  # still held: no late free released it
    await leases.arelease(mine)
    storage.close()


async def test_a_take_cancelled_while_it_waits_for_the_storage_ends_at_once(
    tmp_path: Path,
) -> None:
    """A take waiting for the storage (another task's transaction holds it) is cancelled at
    once: a timeout around it fires on time, and it took nothing."""
    storage = SqliteMainStorage(tmp_path / "lease.db")
    storage.put_session(SessionMeta(id="s", label="S"))
    leases = SessionLeases(storage, ttl=60)
    inside, leave = asyncio.Event(), asyncio.Event()

    async def hold_the_storage() -> None:
        async with storage.atransaction():
            inside.set()
            await leave.wait()

    holder = asyncio.create_task(hold_the_storage())
    await inside.wait()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await leases.aacquire("s")
    assert time.monotonic() - started < 1.0
    leave.set()
    await holder
    assert storage.get_lease("s") is None
    storage.close()
