"""Every L3 record carries the turn that wrote it (`turn_id`) and its place in it (`turn_seq`).

The branching work relies on them, and the commit's idempotency check looks the turn id up
instead of scanning L3.
"""

from __future__ import annotations

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.types import interrupt

from stello_graph import MainSession, Session
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory, lose_last_checkpoint

TURN_ID, TURN_SEQ = "stello_turn_id", "stello_turn_seq"


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def turns(messages: list[BaseMessage]) -> list[tuple[str, int]]:
    return [(m.response_metadata[TURN_ID], m.response_metadata[TURN_SEQ]) for m in messages]


def test_a_turn_with_tool_rounds_is_numbered_from_zero(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(
        [
            ScriptedChatModel.tool_call("add", {"a": 1, "b": 2}),
            ScriptedChatModel.tool_call("add", {"a": 3, "b": 4}),
            "done",
            "plain",
        ]
    )
    agent = make_agent(model=model, tools=[add])
    branch = agent.fork(agent.main_session_id, "Math")
    agent.turn(branch.id, "compute")
    agent.turn(branch.id, "again")
    found = turns(agent.session(branch.id).messages())
    first, second = found[:6], found[6:]
    assert [seq for _, seq in first] == [0, 1, 2, 3, 4, 5]
    assert [seq for _, seq in second] == [0, 1]
    assert len({tid for tid, _ in first}) == 1 and len({tid for tid, _ in second}) == 1
    assert first[0][0] != second[0][0]
    human = agent.session(branch.id).messages()[0]
    assert human.id == first[0][0]  # a graph turn's id is its user message's


async def test_the_async_turn_numbers_records_alike(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("add", {"a": 1, "b": 2}), "3"])
    agent = make_agent(model=model, tools=[add])
    sid = agent.main_session_id
    await agent.aturn(sid, "compute")
    messages = await agent.session(sid).amessages()
    assert [seq for _, seq in turns(messages)] == [0, 1, 2, 3]
    assert turns(await agent.session(sid).amessages(role="ai")) == [
        turns(messages)[1],
        turns(messages)[3],
    ]


def test_turn_ids_are_not_sent_to_the_model(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(default="ok")
    agent = make_agent(model=model)
    sid = agent.main_session_id
    agent.turn(sid, "one")
    agent.turn(sid, "two")
    prompt = model.calls[-1].messages
    assert all(TURN_ID not in m.additional_kwargs for m in prompt)
    assert all(TURN_ID not in m.response_metadata for m in prompt)


def test_a_resumed_turn_keeps_its_ids(make_agent: AgentFactory) -> None:
    @tool
    def approve(what: str) -> str:
        """Ask a human."""
        return str(interrupt(what))

    model = ScriptedChatModel([ScriptedChatModel.tool_call("approve", {"what": "x"}), "ok"])
    agent = make_agent(model=model, tools=[approve])
    sid = agent.main_session_id
    assert agent.turn(sid, "go").interrupted
    agent.resume(sid, "yes")
    found = turns(agent.session(sid).messages())
    assert [seq for _, seq in found] == [0, 1, 2, 3]
    assert len({tid for tid, _ in found}) == 1


def test_a_replayed_commit_is_found_by_its_turn_id(make_agent: AgentFactory) -> None:
    agent = make_agent(  # every step on disk (kept, "exit": only its last step)
        model=ScriptedChatModel(["reply", "other"]), prune_checkpoints=False, durability="sync"
    )
    sid = agent.main_session_id
    agent.turn(sid, "question")
    config = agent.config(sid)
    lose_last_checkpoint(agent, sid)  # a crash between the step's commit and its checkpoint
    turn_id = agent.session(sid).messages()[0].response_metadata["stello_turn_id"]
    storage = agent.storage
    assert storage.has_turn(sid, turn_id)
    # another writer appends after the turn: the replayed step still finds it
    agent.storage.append_records(sid, [HumanMessage("later"), AIMessage("later too")])
    out = agent.graph.invoke(None, config)
    assert out["content"] == "reply"  # the stored reply: the model was not called again
    contents = [m.content for m in agent.session(sid).messages()]
    assert contents == ["question", "reply", "later", "later too"]
    assert not storage.has_turn(sid, "no-such-turn")


def test_session_send_and_copies_keep_their_turns() -> None:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage, model=ScriptedChatModel(default="ok"))
    child = Session.create(storage, label="c", model=ScriptedChatModel(default="x"))
    child.send("one")
    child.send("two")
    found = child.messages()
    assert [seq for _, seq in turns(found)] == [0, 1, 0, 1]
    # records read back and appended elsewhere keep the turns they carry
    storage.append_records(main.id, found)
    assert turns(main.messages()) == turns(found)
    assert all(TURN_ID not in m.response_metadata for m in storage.list_records(main.id))
