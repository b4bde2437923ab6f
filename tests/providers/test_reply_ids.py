"""Reply ids come from the provider; a turn must not depend on them being unique."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from stello_graph import StelloAgent
from stello_graph._context import sanitize_history
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.testing import ScriptedChatModel


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_replies_reusing_one_id_keep_the_whole_turn() -> None:
    call = {"name": "add", "args": {"a": 1, "b": 2}, "id": "call-1", "type": "tool_call"}
    model = ScriptedChatModel(
        [
            AIMessage(content="", id="resp-1", tool_calls=[call]),
            AIMessage(content="3", id="resp-1"),  # the same response id again
        ]
    )
    with StelloAgent(model=model, storage=InMemoryMainStorage(), tools=[add]) as agent:
        sid = agent.main_session_id
        assert agent.turn(sid, "1 + 2?").content == "3"
        records = agent.session(sid).messages()
    assert [type(m) for m in records] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    assert records[1].id == "resp-1" and records[3].id != "resp-1"
    assert [m.text for m in records[2:]] == ["3", "3"]
    assert sanitize_history(records) == records
