"""The stello graph served by `langgraph dev`, driven with `langgraph-sdk` as a client would.

Threads, runs, the stream modes `values` / `updates` / `messages` / `custom`, an interrupt
and its resume, two trees kept apart, stello errors reaching the client by name, and no
blocking call on the server's event loop. Run with `make test-server`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.schema import Command, Config, StreamMode

from tests._docs import Example, examples_needing, same_output
from tests.server.conftest import MAX_OPEN_TREES
from tests.server.langgraph_dev import DevServer

pytestmark = pytest.mark.server

GRAPH = "stello"


def tree(name: str, **configurable: Any) -> Config:
    return {"configurable": {"tree_id": name, **configurable}}


def ask(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


async def stream(
    client: LangGraphClient, thread: str, payload: Any, config: Config, modes: list[StreamMode]
) -> list[tuple[str, Any]]:
    parts: list[tuple[str, Any]] = []
    async for part in client.runs.stream(
        thread,
        GRAPH,
        input=payload,
        config=config,
        stream_mode=modes,
    ):
        parts.append((part.event, part.data))
    return parts


def errors(parts: list[tuple[str, Any]]) -> list[Any]:
    return [data for event, data in parts if event == "error"]


async def new_thread(client: LangGraphClient) -> str:
    return str((await client.threads.create())["thread_id"])


async def test_schemas_are_published(client: LangGraphClient) -> None:
    [assistant] = await client.assistants.search(graph_id=GRAPH)
    schemas = await client.assistants.get_schemas(assistant["assistant_id"])
    inputs, outputs = schemas["input_schema"], schemas["output_schema"]
    assert inputs is not None and outputs is not None
    assert {"messages", "session_id", "input", "op"} <= set(inputs["properties"])
    assert {"content", "messages"} <= set(outputs["properties"])
    context = schemas["context_schema"]
    assert context is not None and {"tree_id", "session_id"} <= set(context["properties"])


async def test_a_turn_asked_as_messages(client: LangGraphClient) -> None:
    thread = await new_thread(client)
    out = await client.runs.wait(thread, GRAPH, input=ask("Hello"), config=tree("messages"))
    assert isinstance(out, dict)
    assert out["content"] == "(scripted) You said: Hello"
    kinds = [m["type"] for m in out["messages"]]
    assert kinds == ["human", "ai"]
    assert out["messages"][-1]["content"] == out["content"]
    assert out["turn_count"] == 1


async def test_a_runs_input_does_not_carry_over(client: LangGraphClient) -> None:
    thread, config = await new_thread(client), tree("carry-over")
    first = await client.runs.wait(thread, GRAPH, input=ask("Hi"), config=config)
    assert isinstance(first, dict)
    main = first["session_id"]
    forked = await client.runs.wait(
        thread, GRAPH, input={"op": "fork", "session_id": main, "fork": {"label": "Pricing"}},
        config=config,
    )  # fmt: skip
    assert isinstance(forked, dict)
    child = forked["forked"]["session_id"]
    assert "content" not in forked  # the turn's reply is not this run's
    turn = await client.runs.wait(
        thread, GRAPH, input={"session_id": child, "input": "Free tier?"}, config=config
    )
    assert isinstance(turn, dict) and turn["session_id"] == child
    # no session_id this time: the thread's session, not the child the previous run named
    again = await client.runs.wait(thread, GRAPH, input=ask("Back"), config=config)
    assert isinstance(again, dict)
    assert again["session_id"] == main and again["turn_count"] == 2
    parts = await stream(client, thread, {"op": "consolidate"}, config, ["values"])
    [error] = errors(parts)
    assert error["error"] == "InvalidInputError"
    assert "session_id" in error["message"]


async def test_configurable_session_id_picks_the_session(client: LangGraphClient) -> None:
    thread, config = await new_thread(client), tree("configured")
    first = await client.runs.wait(thread, GRAPH, input=ask("Hi"), config=config)
    assert isinstance(first, dict)
    forked = await client.runs.wait(
        thread, GRAPH, input={"op": "fork", "session_id": first["session_id"],
                              "fork": {"label": "Side"}}, config=config,
    )  # fmt: skip
    assert isinstance(forked, dict)
    child = forked["forked"]["session_id"]
    out = await client.runs.wait(
        thread, GRAPH, input=ask("On the side"), config=tree("configured", session_id=child)
    )
    assert isinstance(out, dict) and out["session_id"] == child and out["turn_count"] == 1


def said(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["type"], m["content"]) for m in messages]


async def test_a_thread_is_a_conversation(client: LangGraphClient) -> None:
    config = tree("threads")
    first = await new_thread(client)
    for text in ("apple", "banana"):
        await client.runs.wait(first, GRAPH, input=ask(text), config=config)
    both = [
        ("human", "apple"), ("ai", "(scripted) You said: apple"),
        ("human", "banana"), ("ai", "(scripted) You said: banana"),
    ]  # fmt: skip
    state = await client.threads.get_state(first)
    assert said(state["values"]["messages"]) == both  # type: ignore[call-overload]
    # a second thread's first prompt holds none of the first thread's conversation
    second = await new_thread(client)
    out = await client.runs.wait(second, GRAPH, input=ask("/prompt"), config=config)
    assert isinstance(out, dict)
    assert out["content"] == "(scripted) I was sent: nothing before this"
    assert out["session_id"] != state["values"]["session_id"]  # type: ignore[call-overload]
    # reopening the first thread shows its whole conversation, and it goes on from there
    again = await client.threads.get_state(first)
    assert said(again["values"]["messages"]) == both  # type: ignore[call-overload]
    [latest, *_] = await client.threads.get_history(first)
    assert said(latest["values"]["messages"]) == both  # type: ignore[call-overload]
    back = await client.runs.wait(first, GRAPH, input=ask("/prompt"), config=config)
    assert isinstance(back, dict)
    assert back["content"] == "(scripted) I was sent: apple | banana"


async def test_the_run_context_names_the_session(client: LangGraphClient) -> None:
    thread = await new_thread(client)
    first = await client.runs.wait(thread, GRAPH, input=ask("Hi"), config=tree("context"))
    assert isinstance(first, dict)
    fork = {"op": "fork", "session_id": first["session_id"], "fork": {"label": "Side"}}
    forked = await client.runs.wait(thread, GRAPH, input=fork, config=tree("context"))
    assert isinstance(forked, dict)
    child = forked["forked"]["session_id"]
    other = await new_thread(client)
    context = {"tree_id": "context", "session_id": child}
    out = await client.runs.wait(other, GRAPH, input=ask("On the side"), context=context)
    assert isinstance(out, dict) and out["session_id"] == child and out["turn_count"] == 1
    # the thread is bound to it: a run naming no session continues it
    more = await client.runs.wait(other, GRAPH, input=ask("More"), context={"tree_id": "context"})
    assert isinstance(more, dict) and more["session_id"] == child and more["turn_count"] == 2


async def test_stream_modes(client: LangGraphClient) -> None:
    thread = await new_thread(client)
    parts = await stream(
        client, thread, ask("stream these words"), tree("streams"),
        ["values", "updates", "messages-tuple", "custom"],
    )  # fmt: skip
    assert not errors(parts)
    events = {event.split("|")[0] for event, _ in parts}
    assert {"values", "updates", "custom"} <= events
    tokens = [data for event, data in parts if event == "messages"]
    assert tokens, "the model's tokens are streamed"
    for message, metadata in tokens:
        assert message["type"] == "AIMessageChunk", message  # no echo, no RemoveMessage
        assert metadata["langgraph_node"] == "model"
    text = "".join(message["content"] for message, _ in tokens)
    assert text == "(scripted) You said: stream these words"
    custom = [data["event"] for event, data in parts if event == "custom"]
    assert custom[:2] == ["session_forked", "turn_started"] and "turn_committed" in custom
    updated = {node for event, data in parts if event == "updates" for node in data}
    assert {"enter", "model"} <= updated  # the first model round opens the turn, the last commits
    last_values = [data for event, data in parts if event == "values"][-1]
    assert last_values["content"] == text


async def test_interrupt_and_resume(client: LangGraphClient) -> None:
    thread, config = await new_thread(client), tree("interrupts")
    parts = await stream(
        client, thread, ask('/call approve {"action": "deploy"}'), config, ["updates", "custom"]
    )
    assert not errors(parts)
    state = await client.threads.get_state(thread)
    [waiting] = [i for task in state["tasks"] for i in task["interrupts"]]
    assert waiting["value"] == {"approve": "deploy"}
    calls = [d for e, d in parts if e == "custom" and d["event"] == "tool_call"]
    assert calls and calls[0]["name"] == "approve"
    out = await client.runs.wait(thread, GRAPH, command=Command(resume="yes"), config=config)
    assert isinstance(out, dict)
    assert out["content"] == "(scripted) approve returned: deploy: yes"
    assert [m["type"] for m in out["messages"]] == ["human", "ai", "tool", "ai"]
    assert not (await client.threads.get_state(thread))["next"]


async def test_two_trees_are_isolated(client: LangGraphClient) -> None:
    alice, bob = await new_thread(client), await new_thread(client)
    one = await client.runs.wait(alice, GRAPH, input=ask("a1"), config=tree("alice"))
    two = await client.runs.wait(alice, GRAPH, input=ask("a2"), config=tree("alice"))
    other = await client.runs.wait(bob, GRAPH, input=ask("b1"), config=tree("bob"))
    assert isinstance(one, dict) and isinstance(two, dict) and isinstance(other, dict)
    assert one["session_id"] == two["session_id"] != other["session_id"]
    assert (two["turn_count"], other["turn_count"]) == (2, 1)
    # alice's sessions are not bob's: a turn on alice's main session in bob's tree fails
    parts = await stream(
        client, bob, {"session_id": one["session_id"], "input": "x"}, tree("bob"), ["values"]
    )
    [error] = errors(parts)
    assert error["error"] == "SessionNotFoundError"


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def test_many_tree_ids_keep_few_trees_open(
    client: LangGraphClient, dev_server: DevServer
) -> None:
    """Twelve trees with three kept open: each is closed and reopened with its turns, an
    interrupted turn resumes in a reopened tree, and the server's open files do not grow
    with every tree it served (two more each, when every tree stayed open)."""
    names = [f"many-{n}" for n in range(12)]
    threads = {name: await new_thread(client) for name in names}
    interrupted = await new_thread(client)
    call = ask('/call approve {"action": "ship"}')
    await client.runs.wait(interrupted, GRAPH, input=call, config=tree(names[0]))
    for name in names[:MAX_OPEN_TREES]:
        await client.runs.wait(threads[name], GRAPH, input=ask("one"), config=tree(name))
    files = open_files(dev_server.pid)
    for name in names[MAX_OPEN_TREES:]:
        await client.runs.wait(threads[name], GRAPH, input=ask("one"), config=tree(name))
    assert open_files(dev_server.pid) < files + len(names) - MAX_OPEN_TREES
    for name in names:  # each was closed since its first turn, and reopens
        out = await client.runs.wait(threads[name], GRAPH, input=ask("two"), config=tree(name))
        assert isinstance(out, dict) and out["turn_count"] == 2, out
    done = await client.runs.wait(
        interrupted, GRAPH, command=Command(resume="yes"), config=tree(names[0])
    )
    assert isinstance(done, dict) and done["content"] == "(scripted) approve returned: ship: yes"


async def test_stello_errors_reach_the_client(client: LangGraphClient) -> None:
    thread = await new_thread(client)
    parts = await stream(
        client, thread, {"session_id": "no-such-session", "input": "x"}, tree("errors"), ["values"]
    )
    [error] = errors(parts)
    assert error["error"] == "SessionNotFoundError"
    assert "no-such-session" in error["message"]
    parts = await stream(client, thread, {"messages": "not a list"}, tree("errors"), ["values"])
    [error] = errors(parts)
    assert error["error"] == "InvalidInputError"


async def test_memory_reaches_the_servers_store(client: LangGraphClient) -> None:
    thread, config = await new_thread(client), tree("memory")
    first = await client.runs.wait(thread, GRAPH, input=ask("Hi"), config=config)
    assert isinstance(first, dict)
    children = []
    for label in ("Pricing", "Hiring"):
        out = await client.runs.wait(
            thread, GRAPH, input={"op": "fork", "session_id": first["session_id"],
                                  "fork": {"label": label}}, config=config,
        )  # fmt: skip
        assert isinstance(out, dict)
        sid = out["forked"]["session_id"]
        children.append(sid)
        turn = {"session_id": sid, "input": f"about {label}"}
        await client.runs.wait(thread, GRAPH, input=turn, config=config)
        done = await client.runs.wait(
            thread, GRAPH, input={"op": "consolidate", "session_id": sid}, config=config
        )
        assert isinstance(done, dict) and "about" in done["l2"]
    await client.runs.wait(thread, GRAPH, input={"op": "integrate"}, config=config)
    pricing = children[0]
    l2 = await client.store.get_item(["stello", "memory", "l2"], key=pricing)
    assert l2 is not None and "about Pricing" in l2["value"]["l2"]
    insight = await client.store.get_item(["stello", "memory", "insights"], key=pricing)
    assert insight is not None and "Hiring" in insight["value"]["insight"]
    # the next turn on the branch shows the insight and consumes it, in the store too
    turn = {"session_id": pricing, "input": "and now?"}
    out = await client.runs.wait(thread, GRAPH, input=turn, config=config)
    assert isinstance(out, dict) and "insight" in out["content"]
    for _ in range(50):  # bounded: the deletion may be the loop's task
        if await client.store.get_item(["stello", "memory", "insights"], key=pricing) is None:
            break
        await asyncio.sleep(0.1)
    assert await client.store.get_item(["stello", "memory", "insights"], key=pricing) is None


async def test_time_travel_branches_the_thread(client: LangGraphClient) -> None:
    thread, config = await new_thread(client), tree("time-travel")
    for text in ("one", "two", "three"):
        await client.runs.wait(thread, GRAPH, input=ask(text), config=config)
    history = await client.threads.get_history(thread, limit=50)
    ends = [s for s in history if not s["next"]]  # newest first
    after_one = ends[-1]["checkpoint"]["checkpoint_id"]
    # Studio's edit of the second message: a run from the checkpoint after the first turn
    await client.runs.wait(
        thread, GRAPH, input=ask("two, edited"), config=config, checkpoint_id=after_one
    )
    back = await client.runs.wait(thread, GRAPH, input=ask("/prompt"), config=config)
    assert isinstance(back, dict)  # the thread goes on on the branch, which forgot "two"
    assert back["content"] == "(scripted) I was sent: one | two, edited"
    state = await client.threads.get_state(thread)
    assert said(state["values"]["messages"])[2] == ("human", "two, edited")  # type: ignore[call-overload]
    # Studio's fork: an edit of `messages` at a checkpoint between turns, then a run from it
    edited = await client.threads.update_state(thread, {"messages": []}, checkpoint_id=after_one)
    again = await client.runs.wait(
        thread, GRAPH, input=ask("/prompt"), config=config,
        checkpoint_id=edited["checkpoint"]["checkpoint_id"],
    )  # fmt: skip
    assert isinstance(again, dict) and again["content"] == "(scripted) I was sent: one"
    # the middle of a turn cannot be branched from: refused, by name, before anything runs
    mid_turn = next(s for s in history if s["next"] == ["model"])
    parts: list[tuple[str, Any]] = []
    async for part in client.runs.stream(
        thread, GRAPH, input=None, config=config,
        checkpoint_id=mid_turn["checkpoint"]["checkpoint_id"],
    ):  # fmt: skip
        parts.append((part.event, part.data))
    [error] = errors(parts)
    assert error["error"] == "TimeTravelError" and "at_turn" in error["message"]
    with pytest.raises(Exception, match=r"update_state"):
        await client.threads.update_state(thread, {"content": "edited"})


def docs_client() -> Example:
    """The docs' `langgraph-sdk` client (the example of the server guide marked `server`)."""
    [example] = examples_needing("server")
    return example


