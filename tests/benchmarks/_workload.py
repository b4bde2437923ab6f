"""The scripted conversation both sides run, and the two agents under test.

Everything is deterministic: user messages and replies are ~400 characters of text made from
the turn number, the model is a zero-latency `ScriptedChatModel`, and a tool round is the
model calling the trivial `lookup` tool once before it answers.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from stello_graph import StelloAgent
from stello_graph.testing import ScriptedChatModel

__all__ = [
    "MESSAGE_CHARS",
    "Baseline",
    "Conversation",
    "lookup",
    "prompt_chars",
    "text",
]

MESSAGE_CHARS = 400
# fmt: off
_WORDS = (
    "pricing", "tier", "customer", "churn", "onboarding", "metric", "launch", "budget",
    "roadmap", "latency", "storage", "session", "branch", "summary", "insight", "model",
    "prompt", "market", "segment", "revenue", "feature", "quality", "review", "design",
    "decision", "risk", "option", "cost", "plan", "team", "timeline", "evidence", "experiment",
)
# fmt: on


def text(seed: str, chars: int = MESSAGE_CHARS) -> str:
    """`chars` characters of word salad, always the same for the same `seed`."""
    rng = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:chars]


@tool
def lookup(query: str) -> str:
    """Look a fact up."""
    return f"Fact about {query}: " + text(query, 80)


def prompt_chars(messages: list[BaseMessage]) -> int:
    """Characters of a prompt: message texts plus tool-call names and arguments."""
    total = 0
    for message in messages:
        total += len(message.text)
        if isinstance(message, AIMessage):
            total += sum(len(c["name"]) + len(str(c["args"])) for c in message.tool_calls)
    return total


@dataclass
class Conversation:
    """The scripted chat: user message `n`, and a model that answers it (after one call of
    `lookup` when `tool_round`)."""

    tool_round: bool = False
    replies: int = field(default=0, init=False)

    def user(self, turn: int) -> str:
        return text(f"user-{turn}")

    def respond(self, messages: list[BaseMessage]) -> AIMessage | str:
        last = messages[-1]
        if self.tool_round and isinstance(last, HumanMessage):
            return ScriptedChatModel.tool_call("lookup", {"query": f"q{self.replies}"})
        self.replies += 1
        return text(f"reply-{self.replies}")

    def model(self) -> ScriptedChatModel:
        return ScriptedChatModel(respond=self.respond)

    def raw_chars(self, turns: int) -> int:
        """Characters of the conversation's text after `turns` turns (user + final replies)."""
        return sum(len(self.user(n)) + len(text(f"reply-{n}")) for n in range(1, turns + 1))


class Baseline:
    """A plain LangGraph chat agent, built the usual way: `StateGraph(MessagesState)`, a model
    node, `ToolNode`, `tools_condition`, compiled with `SqliteSaver` on a file.

    The connection gets `synchronous=NORMAL`, as stello's own connections do, so both sides
    pay the same for durability (LangGraph's default, `FULL` in WAL mode, adds an fsync per
    checkpoint and makes the baseline slower, not faster).
    """

    def __init__(self, model: ScriptedChatModel, path: Path, tools: list[Any]) -> None:
        bound = model.bind_tools(tools)

        def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
            return {"messages": [bound.invoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", ToolNode(tools))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        self.conn = sqlite3.connect(path, check_same_thread=False)
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.app: CompiledStateGraph[Any, Any, Any, Any] = graph.compile(
            checkpointer=SqliteSaver(self.conn)
        )
        self.config: Any = {"configurable": {"thread_id": "bench"}}

    def turn(self, user: str) -> str:
        out = self.app.invoke({"messages": [HumanMessage(user)]}, self.config)
        return str(out["messages"][-1].content)

    def close(self) -> None:
        self.conn.close()


def stello_agent(model: ScriptedChatModel, path: Path, **options: Any) -> StelloAgent:
    """A `StelloAgent` on its defaults: SQLite storage and checkpointer on the same file."""
    return StelloAgent(model=model, storage=path, **options)


Turn = Callable[[str], object]
