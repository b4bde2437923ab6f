"""`StelloAgent.as_tool`: one stello session as a LangChain tool of another agent.

Called by another graph (a `create_agent` agent's tool node, say), the tool runs the turn as
a subgraph of the caller's run, the way LangGraph runs a graph called from a node: the turn
is checkpointed in the caller's thread, an `interrupt()` inside it (a tool of the session
waiting for a human) interrupts the caller's run, and the caller's
`Command(resume=...)` resumes the turn where it waited. The inner model's tokens and
stello's events stream through the caller's run (`stream_mode=["messages", "custom"]`
with `subgraphs=True`). The turn is named by the caller's thread and the id of the tool call
it answers (`turn_id`): a caller that replays its history from before the call (time
travel) gets the answer L3 already holds for it, not a second copy of the turn.

Called on its own (`tool.invoke(...)` outside a graph), the tool runs an ordinary
`StelloAgent.turn`; a turn that then waits on an interrupt raises `InvalidInputError` naming
`StelloAgent.resume`, rather than answering an empty string.
"""

from __future__ import annotations

import re
import uuid
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool

from stello_graph._validate import check_id
from stello_graph.errors import InvalidInputError
from stello_graph.graph import build_graph

if TYPE_CHECKING:
    from stello_graph._agent_turns import TurnResult
    from stello_graph.agent import StelloAgent

__all__ = ["session_tool", "tool_name"]


def tool_name(label: str) -> str:
    """`ask_<label>` as a tool name providers accept (letters, digits, `_`, at most 64)."""
    slug = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")[:50]
    return f"ask_{slug}" if slug else "ask_session"


CALL_KEY = "stello_tool_call_id"
"""The key of the tool's run metadata holding the id of the tool call it answers."""


class _SessionTool(StructuredTool):
    """A `StructuredTool` that hands its function the id of the tool call it answers (in
    the run's metadata, `CALL_KEY`), when it is called with one (a tool node's call)."""

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return super().invoke(input, _with_call(input, config), **kwargs)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return await super().ainvoke(input, _with_call(input, config), **kwargs)


def _with_call(input: Any, config: RunnableConfig | None) -> RunnableConfig | None:
    if not (isinstance(input, dict) and input.get("type") == "tool_call" and input.get("id")):
        return config
    metadata = {**((config or {}).get("metadata") or {}), CALL_KEY: str(input["id"])}
    return {**(config or {}), "metadata": metadata}


def _question(sid: str, question: str, config: RunnableConfig) -> dict[str, Any]:
    """The turn's input, named (`turn_id`) by the caller's thread and the tool call's id:
    a replay of the call on that thread asks the same turn again."""
    call = (config.get("metadata") or {}).get(CALL_KEY)
    if not call:
        return {"session_id": sid, "input": question}
    thread = (config.get("configurable") or {}).get("thread_id")
    turn = uuid.uuid5(uuid.NAMESPACE_URL, f"stello-call/{thread}/{call}")
    return {"session_id": sid, "input": question, "turn_id": str(turn)}


def _in_graph(config: RunnableConfig | None) -> bool:
    """Whether the tool runs as a task of a graph run (a tool node's call): LangGraph names
    the task's node in the metadata of its config."""
    return bool(((config or {}).get("metadata") or {}).get("langgraph_node"))


def _answer(sid: str, result: TurnResult) -> str:
    if result.interrupted:
        raise InvalidInputError(
            f"The turn of session {sid!r} waits on an interrupt; outside a graph run the "
            "tool cannot wait for it: answer with `agent.resume(session_id, value)`, or call "
            "the tool from a graph with a checkpointer, whose run the interrupt then pauses."
        )
    return result.content


def session_tool(
    agent: StelloAgent, session_id: str, *, name: str | None = None, description: str | None = None
) -> BaseTool:
    """A tool that asks one session of `agent` a question (one turn); see the module doc."""
    sid = check_id(session_id)
    label = agent.session(sid).meta.label
    graph = agent._tool_graph  # the agent's graph without a checkpointer: it takes the caller's
    if graph is None:
        graph = build_graph(agent._runtime).compile(name="stello", store=agent.settings.store)
        agent._tool_graph = graph

    def ask(question: str, config: RunnableConfig) -> str:
        if _in_graph(config):
            return str(graph.invoke(_question(sid, question, config), config)["content"])
        return _answer(sid, agent.turn(sid, question))

    async def aask(question: str, config: RunnableConfig) -> str:
        if _in_graph(config):
            out = await graph.ainvoke(_question(sid, question, config), config)
            return str(out["content"])
        return _answer(sid, await agent.aturn(sid, question))

    return _SessionTool.from_function(
        func=ask,
        coroutine=aask,
        name=name or tool_name(label),
        description=description
        or f"Ask the stello session {label!r} a question and get its answer.",
    )