async def test_turns_through_the_server_are_consolidated_in_the_background(
    client: LangGraphClient, dev_server: DevServer
) -> None:
    from stello_graph.checkpoints import SqliteMainStorage
    from stello_graph.server import DEFAULT_CONSOLIDATE_EVERY

    thread, config = await new_thread(client), tree("background")
    first = await client.runs.wait(thread, GRAPH, input=ask("Hi"), config=config)
    assert isinstance(first, dict)
    fork = {"op": "fork", "session_id": first["session_id"], "fork": {"label": "Notes"}}
    forked = await client.runs.wait(thread, GRAPH, input=fork, config=config)
    assert isinstance(forked, dict)
    child = forked["forked"]["session_id"]
    for n in range(DEFAULT_CONSOLIDATE_EVERY):  # the server's default schedule
        turn = {"session_id": child, "input": f"note {n}"}
        assert isinstance(await client.runs.wait(thread, GRAPH, input=turn, config=config), dict)
    database = dev_server.log.parent / "trees.db"  # the suite's STELLO_DATABASE_URI
    with SqliteMainStorage(database, tree_id="background") as storage:
        memory = storage.get_memory(child)
        for _ in range(150):  # the worker's scheduler writes it soon after the 8th turn
            if memory is not None:
                break
            await asyncio.sleep(0.2)
            memory = storage.get_memory(child)
    assert memory is not None and "note" in memory


def test_the_docs_client(dev_server: DevServer, capsys: pytest.CaptureFixture[str]) -> None:
    example = docs_client()
    assert example.output is not None and "http://127.0.0.1:2024" in example.code
    code = example.code.replace("http://127.0.0.1:2024", dev_server.url)
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    try:
        exec(compile(code, example.name, "exec"), namespace)
    finally:  # the snippet leaves its client open: close its socket here, not in the GC
        if "client" in namespace:
            namespace["client"].http.client.close()
    assert same_output(capsys.readouterr().out, example.output)


def test_no_blocking_call_on_the_event_loop(dev_server: DevServer) -> None:
    """Run last in this module: every run above went through the server's checker."""
    found = dev_server.blocking_calls()
    assert not found, f"{len(found)} blocking call(s) on the event loop:\n\n" + "\n\n".join(
        found[:3]
    )
