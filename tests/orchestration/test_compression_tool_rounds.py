"""One graph turn compresses at most once: its tool rounds reuse the cut of its first call.

The turn's own records are committed only at its end, so on a tool round the newest reply
in L3 is still the previous turn's, whose usage figure measured the prompt before the cut;
judging the cut history by it would cut again and keep fewer turns than the budget allows.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool

from stello_graph import StelloAgent
from stello_graph.compression import CompressionPolicy, estimate_tokens
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory

WINDOW, THRESHOLD, KEEP = 1000, 0.5, 0.5


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


class Summariser:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, previous: str | None, records: list[BaseMessage]) -> str:
        self.calls += 1
        return f"SUMMARY#{self.calls}"


def history() -> list[BaseMessage]:
    """Eight turns of about 110 tokens each; the provider said the last prompt was big."""
    records: list[BaseMessage] = []
    for i in range(8):
        records += [
            HumanMessage(content=f"q{i} " + "x" * 200),
            AIMessage(content=f"a{i} " + "y" * 200),
        ]
    last = records[-1]
    assert isinstance(last, AIMessage)
    last.usage_metadata = {"input_tokens": 880, "output_tokens": 60, "total_tokens": 940}
    return records


def budget_cut(records: list[BaseMessage]) -> int:
    budget = KEEP * THRESHOLD * WINDOW
    return next(
        i for i, m in enumerate(records)
        if isinstance(m, HumanMessage) and estimate_tokens(records[i:]) <= budget
    )  # fmt: skip


async def run_turn(agent: StelloAgent, mode: str, session_id: str, text: str) -> None:
    if mode == "sync":
        agent.turn(session_id, text)
    else:
        await agent.aturn(session_id, text)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_tool_rounds_of_a_turn_keep_its_one_cut(make_agent: AgentFactory, mode: str) -> None:
    fn = Summariser()
    call = ScriptedChatModel.tool_call("lookup", {"q": "x"})
    model = ScriptedChatModel([call, call, "done", "next"])
    policy = CompressionPolicy(
        context_window=WINDOW, threshold=THRESHOLD, keep_recent=KEEP, compress_fn=fn
    )
    agent = make_agent(model=model, tools=[lookup], compression=policy)
    child = agent.fork(agent.main_session_id, "C").id
    agent.storage.append_records(child, history())

    await run_turn(agent, mode, child, "look it up twice")
    assert model.call_count == 3
    assert fn.calls == 1
    stored = agent.storage.get_compression(child)
    assert stored is not None and stored.through == budget_cut(history())
    shown = [p[1].text for p in model.prompts]  # the first history record of each call
    assert shown == [shown[0]] * 3

    await run_turn(agent, mode, child, "and now?")  # judged by the cut turn's own figures
    assert fn.calls == 1
